import { type PgforkDatabase, runWithDatabase } from "./database.js";
import { stopServe } from "./serve.js";
import { buildShared } from "./setup.js";
import { ENV_SHARED, type SharedTemplate, sharedClient } from "./shared.js";
import type { TemplateOptions } from "./template.js";

/**
 * A jest globalSetup that builds the template once for all workers:
 * `module.exports = globalSetup({ migrations: … })`. With no server
 * configured and none answering it first starts `pgfork serve` for the run
 * (see ensureServe). The workers find both in the environment; a failed
 * build makes every test using a database fail with its message.
 */
export function globalSetup(opts: TemplateOptions): () => Promise<void> {
  return async () => {
    process.env[ENV_SHARED] = JSON.stringify(await buildShared(opts));
  };
}

/** The jest globalTeardown: stops the server globalSetup started (if it did) and forgets the template. */
export function globalTeardown(): () => Promise<void> {
  return async () => {
    Reflect.deleteProperty(process.env, ENV_SHARED);
    await stopServe();
  };
}

/**
 * Wraps a test body: `test("x", withDatabase(async (db) => …))`. The
 * database is recreated after a passing test and kept, its URL printed with
 * the password masked, after a failing one.
 */
export function withDatabase(fn: (db: PgforkDatabase) => Promise<void> | void, opts: { readonly?: boolean } = {}): () => Promise<void> {
  return async () => {
    const raw = process.env[ENV_SHARED];
    const shared = raw ? (JSON.parse(raw) as SharedTemplate) : undefined;
    const { client, hash } = sharedClient(shared, "set globalSetup to a module exporting pgfork/jest's globalSetup(…)");
    await runWithDatabase(client, hash, fn, opts);
  };
}
