import { afterEach, beforeEach, inject, test as baseTest } from "vitest";
import { type PgforkDatabase, acquireDatabase, databaseEnv, releaseDatabase, runWithDatabase, setEnv } from "./database.js";
import { type SharedTemplate, sharedClient } from "./shared.js";

declare module "vitest" {
  export interface ProvidedContext {
    pgfork: SharedTemplate;
  }
}

const SETUP_HINT = "add a file exporting pgfork/vitest-setup's pgforkSetup(…) to test.globalSetup in vitest.config";

/** vitest's `test` with a `db` fixture: each test gets its own database of the globalSetup's template. */
export const test = baseTest.extend<{ db: PgforkDatabase }>({
  db: async ({ task }, use) => {
    const { client, hash } = sharedClient(inject("pgfork"), SETUP_HINT);
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

/**
 * For projects that open their stores in beforeEach from the environment:
 * call it at the top of a test file (or in a setupFiles module), before the
 * file's own hooks. Each test then gets its own database before its other
 * beforeEach hooks run, with PGHOST, PGPORT, PGUSER, PGPASSWORD, PGDATABASE,
 * PGSSLMODE and urlVar (default DATABASE_URL) set to it; after its afterEach
 * hooks, a passing test's database is given back (recreated), a failing
 * test's kept and its URL printed with the password masked.
 */
export function useDatabaseEnv(opts: { urlVar?: string } = {}): void {
  let current: { db: PgforkDatabase; restore: () => void } | undefined;
  let shared: ReturnType<typeof sharedClient> | undefined;
  beforeEach(async () => {
    shared ??= sharedClient(inject("pgfork"), SETUP_HINT);
    const db = await acquireDatabase(shared.client, shared.hash);
    current = { db, restore: setEnv(process.env, databaseEnv(db, opts.urlVar ?? "DATABASE_URL")) };
  });
  // vitest runs afterEach hooks in reverse order: this one, registered first, runs last.
  afterEach(async ({ task }) => {
    const c = current;
    current = undefined;
    if (!c || !shared) return;
    c.restore();
    await releaseDatabase(shared.client, c.db, task.result?.state === "fail");
  });
}

export { expect, describe } from "vitest";
