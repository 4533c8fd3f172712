import { Client, DEFAULT_URL, type ClientOptions } from "./client.js";

/** Settings read from the environment, as the Go and Python clients read them. */
export interface EnvSettings {
  /** $PGFORK_URL, else $INTEGRESQL_CLIENT_BASE_URL, else DEFAULT_URL. */
  url: string;
  /** Which of those gave url. */
  from: "PGFORK_URL" | "INTEGRESQL_CLIENT_BASE_URL" | "default";
  /** $PGFORK_TOKEN. */
  token: string | undefined;
  /** 1 when the URL came from $INTEGRESQL_CLIENT_BASE_URL (the server may be IntegreSQL) and does not end in /api/v2. */
  apiVersion: 1 | undefined;
}

/** The server settings from env (default process.env). */
export function envSettings(env: NodeJS.ProcessEnv = process.env): EnvSettings {
  const token = env.PGFORK_TOKEN || undefined;
  if (env.PGFORK_URL) return { url: env.PGFORK_URL, from: "PGFORK_URL", token, apiVersion: undefined };
  const legacy = env.INTEGRESQL_CLIENT_BASE_URL;
  if (legacy) {
    // IntegreSQL's clients' variable: the server may be IntegreSQL itself.
    const v1 = !legacy.replace(/\/+$/, "").endsWith("/api/v2");
    return { url: legacy, from: "INTEGRESQL_CLIENT_BASE_URL", token, apiVersion: v1 ? 1 : undefined };
  }
  return { url: DEFAULT_URL, from: "default", token, apiVersion: undefined };
}

/** A Client for the server the environment names ($PGFORK_URL, $INTEGRESQL_CLIENT_BASE_URL, $PGFORK_TOKEN); opts win. */
export function clientFromEnv(opts: ClientOptions & { url?: string } = {}, env: NodeJS.ProcessEnv = process.env): Client {
  const s = envSettings(env);
  const { url, ...rest } = opts;
  return new Client(url ?? s.url, {
    token: s.token,
    ...(url === undefined && s.apiVersion ? { apiVersion: s.apiVersion } : {}),
    ...rest,
  });
}
