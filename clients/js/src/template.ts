import { type Client, type TestDatabase, maskPassword } from "./client.js";
import { clientFromEnv } from "./env.js";
import { MigrationFailed, PgforkError, ServerUnreachable, TemplateAlreadyInitialized, TemplateDiscarded, TemplateNotFound } from "./errors.js";
import { templateHash } from "./hash.js";
import { type Migrate, sqlFiles } from "./migrate.js";

/** What a template is built from. */
export interface TemplateOptions {
  /** The client (default: clientFromEnv()). */
  client?: Client;
  /** Directory hashed into the template key; its *.sql files are run in name order unless migrate is given. */
  migrations?: string;
  /** Extra text hashed into the key (change it when migrate or seed change: their code is not hashed). */
  extraKey?: string;
  /** Migrates the template at a URL instead of the *.sql files (an adapter: knexMigrator(…), prismaMigrator(…)…). */
  migrate?: Migrate;
  /** Runs once into the template after the migrations, so per-test data costs nothing. */
  seed?: Migrate;
  /** Aborts the build's requests. */
  signal?: AbortSignal;
  /**
   * The PostgreSQL major of a `pgfork serve` the setup starts, e.g. 17 (installed if missing); $PGFORK_PG wins.
   * Default: the newest PostgreSQL installed on the system (see pgMajor).
   */
  pg?: number | string;
}

/** A built template: its hash and the client that built it. */
export interface Template {
  client: Client;
  hash: string;
  /** True if this call migrated it, false if another process had. */
  built: boolean;
}

/** text with every password of url (plain and URL-encoded) replaced by ***. */
export function redact(text: string, password: string): string {
  if (!password) return text;
  for (const form of [password, encodeURIComponent(password)]) text = text.split(form).join("***");
  return text;
}

/**
 * Builds the template of opts once across processes: initializes it, runs
 * the migrations and the seed, finalizes it. When another process has
 * initialized it (423) it returns at once; getTestDatabase then waits for
 * that process's finalize. When migrating fails the template is discarded (so
 * every process waiting for it fails at once instead of timing out) and
 * MigrationFailed is thrown with the tool's output.
 */
export async function ensureTemplate(opts: TemplateOptions = {}): Promise<Template> {
  const client = opts.client ?? clientFromEnv();
  const hash = templateHash(opts.migrations, opts.extraKey ?? "");
  let tpl;
  try {
    tpl = await client.initializeTemplate(hash, { signal: opts.signal });
  } catch (e) {
    if (e instanceof TemplateAlreadyInitialized) return { client, hash, built: false };
    throw e;
  }
  try {
    const migrate = opts.migrate ?? (opts.migrations ? sqlFiles(opts.migrations) : undefined);
    if (migrate) await migrate(tpl.url);
    if (opts.seed) await opts.seed(tpl.url);
  } catch (e) {
    let discardNote = "";
    try {
      await client.discardTemplate(hash, { signal: opts.signal });
    } catch (d) {
      discardNote = ` (discarding it failed too: ${(d as Error).message})`;
    }
    const msg = e instanceof Error ? e.message : String(e);
    throw new MigrationFailed(
      redact(`pgfork: migrating template ${hash} (${maskPassword(tpl.url)}) failed; template discarded${discardNote}:\n${msg}`, tpl.config.password),
      { cause: e },
    );
  }
  await client.finalizeTemplate(hash, { signal: opts.signal });
  return { client, hash, built: true };
}

/**
 * A test database of template hash; a discarded template (its migrations
 * failed in another process) is a MigrationFailed naming that.
 */
export async function getDatabase(client: Client, hash: string, signal?: AbortSignal): Promise<TestDatabase> {
  try {
    return await client.getTestDatabase(hash, { signal });
  } catch (e) {
    if (e instanceof TemplateDiscarded || (e instanceof TemplateNotFound && client.apiVersion === 1)) {
      throw new MigrationFailed(
        `pgfork: template ${hash} was discarded: its migrations failed in the process that built it (see its output): ${e.message}`,
        { cause: e },
      );
    }
    if (e instanceof ServerUnreachable) throw e;
    throw e instanceof PgforkError ? e : new PgforkError(String(e), { cause: e });
  }
}
