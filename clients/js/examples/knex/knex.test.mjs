import { before, test } from "node:test";
import assert from "node:assert/strict";
import { fileURLToPath } from "node:url";
import { knexMigrator } from "pgfork";
import { pgforkTemplate } from "pgfork/node-test";

const migrations = fileURLToPath(new URL("./migrations", import.meta.url));
const tpl = pgforkTemplate({
  migrations, // hashed into the template key
  migrate: knexMigrator({ migrations: { directory: migrations, loadExtensions: [".cjs"] } }),
});
before(tpl.build);

test("knex migrated the template", tpl.withDatabase(async (db) => {
  await db.client.query("INSERT INTO users (name) VALUES ('knex')");
  const { rows } = await db.client.query("SELECT count(*)::int AS n FROM knex_migrations");
  assert.equal(rows[0].n, 1);
}));
