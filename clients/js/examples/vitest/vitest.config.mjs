import { defineConfig } from "vitest/config";

export default defineConfig({
  test: {
    globalSetup: ["./global-setup.mjs"], // builds the template once for all workers
    include: ["*.test.ts"],
  },
});
