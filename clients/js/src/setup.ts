import { clientFromEnv } from "./env.js";
import type { SharedTemplate } from "./shared.js";
import { type TemplateOptions, ensureTemplate } from "./template.js";

/** Builds the template once (see ensureTemplate); a failure is returned as error, not thrown, so each test fails with it. */
export async function buildShared(opts: TemplateOptions): Promise<SharedTemplate> {
  const client = opts.client ?? clientFromEnv();
  try {
    const t = await ensureTemplate({ ...opts, client });
    return { baseUrl: client.baseUrl, token: client.token, apiVersion: client.apiVersion, hash: t.hash };
  } catch (e) {
    return { baseUrl: client.baseUrl, token: client.token, apiVersion: client.apiVersion, error: (e as Error).message, errorName: (e as Error).name };
  }
}
