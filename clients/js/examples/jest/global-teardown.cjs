const { globalTeardown } = require("pgfork/jest");

module.exports = globalTeardown();
