import {
  ApiError,
  ApiVersionUnsupported,
  PgforkError,
  RequestAborted,
  ServerUnreachable,
  errorClass,
} from "./errors.js";

/** Where `pgfork serve` listens when started without --listen. */
export const DEFAULT_URL = "http://127.0.0.1:5000";

/** How to connect to one database, as the server sends it. */
export interface DatabaseConfig {
  host: string;
  port: number;
  username: string;
  password: string;
  database: string;
  additionalParams: Record<string, string>;
}

/** Answer to initializeTemplate: the empty template database to migrate. */
export interface TemplateDatabase {
  templateHash: string;
  config: DatabaseConfig;
  /** postgres:// URL of config. */
  url: string;
}

/**
 * A test database handed out by getTestDatabase: `id` is the small number in
 * its name; `token` the v2 hand-out id (undefined on v1).
 */
export interface TestDatabase {
  templateHash: string;
  id: number;
  token?: string;
  config: DatabaseConfig;
  /** postgres:// URL of config. */
  url: string;
}

/** Options of a Client. */
export interface ClientOptions {
  /** Bearer token (the one `pgfork serve` runs with: PGFORK_TOKEN or --token-file). */
  token?: string;
  /** 1 for IntegreSQL's API, 2 for pgfork's; default 2, or 1 for a URL ending in /api/v1. */
  apiVersion?: 1 | 2;
  /** Bound on each request in milliseconds (default 120000: getTestDatabase may wait server side). */
  timeoutMs?: number;
  /** Retries of a request the server answered 503 or 429 to ("wait"), with backoff (default 3). */
  retries?: number;
  /** First backoff in milliseconds (default 250), doubled per retry; a Retry-After header wins. */
  backoffMs?: number;
  /** Called before each retry (for logging). */
  onRetry?: (info: { op: string; attempt: number; delayMs: number; error: ApiError }) => void | Promise<void>;
  /** fetch to use (default: the global one). */
  fetch?: typeof fetch;
}

/** Per-call options. */
export interface CallOptions {
  /** Aborts the request (and its retries). */
  signal?: AbortSignal;
}

/** Status counts of one template, from GET /api/v2/templates. */
export interface TemplateInfo {
  templateHash: string;
  state: string;
  databases: Record<string, number>;
  waiters: number;
  total: number;
  max: number;
}

function quoteConninfo(v: string): string {
  if (v !== "" && !/[\s'\\]/.test(v)) return v;
  return "'" + v.replace(/\\/g, "\\\\").replace(/'/g, "\\'") + "'";
}

function params(c: DatabaseConfig): Record<string, string> {
  const p: Record<string, string> = { ...c.additionalParams };
  if (p.sslmode === undefined) p.sslmode = "disable";
  return p;
}

/** A postgres:// URL for c (sslmode=disable unless additionalParams says otherwise), as the Python client's. */
export function databaseUrl(c: DatabaseConfig): string {
  const q = params(c);
  let user = encodeURIComponent(c.username);
  if (c.password) user += ":" + encodeURIComponent(c.password);
  let hostport: string;
  if (c.host.startsWith("/")) {
    hostport = "";
    q.host = c.host;
    if (c.port) q.port = String(c.port);
  } else {
    const host = c.host.includes(":") ? `[${c.host}]` : c.host;
    hostport = c.port ? `${host}:${c.port}` : host;
  }
  const auth = user ? user + "@" : "";
  const query = new URLSearchParams(Object.entries(q).sort(([a], [b]) => (a < b ? -1 : a > b ? 1 : 0))).toString();
  return `postgres://${auth}${hostport}/${encodeURIComponent(c.database)}?${query}`;
}

/** A libpq keyword/value connection string for c, as the Go client's ConnectionString. */
export function conninfo(c: DatabaseConfig): string {
  const parts: [string, string][] = [
    ["host", c.host],
    ["port", String(c.port)],
    ["user", c.username],
  ];
  if (c.password) parts.push(["password", c.password]);
  parts.push(["dbname", c.database]);
  parts.push(...Object.entries(params(c)).sort(([a], [b]) => (a < b ? -1 : a > b ? 1 : 0)));
  return parts.map(([k, v]) => `${k}=${quoteConninfo(v)}`).join(" ");
}

/** url with the password of any postgres:// userinfo replaced by `***`. */
export function maskPassword(url: string): string {
  return url.replace(/^(postgres(?:ql)?:\/\/[^:@/]*):[^@/]*@/, "$1:***@");
}

/**
 * url as errors and inspection show a base URL: what can carry a secret
 * replaced by `***` (a userinfo; the path, as `pgfork serve` takes its token
 * as the first path segment, http://host:5000/TOKEN; a query, a fragment).
 * Scheme, host and port stay, to say where.
 */
export function maskBaseUrl(url: string): string {
  let u: URL;
  try {
    u = new URL(url);
  } catch {
    const i = url.indexOf("://");
    return i > 0 && /^[a-z][a-z0-9+.-]*$/i.test(url.slice(0, i)) ? `${url.slice(0, i)}://***` : "***";
  }
  const auth = u.username || u.password ? "***@" : "";
  const path = u.pathname.replace(/^\/+|\/+$/g, "") ? "/***" : "";
  return `${u.protocol}//${auth}${u.host}${path}${u.search ? "?***" : ""}${u.hash ? "#***" : ""}`;
}

function configFrom(raw: unknown): DatabaseConfig {
  const d = (raw ?? {}) as Record<string, unknown>;
  const extra = (d.additionalParams ?? {}) as Record<string, unknown>;
  return {
    host: String(d.host ?? ""),
    port: Number(d.port ?? 0),
    username: String(d.username ?? ""),
    password: String(d.password ?? ""),
    database: String(d.database ?? ""),
    additionalParams: Object.fromEntries(Object.entries(extra).map(([k, v]) => [k, String(v)])),
  };
}

function parseBody(body: unknown, hash: string): { templateHash: string; config: DatabaseConfig } {
  const b = (body ?? {}) as Record<string, unknown>;
  const db = (b.database ?? {}) as Record<string, unknown>;
  const h = (b.templateHash as string | undefined) || (db.templateHash as string | undefined) || hash;
  return { templateHash: String(h), config: configFrom(db.config) };
}

const sleep = (ms: number, signal?: AbortSignal): Promise<void> =>
  new Promise((resolve, reject) => {
    if (signal?.aborted) return reject(signal.reason as Error);
    const t = setTimeout(() => {
      signal?.removeEventListener("abort", onAbort);
      resolve();
    }, ms);
    const onAbort = (): void => {
      clearTimeout(t);
      reject(signal?.reason as Error);
    };
    signal?.addEventListener("abort", onAbort, { once: true });
  });

/** Retry-After (seconds or an HTTP date) in milliseconds, or undefined. */
function retryAfterMs(h: string | null): number | undefined {
  if (!h) return undefined;
  const s = Number(h);
  if (Number.isFinite(s)) return Math.max(0, s * 1000);
  const t = Date.parse(h);
  return Number.isNaN(t) ? undefined : Math.max(0, t - Date.now());
}

/**
 * Client for `pgfork serve`'s native /api/v2, or IntegreSQL's /api/v1 (with
 * apiVersion 1 or a base URL ending in /api/v1). The base URL may end in /api
 * (IntegreSQL style) or /api/v2; a token may also be its first path segment.
 */
export class Client {
  /** The server's base URL, without /api…. */
  readonly baseUrl: string;
  /** The API version in use (1 or 2); 2 falls back to 1 on a server without v2 unless it was asked for. */
  apiVersion: 1 | 2;
  readonly token: string | undefined;
  readonly timeoutMs: number;
  readonly retries: number;
  readonly backoffMs: number;
  private readonly versionFixed: boolean;
  private readonly onRetry: ClientOptions["onRetry"];
  private readonly fetchFn: typeof fetch;

  constructor(baseUrl: string = DEFAULT_URL, opts: ClientOptions = {}) {
    let u: URL;
    try {
      u = new URL(baseUrl || DEFAULT_URL);
    } catch {
      throw new PgforkError(`pgfork: base URL ${JSON.stringify(maskBaseUrl(baseUrl))} must be http(s)://host[:port]`);
    }
    if (u.protocol !== "http:" && u.protocol !== "https:") {
      throw new PgforkError(`pgfork: base URL ${JSON.stringify(maskBaseUrl(baseUrl))} must be http(s)://host[:port]`);
    }
    if (opts.apiVersion !== undefined && opts.apiVersion !== 1 && opts.apiVersion !== 2) {
      throw new PgforkError(`pgfork: apiVersion ${String(opts.apiVersion)}: want 1 (IntegreSQL's API) or 2 (pgfork's)`);
    }
    let path = u.pathname.replace(/\/+$/, "");
    this.versionFixed = opts.apiVersion !== undefined || path.endsWith("/api/v1") || path.endsWith("/api/v2");
    this.apiVersion = opts.apiVersion ?? (path.endsWith("/api/v1") ? 1 : 2);
    for (const suffix of ["/v1", "/v2", "/api"]) {
      if (path.endsWith(suffix)) path = path.slice(0, -suffix.length);
    }
    this.baseUrl = `${u.protocol}//${u.host}${path}`;
    this.token = opts.token || undefined;
    this.timeoutMs = opts.timeoutMs ?? 120_000;
    this.retries = opts.retries ?? 3;
    this.backoffMs = opts.backoffMs ?? 250;
    this.onRetry = opts.onRetry;
    this.fetchFn = opts.fetch ?? globalThis.fetch;
  }

  /** baseUrl as errors show it: a token or password in it replaced by `***` (maskBaseUrl). */
  get maskedBaseUrl(): string {
    return maskBaseUrl(this.baseUrl);
  }

  /** What console.log and util.inspect show: the base URL masked, never the token. */
  [Symbol.for("nodejs.util.inspect.custom")](): string {
    return `Client { baseUrl: ${JSON.stringify(this.maskedBaseUrl)}, apiVersion: ${this.apiVersion}, token: ${this.token ? '"***"' : "undefined"} }`;
  }

  private get api(): string {
    return `/api/v${this.apiVersion}`;
  }

  private async request(
    op: string,
    method: string,
    path: string,
    opts: CallOptions & { body?: unknown; want?: number; timeoutMs?: number; retries?: number } = {},
  ): Promise<unknown> {
    const want = opts.want ?? 200;
    const retries = opts.retries ?? this.retries;
    for (let attempt = 0; ; attempt++) {
      const headers: Record<string, string> = { Accept: "application/json" };
      if (opts.body !== undefined) headers["Content-Type"] = "application/json";
      if (this.token) headers.Authorization = `Bearer ${this.token}`;
      const timeout = AbortSignal.timeout(opts.timeoutMs ?? this.timeoutMs);
      const signal = opts.signal ? AbortSignal.any([opts.signal, timeout]) : timeout;
      let res: Response;
      let text: string;
      try {
        res = await this.fetchFn(this.baseUrl + path, {
          method,
          headers,
          body: opts.body === undefined ? undefined : JSON.stringify(opts.body),
          signal,
        });
        text = await res.text();
      } catch (e) {
        if (opts.signal?.aborted) {
          throw new RequestAborted(`${op}: aborted (${String((opts.signal.reason as Error | undefined)?.message ?? opts.signal.reason)})`, { cause: e });
        }
        if (timeout.aborted) {
          throw new RequestAborted(`${op}: no answer from ${this.maskedBaseUrl} within ${opts.timeoutMs ?? this.timeoutMs} ms`, { cause: e });
        }
        const why = (e instanceof Error ? ((e.cause as Error | undefined)?.message ?? e.message) : String(e))
          .split(this.baseUrl)
          .join(this.maskedBaseUrl);
        throw new ServerUnreachable(
          `${op}: no answer from ${this.maskedBaseUrl + path} (is \`pgfork serve\` running? start it with \`pgfork serve\` or set PGFORK_URL): ${why}`,
          { cause: e },
        );
      }
      if (res.status === want) {
        return text.trim() ? (JSON.parse(text) as unknown) : undefined;
      }
      let message = text.trim();
      try {
        const parsed = JSON.parse(message) as unknown;
        if (parsed && typeof parsed === "object") {
          const p = parsed as Record<string, unknown>;
          message = String(p.message ?? p.error ?? message);
        }
      } catch {
        // not JSON: keep the text
      }
      const Cls = errorClass(op, res.status, message);
      const err = new Cls(op, res.status, message.slice(0, 300));
      const wait = res.status === 503 || res.status === 429;
      if (!wait || attempt >= retries) throw err;
      const delayMs = retryAfterMs(res.headers.get("Retry-After")) ?? this.backoffMs * 2 ** attempt;
      await this.onRetry?.({ op, attempt: attempt + 1, delayMs, error: err });
      await sleep(delayMs, opts.signal);
    }
  }

  private static h(hash: string): string {
    return encodeURIComponent(hash);
  }

  /** True if GET /healthz answers 200. */
  async healthy(timeoutMs = 2000): Promise<boolean> {
    try {
      await this.request("healthy", "GET", "/healthz", { timeoutMs, retries: 0 });
      return true;
    } catch {
      return false;
    }
  }

  /** True if anything answers HTTP at the base URL (IntegreSQL has no /healthz). */
  async reachable(timeoutMs = 2000): Promise<boolean> {
    try {
      await this.request("reachable", "GET", "/healthz", { timeoutMs, retries: 0 });
    } catch (e) {
      if (e instanceof ServerUnreachable || e instanceof RequestAborted) return false;
    }
    return true;
  }

  /**
   * Registers a template and returns the empty database to migrate; throws
   * TemplateAlreadyInitialized if another caller did. On a server without
   * /api/v2 (IntegreSQL) switches to v1, unless apiVersion was set.
   */
  async initializeTemplate(hash: string, opts: CallOptions = {}): Promise<TemplateDatabase> {
    let body: unknown;
    try {
      body = await this.request("initializeTemplate", "POST", `${this.api}/templates`, { ...opts, body: { hash } });
    } catch (e) {
      if (!(e instanceof ApiError) || e.status !== 404 || this.apiVersion !== 2) throw e;
      // pgfork serve never answers 404 here: this server has no /api/v2.
      if (this.versionFixed) {
        throw new ApiVersionUnsupported(
          `initializeTemplate: ${this.maskedBaseUrl} has no /api/v2 (404: ${e.serverMessage}); it is not pgfork serve ` +
            `(IntegreSQL?): use apiVersion 1 or a base URL ending in /api/v1`,
          { cause: e },
        );
      }
      this.apiVersion = 1;
      try {
        body = await this.request("initializeTemplate", "POST", `/api/v1/templates`, { ...opts, body: { hash } });
      } catch (e1) {
        if (e1 instanceof ApiError && e1.status === 404) {
          this.apiVersion = 2;
          throw new ApiVersionUnsupported(
            `initializeTemplate: ${this.maskedBaseUrl} has neither /api/v2 nor /api/v1 (404 on both): is it pgfork serve or IntegreSQL? ` +
              `A base URL with the token as its first path segment needs it: http://host:port/TOKEN/api`,
            { cause: e1 },
          );
        }
        throw e1;
      }
    }
    const { templateHash, config } = parseBody(body, hash);
    return { templateHash, config, url: databaseUrl(config) };
  }

  /** Marks the template ready: test databases are cloned from it. */
  async finalizeTemplate(hash: string, opts: CallOptions = {}): Promise<void> {
    await this.request("finalizeTemplate", "PUT", `${this.api}/templates/${Client.h(hash)}`, { ...opts, want: 204 });
  }

  /** Drops the template; waiters get TemplateDiscarded (TemplateNotFound on v1). */
  async discardTemplate(hash: string, opts: CallOptions = {}): Promise<void> {
    await this.request("discardTemplate", "DELETE", `${this.api}/templates/${Client.h(hash)}`, { ...opts, want: 204 });
  }

  /**
   * A fresh test database; waits (server side) for finalize and a ready
   * database. On v2: TemplateDiscarded if the template was discarded,
   * ServiceUnavailable (with the reason) if none was ready in time (retried).
   */
  async getTestDatabase(hash: string, opts: CallOptions = {}): Promise<TestDatabase> {
    const body = (await this.request("getTestDatabase", "GET", `${this.api}/templates/${Client.h(hash)}/tests`, opts)) as Record<
      string,
      unknown
    >;
    const { templateHash, config } = parseBody(body, hash);
    const url = databaseUrl(config);
    warnKept(body);
    if (typeof body.id === "string") {
      return { templateHash, id: Number(body.number), token: body.id, config, url };
    }
    return { templateHash, id: Number(body.id), config, url };
  }

  /** Gives db back unchanged (only after a test that did not write); by its token on v2. */
  async unlock(db: TestDatabase, opts: CallOptions = {}): Promise<void> {
    await this.handOutOp("unlock", db, opts);
  }

  /** Gives db back to be recreated from the template; by its token on v2. */
  async recreate(db: TestDatabase, opts: CallOptions = {}): Promise<void> {
    await this.handOutOp("recreate", db, opts);
  }

  /**
   * Keeps db as it is for inspection (its test failed): pgfork serve no
   * longer counts it against the pool's maximum, keeps it across a restart
   * and drops the oldest kept beyond its --kept-max; giving it back later
   * (recreate, unlock) drops it. By its token on v2. IntegreSQL has no such
   * call (an ApiError).
   */
  async keep(db: TestDatabase, opts: CallOptions = {}): Promise<void> {
    await this.handOutOp("keep", db, opts);
  }

  private async handOutOp(op: "unlock" | "recreate" | "keep", db: TestDatabase, opts: CallOptions): Promise<void> {
    const h = Client.h(db.templateHash);
    if (this.apiVersion === 1 || !db.token) {
      await this.request(op, "POST", `/api/v1/templates/${h}/tests/${Math.trunc(db.id)}/${op}`, { ...opts, want: 204 });
      return;
    }
    await this.request(op, "POST", `/api/v2/templates/${h}/tests/${encodeURIComponent(db.token)}/${op}`, { ...opts, want: 204 });
  }

  /** Returns test database id unchanged (v1 route; prefer unlock(db)). */
  async unlockTestDatabase(hash: string, id: number, opts: CallOptions = {}): Promise<void> {
    await this.request("unlockTestDatabase", "POST", `/api/v1/templates/${Client.h(hash)}/tests/${Math.trunc(id)}/unlock`, { ...opts, want: 204 });
  }

  /** Returns test database id to be recreated (v1 route; prefer recreate(db)). */
  async recreateTestDatabase(hash: string, id: number, opts: CallOptions = {}): Promise<void> {
    await this.request("recreateTestDatabase", "POST", `/api/v1/templates/${Client.h(hash)}/tests/${Math.trunc(id)}/recreate`, {
      ...opts,
      want: 204,
    });
  }

  /** GET /api/v2/templates (pgfork serve only). */
  async listTemplates(opts: CallOptions = {}): Promise<{ databases: number; templates: TemplateInfo[] }> {
    if (this.apiVersion === 1) throw new PgforkError("listTemplates: needs the v2 API (pgfork serve); this client talks v1");
    const body = (await this.request("listTemplates", "GET", "/api/v2/templates", opts)) as
      | { databases?: number; templates?: TemplateInfo[] }
      | undefined;
    return { databases: body?.databases ?? 0, templates: body?.templates ?? [] };
  }

  /** Forgets every template and test database on the server. */
  async resetAllTracking(opts: CallOptions = {}): Promise<void> {
    await this.request("resetAllTracking", "DELETE", `${this.api}/admin/templates`, { ...opts, want: 204 });
  }
}

let keptWarned = false;

/**
 * Prints, once per process, the server's line (a hand-out's `warning`)
 * saying that databases of failed tests kept for inspection pile up.
 */
function warnKept(body: Record<string, unknown>): void {
  if (!keptWarned && typeof body.warning === "string" && body.warning !== "") {
    keptWarned = true;
    process.stderr.write(body.warning + "\n");
  }
}
