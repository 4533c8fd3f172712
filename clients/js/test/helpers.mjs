// Shared by the tests: the live server clients/test.sh (or the developer) started.
import { randomBytes } from "node:crypto";
import { Client } from "pgfork";

/** The server's URL and token from the environment; the tests need a live `pgfork serve`. */
export function server() {
  const url = process.env.PGFORK_URL;
  if (!url) throw new Error("PGFORK_URL is not set: start `pgfork serve` and export PGFORK_URL (and PGFORK_TOKEN), or run clients/test.sh");
  return { url, token: process.env.PGFORK_TOKEN || undefined };
}

/** A client for the live server. */
export function liveClient(opts = {}) {
  const s = server();
  return new Client(s.url, { token: s.token, ...opts });
}

/** A template hash no other test or run uses. */
export function uniqueHash(what) {
  return `js-${what}-${randomBytes(6).toString("hex")}`;
}

/** A unique extra key for ensureTemplate. */
export function uniqueKey(what) {
  return uniqueHash(what);
}
