import { type PgforkDatabase, runWithDatabase } from "./database.js";
import { buildShared } from "./setup.js";
import { type SharedTemplate, sharedClient } from "./shared.js";
import type { TemplateOptions } from "./template.js";

/** A template for node:test: `const tpl = pgforkTemplate({ … }); before(tpl.build);` then `test("x", tpl.withDatabase(async (db) => …))`. */
export interface NodeTestTemplate {
  /** Builds the template (once across processes); for `before`. Never throws: tests fail with the error. */
  build(): Promise<void>;
  /** Wraps a test body with its own database: recreated after a pass, kept (URL printed, password masked) after a failure. */
  withDatabase<C = unknown>(fn: (db: PgforkDatabase, t: C) => Promise<void> | void, opts?: { readonly?: boolean }): (t: C) => Promise<void>;
}

/** See NodeTestTemplate. */
export function pgforkTemplate(opts: TemplateOptions): NodeTestTemplate {
  let shared: Promise<SharedTemplate> | undefined;
  const build = (): Promise<SharedTemplate> => (shared ??= buildShared(opts));
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
