const { openStore } = require("./store");

let store;
beforeEach(() => {
  store = openStore();
});
afterEach(async () => {
  await store.close();
});

test("a failing test keeps its database", async () => {
  await store.addUser("bob");
  console.log(`FAILED-DB ${await store.database()}`);
  expect(await store.names()).toEqual(["not", "these"]);
});
