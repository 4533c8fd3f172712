import { before, test } from "node:test";
import assert from "node:assert/strict";
import { fileURLToPath } from "node:url";
import { nodePgMigrateMigrator } from "pgfork";
import { pgforkTemplate } from "pgfork/node-test";

const dir = fileURLToPath(new URL("./migrations", import.meta.url));
const tpl = pgforkTemplate({ migrations: dir, migrate: nodePgMigrateMigrator({ dir }) });
before(tpl.build);

test("node-pg-migrate migrated the template", tpl.withDatabase(async (db) => {
  await db.client.query("INSERT INTO users (name) VALUES ('pgm')");
  const { rows } = await db.client.query("SELECT name FROM pgmigrations");
  assert.deepEqual(rows.map((r) => r.name), ["1704067200000_users"]);
}));
