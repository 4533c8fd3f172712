import { expect, test } from "pgfork/vitest";

test("a test writes to its own database", async ({ db }) => {
  await db.client.query("INSERT INTO users (name) VALUES ('alice')");
  const { rows } = await db.client.query("SELECT name FROM users ORDER BY id");
  expect(rows.map((r) => r.name)).toEqual(["seeded", "alice"]);
});

test("another test sees only the seed", async ({ db }) => {
  const { rows } = await db.client.query("SELECT count(*)::int AS n FROM users");
  expect(rows[0]?.n).toBe(1);
});
