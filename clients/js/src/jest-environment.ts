import { TestEnvironment } from "jest-environment-node";
import type { Client } from "./client.js";
import { type PgforkDatabase, acquireDatabase, databaseEnv, releaseDatabase, setEnv } from "./database.js";
import { ENV_SHARED, type SharedTemplate, sharedClient } from "./shared.js";

type EnvConfig = ConstructorParameters<typeof TestEnvironment>[0];
type EnvContext = ConstructorParameters<typeof TestEnvironment>[1];

/** The parts of jest-circus's events this environment reads. */
interface TestEvent {
  name: string;
  test?: { errors: unknown[] };
}

/**
 * A jest test environment (jest's "node" one) that gives every test its own
 * database of the template pgfork/jest's globalSetup built, before the
 * test's beforeEach hooks run, and sets the environment to it: PGHOST,
 * PGPORT, PGUSER, PGPASSWORD, PGDATABASE, PGSSLMODE and a URL variable
 * (testEnvironmentOptions.pgforkUrlVar, default DATABASE_URL). After the
 * test and its afterEach hooks, a passing test's database is given back
 * (recreated) and a failing test's kept, its URL printed with the password
 * masked. For projects that open their stores in beforeEach from the
 * environment: `testEnvironment: "pgfork/jest-environment"`.
 */
export default class PgforkEnvironment extends TestEnvironment {
  private readonly urlVar: string;
  private db: PgforkDatabase | undefined;
  private restore: (() => void) | undefined;
  private shared: { client: Client; hash: string } | undefined;

  constructor(config: EnvConfig, context: EnvContext) {
    super(config, context);
    const v = config.projectConfig.testEnvironmentOptions?.pgforkUrlVar;
    this.urlVar = typeof v === "string" && v ? v : "DATABASE_URL";
  }

  /** jest-circus calls it for every event: test_start (before beforeEach) and test_done (after afterEach). */
  async handleTestEvent(event: TestEvent): Promise<void> {
    if (event.name === "test_start" && event.test) {
      try {
        if (!this.shared) {
          const raw = process.env[ENV_SHARED];
          this.shared = sharedClient(
            raw ? (JSON.parse(raw) as SharedTemplate) : undefined,
            "set globalSetup to a module exporting pgfork/jest's globalSetup(…) in the jest config",
          );
        }
        this.db = await acquireDatabase(this.shared.client, this.shared.hash);
        const env = (this.global.process as NodeJS.Process | undefined)?.env ?? process.env;
        this.restore = setEnv(env, databaseEnv(this.db, this.urlVar));
      } catch (e) {
        // The test fails with the reason (its body still runs, with no database set).
        event.test.errors.push(e);
      }
    } else if (event.name === "test_done" && event.test) {
      const db = this.db;
      this.restore?.();
      this.db = this.restore = undefined;
      if (db && this.shared) await releaseDatabase(this.shared.client, db, event.test.errors.length > 0);
    }
  }
}

export { PgforkEnvironment as TestEnvironment };
