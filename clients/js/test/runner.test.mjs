// Template building and the runners' glue against a live server: a failing
// migration (its output, the template discarded, waiters failing at once), the
// seed run once, a failing test's database kept with its URL masked.
import { test } from "node:test";
import assert from "node:assert/strict";
import { execFile } from "node:child_process";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";
import pg from "pg";
import { MigrationFailed, TemplateDiscarded, ensureTemplate, getDatabase, runWithDatabase, templateHash, withPg } from "pgfork";
import { liveClient, uniqueKey } from "./helpers.mjs";

const here = dirname(fileURLToPath(import.meta.url));
const root = join(here, "..");
const good = join(root, "examples", "migrations");
const bad = join(here, "fixtures", "bad-migrations");

function run(cmd, args, opts) {
  return new Promise((resolve) => {
    execFile(cmd, args, { ...opts, maxBuffer: 16 << 20 }, (err, stdout, stderr) => resolve({ code: err ? (err.code ?? 1) : 0, out: stdout + stderr }));
  });
}

/** The template's databases in use and kept (POST …/keep: outside the pool's count). */
async function counts(client, hash) {
  const t = (await client.listTemplates()).templates.find((x) => x.templateHash === hash);
  return { inUse: t?.databases?.in_use ?? 0, kept: t?.kept ?? 0 };
}

test("a failing migration: its output, the template discarded, waiters fail at once", async () => {
  const client = liveClient();
  const extraKey = uniqueKey("bad");
  const hash = templateHash(bad, extraKey);
  let waiter;
  // A waiter the server held until its finalize timeout would get a 503
  // and retry: no retry is the proof it was woken by the discard (a clock
  // would judge the machine's load).
  const retries = [];
  await assert.rejects(
    ensureTemplate({
      client,
      migrations: bad,
      extraKey,
      migrate: async (url) => {
        // Another process waits for this template while it is being built.
        waiter = getDatabase(liveClient({ onRetry: (r) => retries.push(r) }), hash).then(
          () => assert.fail("got a database of a broken template"),
          (e) => e,
        );
        await withPg(url, (c) => c.query("SELECT 1"));
        const { sqlFiles } = await import("pgfork");
        await sqlFiles(bad)(url);
      },
    }),
    (e) => {
      assert.ok(e instanceof MigrationFailed, String(e));
      assert.match(e.message, /002_broken\.sql: relation "nowhere" does not exist/);
      assert.match(e.message, /template discarded/);
      assert.match(e.message, /:\*\*\*@/);
      return true;
    },
  );
  const w = await waiter;
  assert.ok(w instanceof MigrationFailed, String(w));
  assert.match(w.message, /was discarded: its migrations failed/);
  assert.ok(w.cause instanceof TemplateDiscarded);
  assert.deepEqual(retries, [], "the waiter must not wait for the finalize timeout");
});

test("the seed runs once, into the template", async () => {
  const client = liveClient();
  const extraKey = uniqueKey("seed");
  let seeded = 0;
  const opts = {
    client,
    migrations: good,
    extraKey,
    seed: async (url) => {
      seeded++;
      await withPg(url, (c) => c.query("INSERT INTO users (name) VALUES ('seed')"));
    },
  };
  const [a, b] = [await ensureTemplate(opts), await ensureTemplate(opts)];
  assert.equal(a.built, true);
  assert.equal(b.built, false);
  assert.equal(seeded, 1);
  for (let i = 0; i < 2; i++) {
    await runWithDatabase(client, a.hash, async (db) => {
      const { rows } = await db.client.query("SELECT name FROM users");
      assert.deepEqual(rows, [{ name: "seed" }]);
      await db.client.query("INSERT INTO users (name) VALUES ('mine')");
    });
  }
  await client.discardTemplate(a.hash);
});

test("runWithDatabase keeps a failing test's database and masks its password", async () => {
  const client = liveClient();
  const { hash } = await ensureTemplate({ client, migrations: good, extraKey: uniqueKey("keep") });
  const lines = [];
  let url;
  await assert.rejects(
    runWithDatabase(
      client,
      hash,
      async (db) => {
        url = db.url;
        throw new Error("boom");
      },
      { log: (l) => lines.push(l) },
    ),
    /boom/,
  );
  const password = new URL(url).password;
  assert.ok(password.length > 0);
  assert.equal(lines.length, 1);
  assert.match(lines[0], /keeping test database pgfork_test_/);
  assert.ok(lines[0].includes(":***@") && !lines[0].includes(password), lines[0]);
  assert.deepEqual(await counts(client, hash), { inUse: 0, kept: 1 }, "the kept database is kept, out of the pool's count");
  const c = new pg.Client({ connectionString: url });
  await c.connect(); // still there to inspect
  await c.end();
  await client.discardTemplate(hash);
});

const vitestBin = join(root, "node_modules", ".bin", "vitest");
const vitestFixture = join(here, "fixtures", "vitest-fail");

test("vitest: a failing test keeps its database (URL printed, password masked), a passing one gives it back", async () => {
  const client = liveClient();
  const key = uniqueKey("vitest-keep");
  const r = await run(vitestBin, ["run", "--root", vitestFixture], { env: { ...process.env, NO_COLOR: "1", PGFORK_JS_MIGRATIONS: good, PGFORK_JS_KEY: key } });
  assert.notEqual(r.code, 0, r.out);
  const failedDb = /FAILED-DB (\S+)/.exec(r.out)?.[1];
  assert.ok(failedDb, r.out);
  const line = r.out.split("\n").find((l) => l.includes(`keeping test database ${failedDb}`));
  assert.ok(line, r.out);
  assert.match(line, /postgres:\/\/pgfork:\*\*\*@/);
  assert.match(r.out, /1 failed \| 1 passed/);
  const hash = templateHash(good, key);
  assert.deepEqual(await counts(client, hash), { inUse: 0, kept: 1 }, "only the failed test's database is kept");
  await client.discardTemplate(hash);
});

test("vitest: a broken migration fails every test with its message, without waiting", async () => {
  const r = await run(vitestBin, ["run", "--root", vitestFixture], {
    env: { ...process.env, NO_COLOR: "1", PGFORK_JS_MIGRATIONS: bad, PGFORK_JS_KEY: uniqueKey("vitest-bad") },
  });
  assert.notEqual(r.code, 0);
  assert.match(r.out, /2 failed/, r.out);
  // vitest prints an error shared by several tests once, under all their names.
  assert.match(r.out, /FAIL .*> passes\n FAIL .*> fails\nMigrationFailed: pgfork: migrating template \w+ .*failed; template discarded/, r.out);
  assert.match(r.out, /relation "nowhere" does not exist/);
  // The tests' own time as vitest sums it (without its start, the
  // transform and the global setup's build): a waiting test would take the
  // server's finalize timeout (15 s in clients/test.sh), one failing at once
  // milliseconds. A clock around the whole run judged the machine's load.
  const tests = /Duration .*\btests (\d+(?:\.\d+)?)(ms|s)\b/.exec(r.out);
  assert.ok(tests, `vitest printed no duration of the tests:\n${r.out}`);
  const ms = Number(tests[1]) * (tests[2] === "s" ? 1000 : 1);
  assert.ok(ms < 10_000, `the tests took ${ms} ms: they waited (the finalize timeout?)`);
});

const vitestEnvFixture = join(here, "fixtures", "vitest-env");

test("vitest useDatabaseEnv: each test's database in the environment before the file's beforeEach; a failing test's kept, the others given back", async () => {
  const client = liveClient();
  const key = uniqueKey("vitest-env");
  const r = await run(vitestBin, ["run", "--root", vitestEnvFixture], {
    env: { ...process.env, NO_COLOR: "1", PGFORK_JS_MIGRATIONS: good, PGFORK_JS_KEY: key, PGFORK_JS_FAIL: "1" },
  });
  assert.notEqual(r.code, 0, r.out);
  assert.match(r.out, /1 failed \| 2 passed/, r.out);
  const failedDb = /FAILED-DB (\S+)/.exec(r.out)?.[1];
  assert.ok(failedDb, r.out);
  assert.ok(r.out.split("\n").some((l) => l.includes(`keeping test database ${failedDb}`) && l.includes(":***@")), r.out);
  // Only the failing test's database is kept. (The passing test's may have
  // been recreated and handed to the failing one under the same name.)
  assert.ok(/PASSED-DB (\S+)/.test(r.out), r.out);
  assert.equal(r.out.split("\n").filter((l) => l.includes("keeping test database")).length, 1, r.out);
  const hash = templateHash(good, key);
  assert.deepEqual(await counts(client, hash), { inUse: 0, kept: 1 }, "only the failed test's database is kept");
  await client.discardTemplate(hash);
});
