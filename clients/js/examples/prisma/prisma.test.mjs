import { before, test } from "node:test";
import assert from "node:assert/strict";
import { fileURLToPath } from "node:url";
import { prismaMigrator } from "pgfork";
import { pgforkTemplate } from "pgfork/node-test";

const project = fileURLToPath(new URL(".", import.meta.url));
const tpl = pgforkTemplate({
  migrations: fileURLToPath(new URL("./prisma", import.meta.url)), // schema + migrations, hashed
  migrate: prismaMigrator({ cwd: project, config: "prisma.config.mjs" }), // prisma migrate deploy
});
before(tpl.build);

test("prisma migrate deploy migrated the template", tpl.withDatabase(async (db) => {
  await db.client.query(`INSERT INTO "User" (name) VALUES ('prisma')`);
  const { rows } = await db.client.query("SELECT count(*)::int AS n FROM _prisma_migrations");
  assert.equal(rows[0].n, 1);
}));
