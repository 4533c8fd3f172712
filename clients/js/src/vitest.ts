import { inject, test as baseTest } from "vitest";
import { type PgforkDatabase, runWithDatabase } from "./database.js";
import { type SharedTemplate, sharedClient } from "./shared.js";

declare module "vitest" {
  export interface ProvidedContext {
    pgfork: SharedTemplate;
  }
}

/** vitest's `test` with a `db` fixture: each test gets its own database of the globalSetup's template. */
export const test = baseTest.extend<{ db: PgforkDatabase }>({
  db: async ({ task }, use) => {
    const { client, hash } = sharedClient(inject("pgfork"), "add a file exporting pgfork/vitest-setup's pgforkSetup(…) to test.globalSetup in vitest.config");
    let failed = false;
    await runWithDatabase(client, hash, async (db) => {
      await use(db);
      failed = task.result?.state === "fail";
      if (failed) throw new Error("test failed");
    }).catch((e: unknown) => {
      if (!failed) throw e;
    });
  },
});

export { expect, describe } from "vitest";
