const path = require("node:path");
const { withPg } = require("pgfork");
const { globalSetup } = require("pgfork/jest");

module.exports = globalSetup({
  migrations: path.join(__dirname, "..", "migrations"),
  seed: (url) => withPg(url, (c) => c.query("INSERT INTO users (name) VALUES ('seeded')")),
  extraKey: "seed v1", // change it when the seed changes: its code is not hashed
});
