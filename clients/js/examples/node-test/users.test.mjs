import { before, test } from "node:test";
import assert from "node:assert/strict";
import { fileURLToPath } from "node:url";
import { withPg } from "pgfork";
import { pgforkTemplate } from "pgfork/node-test";

// Built once (by whichever test file gets there first); the seed runs once, into the template.
const tpl = pgforkTemplate({
  migrations: fileURLToPath(new URL("../migrations", import.meta.url)),
  seed: (url) => withPg(url, (c) => c.query("INSERT INTO users (name) VALUES ('seeded')")),
  extraKey: "seed v1", // change it when the seed changes: its code is not hashed
});
before(tpl.build);

test("a test writes to its own database", tpl.withDatabase(async (db) => {
  await db.client.query("INSERT INTO users (name) VALUES ('alice')");
  const { rows } = await db.client.query("SELECT name FROM users ORDER BY id");
  assert.deepEqual(rows.map((r) => r.name), ["seeded", "alice"]);
}));

test("another test sees only the seed", tpl.withDatabase(async (db) => {
  const { rows } = await db.client.query("SELECT name FROM users ORDER BY id");
  assert.deepEqual(rows.map((r) => r.name), ["seeded"]);
}));
