const path = require("node:path");
const { nodePgMigrateMigrator } = require("pgfork");
const { globalSetup } = require("pgfork/jest");

const dir = path.join(__dirname, "migrations");
module.exports = globalSetup({ migrations: dir, migrate: nodePgMigrateMigrator({ dir }) });
