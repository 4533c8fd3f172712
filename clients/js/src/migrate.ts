import { spawn } from "node:child_process";
import { existsSync, readdirSync, readFileSync } from "node:fs";
import { dirname, join, resolve } from "node:path";
import { PgforkError } from "./errors.js";
import { cjsDefault, loadPeer } from "./peer.js";

/** Migrates (or seeds) the database at url. */
export type Migrate = (url: string) => Promise<void> | void;

/** The parts of a `pg` client this package uses. */
export interface PgClient {
  connect(): Promise<unknown>;
  query(sql: string, values?: unknown[]): Promise<{ rows: Record<string, unknown>[]; rowCount: number | null }>;
  end(): Promise<void>;
}

/** A connected `pg` Client for url (needs the peer dependency pg). */
export async function connectPg(url: string): Promise<PgClient> {
  const pg = cjsDefault<{ Client: new (c: { connectionString: string }) => PgClient }>(
    await loadPeer("pg", "connecting to a database"),
  );
  const c = new pg.Client({ connectionString: url });
  await c.connect();
  return c;
}

/** Runs fn with a connected `pg` client for url, closed afterwards. */
export async function withPg<T>(url: string, fn: (c: PgClient) => Promise<T>): Promise<T> {
  const c = await connectPg(url);
  try {
    return await fn(c);
  } finally {
    await c.end();
  }
}

const byBytes = (a: string, b: string): number => Buffer.compare(Buffer.from(a, "utf8"), Buffer.from(b, "utf8"));

/**
 * The default migrator: the *.sql files directly in directory, in name order
 * (by UTF-8 bytes), each run as one batch (needs pg). An error names the file.
 */
export function sqlFiles(directory: string): Migrate {
  return async (url) => {
    const files = readdirSync(directory)
      .filter((f) => f.endsWith(".sql") && !f.startsWith("."))
      .sort(byBytes);
    await withPg(url, async (c) => {
      for (const f of files) {
        const sql = readFileSync(join(directory, f), "utf8");
        if (!sql.trim()) continue;
        try {
          await c.query(sql);
        } catch (e) {
          throw new PgforkError(`${f}: ${(e as Error).message}`, { cause: e });
        }
      }
    });
  };
}

/** Options of the Knex adapter. */
export interface KnexOptions {
  /** Knex's migrations config (directory, loadExtensions, tableName, …). */
  migrations?: Record<string, unknown>;
  /** Other Knex config merged in (client "pg" and connection are set by the adapter). */
  config?: Record<string, unknown>;
}

/** Knex: `knex.migrate.latest()` against the template (needs knex and pg). */
export function knexMigrator(opts: KnexOptions = {}): Migrate {
  return async (url) => {
    type Knex = { migrate: { latest(): Promise<unknown> }; destroy(): Promise<void> };
    const knex = cjsDefault<(c: Record<string, unknown>) => Knex>(await loadPeer("knex", "the Knex adapter"));
    const k = knex({ ...opts.config, client: "pg", connection: url, migrations: opts.migrations ?? {} });
    try {
      await k.migrate.latest();
    } finally {
      await k.destroy();
    }
  };
}

/** Options of the node-pg-migrate adapter (passed to its runner). */
export interface NodePgMigrateOptions {
  /** Directory of the migrations. */
  dir: string;
  /** Table of applied migrations (default pgmigrations). */
  migrationsTable?: string;
  /** Other runner options. */
  options?: Record<string, unknown>;
}

/** node-pg-migrate: its programmatic runner, direction up (needs node-pg-migrate and pg). */
export function nodePgMigrateMigrator(opts: NodePgMigrateOptions): Migrate {
  return async (url) => {
    const mod = await loadPeer<{ runner?: unknown; default?: unknown }>("node-pg-migrate", "the node-pg-migrate adapter");
    const runner = (mod.runner ?? (mod.default as { runner?: unknown } | undefined)?.runner ?? mod.default) as (
      o: Record<string, unknown>,
    ) => Promise<unknown>;
    await runner({
      databaseUrl: url,
      dir: opts.dir,
      direction: "up",
      migrationsTable: opts.migrationsTable ?? "pgmigrations",
      count: Infinity,
      log: () => undefined,
      ...opts.options,
    });
  };
}

/** Drizzle: drizzle-orm's node-postgres migrator over migrationsFolder (needs drizzle-orm and pg). */
export function drizzleMigrator(opts: { migrationsFolder: string; migrationsTable?: string; migrationsSchema?: string }): Migrate {
  return async (url) => {
    // drizzle(client): the one form every drizzle-orm since 0.30 takes (drizzle({ connection }) came later).
    const { drizzle } = await loadPeer<{ drizzle: (c: unknown) => unknown }>("drizzle-orm/node-postgres", "the Drizzle adapter");
    const { migrate } = await loadPeer<{ migrate: (db: unknown, c: Record<string, unknown>) => Promise<void> }>(
      "drizzle-orm/node-postgres/migrator",
      "the Drizzle adapter",
    );
    await withPg(url, (c) => migrate(drizzle(c), { ...opts }));
  };
}

/** Runs a command, resolving with its output; rejects with the output when it fails. */
export function runCommand(
  cmd: string,
  args: string[],
  opts: { cwd?: string; env?: NodeJS.ProcessEnv; what: string },
): Promise<string> {
  return new Promise((resolve, reject) => {
    const child = spawn(cmd, args, { cwd: opts.cwd, env: opts.env, stdio: ["ignore", "pipe", "pipe"] });
    let out = "";
    child.stdout.on("data", (d: Buffer) => (out += d.toString()));
    child.stderr.on("data", (d: Buffer) => (out += d.toString()));
    child.on("error", (e) => reject(new PgforkError(`${opts.what}: cannot run ${cmd}: ${e.message}`, { cause: e })));
    child.on("close", (code, signal) => {
      if (code === 0) resolve(out);
      else reject(new PgforkError(`${opts.what} failed (${signal ?? `exit ${code}`}):\n${out.trimEnd()}`));
    });
  });
}

/** node_modules/.bin/name in dir or the nearest parent that has it (as npx finds it), else name (from PATH). */
export function findBin(dir: string, name: string): string {
  for (let d = resolve(dir); ; d = dirname(d)) {
    const p = join(d, "node_modules", ".bin", name);
    if (existsSync(p)) return p;
    if (dirname(d) === d) return name;
  }
}

/** Options of the Prisma adapter. */
export interface PrismaOptions {
  /** The project directory (where prisma.config.ts or prisma/schema.prisma is); default the current one. */
  cwd?: string;
  /** --schema PATH. */
  schema?: string;
  /** --config PATH (Prisma 7's prisma.config.ts). */
  config?: string;
  /** The environment variable the schema/config reads the URL from (default DATABASE_URL). */
  urlEnv?: string;
  /** The prisma CLI (default node_modules/.bin/prisma under cwd, else `prisma` on PATH). */
  bin?: string;
}

/** Prisma: `prisma migrate deploy` with the template's URL in $DATABASE_URL (needs the prisma CLI and its engines). */
export function prismaMigrator(opts: PrismaOptions = {}): Migrate {
  return async (url) => {
    const cwd = opts.cwd ?? process.cwd();
    let bin = opts.bin;
    bin ??= findBin(cwd, "prisma");
    const args = ["migrate", "deploy"];
    if (opts.schema) args.push("--schema", opts.schema);
    if (opts.config) args.push("--config", opts.config);
    await runCommand(bin, args, {
      cwd,
      env: { ...process.env, [opts.urlEnv ?? "DATABASE_URL"]: url, PRISMA_HIDE_UPDATE_MESSAGE: "1" },
      what: "prisma migrate deploy",
    });
  };
}
