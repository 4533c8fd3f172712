module.exports = require("pgfork/jest").globalTeardown();
