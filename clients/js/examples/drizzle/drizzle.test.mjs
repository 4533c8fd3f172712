import { before, test } from "node:test";
import assert from "node:assert/strict";
import { fileURLToPath } from "node:url";
import { drizzleMigrator } from "pgfork";
import { pgforkTemplate } from "pgfork/node-test";

// The folder drizzle-kit generate writes (SQL files and meta/_journal.json).
const migrationsFolder = fileURLToPath(new URL("./drizzle", import.meta.url));
const tpl = pgforkTemplate({ migrations: migrationsFolder, migrate: drizzleMigrator({ migrationsFolder }) });
before(tpl.build);

test("drizzle migrated the template", tpl.withDatabase(async (db) => {
  await db.client.query("INSERT INTO users (name) VALUES ('drizzle')");
  const { rows } = await db.client.query("SELECT count(*)::int AS n FROM drizzle.__drizzle_migrations");
  assert.equal(rows[0].n, 1);
}));
