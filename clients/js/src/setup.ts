import { clientFromEnv } from "./env.js";
import { ensureServe } from "./serve.js";
import type { SharedTemplate } from "./shared.js";
import { type TemplateOptions, ensureTemplate } from "./template.js";

/**
 * Builds the template once (see ensureTemplate), first starting `pgfork
 * serve` when no server is configured and none answers (ensureServe; runner
 * is the test run's main process). A failure is returned as error, not
 * thrown, so each test fails with it.
 */
export async function buildShared(opts: TemplateOptions, runner: number = process.pid): Promise<SharedTemplate> {
  try {
    if (!opts.client) await ensureServe({ runner, pg: opts.pg });
  } catch (e) {
    const client = clientFromEnv();
    return { baseUrl: client.baseUrl, token: client.token, apiVersion: client.apiVersion, error: (e as Error).message, errorName: (e as Error).name };
  }
  const client = opts.client ?? clientFromEnv();
  try {
    const t = await ensureTemplate({ ...opts, client });
    return { baseUrl: client.baseUrl, token: client.token, apiVersion: client.apiVersion, hash: t.hash };
  } catch (e) {
    return { baseUrl: client.baseUrl, token: client.token, apiVersion: client.apiVersion, error: (e as Error).message, errorName: (e as Error).name };
  }
}
