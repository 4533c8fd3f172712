import { type Client, type DatabaseConfig, type TestDatabase, maskPassword } from "./client.js";
import { ApiError, PgforkError } from "./errors.js";
import { type PgClient, connectPg } from "./migrate.js";
import { getDatabase } from "./template.js";

/** One test's database: its URL, and a `pg` client when pg is installed. */
export class PgforkDatabase {
  readonly testDatabase: TestDatabase;
  /** postgres:// URL with the password. */
  readonly url: string;
  /** The database's name. */
  readonly name: string;
  readonly config: DatabaseConfig;
  /** Set when the test failed: the database is not given back. */
  kept = false;
  /** Milliseconds the test waited for this database: the hand-out plus opening db.client. */
  acquireMs = 0;
  /** Milliseconds of the hand-out alone (getTestDatabase). */
  handOutMs = 0;
  private pgClient: PgClient | undefined;
  private others: PgClient[] = [];

  constructor(td: TestDatabase) {
    this.testDatabase = td;
    this.url = td.url;
    this.name = td.config.database;
    this.config = td.config;
  }

  /** url with the password replaced by ***. */
  get safeUrl(): string {
    return maskPassword(this.url);
  }

  /** The connected `pg` client opened for the test (needs the peer dependency pg). */
  get client(): PgClient {
    if (!this.pgClient) throw new PgforkError("pgfork: db.client needs the package pg (npm install --save-dev pg)");
    return this.pgClient;
  }

  /** Connects db.client if pg is installed (else does nothing). */
  async open(): Promise<void> {
    try {
      this.pgClient = await connectPg(this.url);
    } catch (e) {
      if (e instanceof PgforkError && / needs the package pg/.test(e.message)) return;
      throw e;
    }
  }

  /** A new `pg` client, closed when the test ends. */
  async connect(): Promise<PgClient> {
    const c = await connectPg(this.url);
    this.others.push(c);
    return c;
  }

  /** Closes every client opened for the test. */
  async close(): Promise<void> {
    const all = [this.pgClient, ...this.others].filter((c): c is PgClient => c !== undefined);
    this.pgClient = undefined;
    this.others = [];
    await Promise.allSettled(all.map((c) => c.end()));
  }

  /** The line printed for a kept database. */
  keptMessage(showPassword = process.env.PGFORK_SHOW_PASSWORD === "1"): string {
    const td = this.testDatabase;
    return (
      `pgfork: test failed: keeping test database ${this.name} (template ${td.templateHash}, id ${td.id}, ` +
      `hand-out ${td.token ?? "-"}) for inspection: ${showPassword ? this.url : this.safeUrl}`
    );
  }
}

/**
 * The environment variables that point libpq-style tools and most ORMs at
 * db: PGHOST, PGPORT, PGUSER, PGPASSWORD, PGDATABASE, PGSSLMODE (when the
 * server sets one) and, when urlVar is given, urlVar (e.g. DATABASE_URL) = db.url.
 */
export function databaseEnv(db: PgforkDatabase, urlVar?: string): Record<string, string> {
  const c = db.config;
  const vars: Record<string, string> = {
    PGHOST: c.host,
    PGPORT: String(c.port),
    PGUSER: c.username,
    PGPASSWORD: c.password,
    PGDATABASE: c.database,
    PGSSLMODE: c.additionalParams.sslmode ?? "disable",
  };
  if (urlVar) vars[urlVar] = db.url;
  return vars;
}

/** Sets vars in env; returns a function that puts back what env held before. */
export function setEnv(env: NodeJS.ProcessEnv, vars: Record<string, string>): () => void {
  const before = Object.keys(vars).map((k) => [k, env[k]] as const);
  Object.assign(env, vars);
  return () => {
    for (const [k, v] of before) {
      if (v === undefined) Reflect.deleteProperty(env, k);
      else env[k] = v;
    }
  };
}

/** A database of template hash for one test, not connected (db.open() connects db.client). */
export async function acquireDatabase(client: Client, hash: string): Promise<PgforkDatabase> {
  const t0 = performance.now();
  const db = new PgforkDatabase(await getDatabase(client, hash));
  db.handOutMs = db.acquireMs = performance.now() - t0;
  return db;
}

/**
 * Ends db's test: closes its clients, then gives it back to be recreated
 * (unlocked when readonly) after a passing test; after a failing one keeps it
 * (POST …/keep: out of the pool's count) and logs its URL (password masked; PGFORK_SHOW_PASSWORD=1 shows it).
 */
export async function releaseDatabase(
  client: Client,
  db: PgforkDatabase,
  failed: boolean,
  opts: { readonly?: boolean; log?: (line: string) => void } = {},
): Promise<void> {
  await db.close();
  if (failed) {
    db.kept = true;
    (opts.log ?? ((l: string) => process.stderr.write(l + "\n")))(db.keptMessage());
    // Out of the pool's count, so kept failures never starve the next
    // tests; IntegreSQL has no keep (the database then stays in use). A
    // server that cannot be told is only reported: the test's own failure
    // is what the run must show.
    await client.keep(db.testDatabase).catch((e: unknown) => {
      if (!(e instanceof ApiError)) {
        process.stderr.write(`pgfork: telling the server to keep test database ${db.name} failed: ${String(e)}\n`);
      }
    });
  } else if (opts.readonly) {
    await client.unlock(db.testDatabase);
  } else {
    await client.recreate(db.testDatabase);
  }
}

/**
 * Gets a database of template hash, opens db.client (if pg is installed),
 * runs fn, and gives the database back to be recreated when fn succeeds; when
 * it throws, keeps the database and prints its URL (password masked; set
 * PGFORK_SHOW_PASSWORD=1 to see it) before rethrowing.
 */
export async function runWithDatabase<T>(
  client: Client,
  hash: string,
  fn: (db: PgforkDatabase) => Promise<T> | T,
  opts: { readonly?: boolean; log?: (line: string) => void } = {},
): Promise<T> {
  const t0 = performance.now();
  const db = await acquireDatabase(client, hash);
  let failed = true;
  try {
    await db.open();
    db.acquireMs = performance.now() - t0;
    const r = await fn(db);
    failed = false;
    return r;
  } finally {
    await releaseDatabase(client, db, failed, opts);
  }
}
