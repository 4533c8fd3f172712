import { Client } from "./client.js";
import { MigrationFailed, PgforkError, ServerUnreachable } from "./errors.js";

/** What a global setup hands to the test workers (environment or vitest's provide). */
export interface SharedTemplate {
  baseUrl: string;
  token?: string;
  apiVersion: 1 | 2;
  hash?: string;
  /** Set when building the template failed: every test fails with it. */
  error?: string;
  /** The class name of error (MigrationFailed, ServerUnreachable, …). */
  errorName?: string;
}

/** The variables a jest/node global setup sets for its workers. */
export const ENV_SHARED = "PGFORK_SHARED_TEMPLATE";

/** A client for shared, or the build error every test must fail with. */
export function sharedClient(s: SharedTemplate | undefined, where: string): { client: Client; hash: string } {
  if (!s) throw new MigrationFailed(`pgfork: no template: ${where}`);
  if (s.error !== undefined) {
    if (s.errorName === "MigrationFailed") throw new MigrationFailed(s.error);
    if (s.errorName === "ServerUnreachable") throw new ServerUnreachable(s.error);
    throw new PgforkError(s.error);
  }
  if (!s.hash) throw new MigrationFailed(`pgfork: no template hash: ${where}`);
  return { client: new Client(s.baseUrl, { token: s.token, apiVersion: s.apiVersion }), hash: s.hash };
}
