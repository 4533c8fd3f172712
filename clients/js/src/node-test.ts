import { type PgforkDatabase, runWithDatabase } from "./database.js";
import { buildShared } from "./setup.js";
import { type SharedTemplate, sharedClient } from "./shared.js";
import type { TemplateOptions } from "./template.js";

/** A template for node:test: `const tpl = pgforkTemplate({ … }); before(tpl.build);` then `test("x", tpl.withDatabase(async (db) => …))`. */
export interface NodeTestTemplate {
  /**
   * Builds the template (once across processes); for `before`. With no server
   * configured and none answering, first starts `pgfork serve`, once for all
   * files of the `node --test` run (see ensureServe). Never throws: tests fail with the error.
   */
  build(): Promise<void>;
  /** Wraps a test body with its own database: recreated after a pass, kept (URL printed, password masked) after a failure. */
  withDatabase<C = unknown>(fn: (db: PgforkDatabase, t: C) => Promise<void> | void, opts?: { readonly?: boolean }): (t: C) => Promise<void>;
}

/** See NodeTestTemplate. */
export function pgforkTemplate(opts: TemplateOptions): NodeTestTemplate {
  let shared: Promise<SharedTemplate> | undefined;
  // Under `node --test` each file runs in a process of its own: the run's
  // main process is the parent, and a server started for the run stops with it.
  const runner = process.env.NODE_TEST_CONTEXT ? process.ppid : process.pid;
  const build = (): Promise<SharedTemplate> => (shared ??= buildShared(opts, runner));
  return {
    build: async () => {
      await build();
    },
    withDatabase: (fn, o = {}) => async (t) => {
      const { client, hash } = sharedClient(await build(), "");
      await runWithDatabase(client, hash, (db) => fn(db, t), o);
    },
  };
}
