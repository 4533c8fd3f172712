module.exports = {
  rootDir: __dirname,
  globalSetup: "<rootDir>/global-setup.js",
  globalTeardown: "<rootDir>/global-teardown.js",
  // Each test gets its own database before its beforeEach hooks run:
  // PGHOST… and APP_DATABASE_URL name it.
  testEnvironment: "pgfork/jest-environment",
  testEnvironmentOptions: { pgforkUrlVar: "APP_DATABASE_URL" },
  // keep.test.js fails on purpose: run only when the test of the fixture asks.
  testMatch: process.env.FIXTURE_FAIL ? ["<rootDir>/*.test.js"] : ["<rootDir>/users.test.js"],
};
