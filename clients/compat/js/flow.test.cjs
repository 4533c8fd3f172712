// IntegreSQL's JavaScript client (@devoxa/integresql-client) against pgfork
// serve: the flow of the client's own integration test (several test files
// initialize one template at once, one migrates it, each test gets its own
// database) and the status codes the client sees. Run by
// clients/compat/run.sh with INTEGRESQL_URL (the server's base URL, as the
// client takes it) and NODE_PATH (the installed packages).
'use strict'
const { test } = require('node:test')
const assert = require('node:assert/strict')
const fs = require('node:fs')
const path = require('node:path')
const { IntegreSQLClient, IntegreSQLApiClientError } = require('@devoxa/integresql-client')
const { Client: PgClient } = require('pg')

const url = process.env.INTEGRESQL_URL
if (!url) throw new Error('INTEGRESQL_URL is not set: run clients/compat/run.sh')
const fixtures = path.join(__dirname, 'fixtures')

async function query(config, sql, params) {
  const c = new PgClient({ connectionString: new IntegreSQLClient({ url }).databaseConfigToConnectionUrl(config) })
  await c.connect()
  try {
    return (await c.query(sql, params)).rows
  } finally {
    await c.end()
  }
}

async function status(promise) {
  try {
    await promise
    return 200
  } catch (err) {
    if (err instanceof IntegreSQLApiClientError) return err.responseStatus
    throw err
  }
}

test('flow: one migration for many initializers, a database per test', async () => {
  process.chdir(fixtures)
  const client = new IntegreSQLClient({ url })
  const hash = await client.hashFiles(['./*.sql'])
  assert.match(hash, /^[0-9a-f]{40}$/)

  let migrations = 0
  const schema = fs.readFileSync(path.join(fixtures, '001_schema.sql'), 'utf8')
  // Ten "test files" at once, as the client's integration test runs them.
  await Promise.all(
    Array.from({ length: 10 }, () =>
      new IntegreSQLClient({ url }).initializeTemplate(hash, async (config) => {
        migrations++
        await query(config, schema)
      })
    )
  )
  assert.equal(migrations, 1, 'the template is migrated exactly once')

  const configs = await Promise.all(Array.from({ length: 4 }, () => client.getTestDatabase(hash)))
  assert.equal(new Set(configs.map((c) => c.database)).size, 4, 'four distinct databases')
  for (const [i, config] of configs.entries()) {
    assert.deepEqual(await query(config, 'SELECT count(*)::int AS n FROM users'), [{ n: 2 }])
    await query(config, 'INSERT INTO users (name) VALUES ($1)', [`test${i}`])
  }
  for (const config of configs) {
    assert.deepEqual(await query(config, 'SELECT count(*)::int AS n FROM users'), [{ n: 3 }], 'only its own write')
  }

  // Give one back unchanged (reuse) and have one recreated, by id.
  const first = await client.api.getTestDatabase(hash)
  assert.equal(first.database.templateHash, hash)
  await client.api.reuseTestDatabase(hash, first.id)
  const second = await client.api.getTestDatabase(hash)
  await client.api.recreateTestDatabase(hash, second.id)
  const fresh = await client.getTestDatabase(hash)
  assert.deepEqual(await query(fresh, 'SELECT count(*)::int AS n FROM users'), [{ n: 2 }])
})

test('status codes the client maps', async () => {
  const client = new IntegreSQLClient({ url })
  const hash = `jscompat${Date.now()}`
  assert.equal(await status(client.api.getTestDatabase(hash)), 404, 'unknown template: 404')
  assert.equal(await status(client.api.initializeTemplate(hash)), 200)
  assert.equal(await status(client.api.initializeTemplate(hash)), 423, 'initialized twice: 423')
  assert.equal(await status(client.api.discardTemplate(hash)), 200)
  // IntegreSQL v1.1.0 forgets a discarded template: 404 from then on.
  const afterDiscard = [await status(client.api.getTestDatabase(hash)), await status(client.api.finalizeTemplate(hash))]
  assert.deepEqual(afterDiscard, [404, 404], 'after discard: get and finalize 404')
})

test('a failing setup discards the template and rethrows', async () => {
  const client = new IntegreSQLClient({ url })
  const hash = `jsfail${Date.now()}`
  await assert.rejects(
    client.initializeTemplate(hash, async () => {
      throw new Error('migration failed')
    }),
    /migration failed/
  )
  // IntegreSQL v1.1.0 forgets a discarded template: 404 from then on.
  assert.equal(await status(client.api.getTestDatabase(hash)), 404, 'after a failed setup: 404')
  // It can be built again.
  await client.initializeTemplate(hash, async (config) => {
    await query(config, 'CREATE TABLE ok (n int)')
  })
  assert.deepEqual(await query(await client.getTestDatabase(hash), 'SELECT count(*)::int AS n FROM ok'), [{ n: 0 }])
})
