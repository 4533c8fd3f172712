const { openStore } = require("./store");

let store;
beforeEach(() => {
  store = openStore();
});
afterEach(async () => {
  await store.close();
});

test("a test writes to its own database", async () => {
  await store.addUser("alice");
  expect(await store.names()).toEqual(["seeded", "alice"]);
  console.log(`PASSED-DB ${await store.database()}`);
});

test("the next test sees only the migrations' rows", async () => {
  expect(await store.names()).toEqual(["seeded"]);
});

test("PG* variables name the same database", async () => {
  expect(process.env.PGDATABASE).toBe(await store.database());
  expect(new URL(process.env.APP_DATABASE_URL).pathname).toBe(`/${process.env.PGDATABASE}`);
});
