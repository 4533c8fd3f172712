module.exports = {
  testEnvironment: "node",
  globalSetup: "<rootDir>/global-setup.cjs", // builds the template once for all workers
  globalTeardown: "<rootDir>/global-teardown.cjs",
  testMatch: ["<rootDir>/*.test.cjs"],
};
