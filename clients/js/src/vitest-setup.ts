import { stopServe } from "./serve.js";
import { buildShared } from "./setup.js";
import type { SharedTemplate } from "./shared.js";
import type { TemplateOptions } from "./template.js";

/**
 * A vitest globalSetup that builds the template once for all workers:
 * `export default pgforkSetup({ migrations: "migrations" })` in the file named by
 * `test.globalSetup`. With no server configured and none answering it first
 * starts `pgfork serve` for the run (see ensureServe), stopped by the
 * teardown it returns. A failed build does not stop the run: every test using
 * `db` fails with its message.
 */
export function pgforkSetup(
  opts: TemplateOptions,
): (project: { provide(key: "pgfork", value: SharedTemplate): void }) => Promise<() => Promise<void>> {
  return async (project) => {
    project.provide("pgfork", await buildShared(opts));
    return () => stopServe();
  };
}

