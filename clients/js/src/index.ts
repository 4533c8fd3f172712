export * from "./errors.js";
export {
  Client,
  DEFAULT_URL,
  conninfo,
  databaseUrl,
  maskBaseUrl,
  maskPassword,
  type CallOptions,
  type ClientOptions,
  type DatabaseConfig,
  type TemplateDatabase,
  type TemplateInfo,
  type TestDatabase,
} from "./client.js";
export { clientFromEnv, envSettings, type EnvSettings } from "./env.js";
export { templateHash } from "./hash.js";
export {
  connectPg,
  drizzleMigrator,
  knexMigrator,
  nodePgMigrateMigrator,
  prismaMigrator,
  runCommand,
  sqlFiles,
  withPg,
  type KnexOptions,
  type Migrate,
  type NodePgMigrateOptions,
  type PgClient,
  type PrismaOptions,
} from "./migrate.js";
export { ensureTemplate, getDatabase, redact, type Template, type TemplateOptions } from "./template.js";
export { PgforkDatabase, runWithDatabase } from "./database.js";
export { ensureServe, findPgfork, pgMajor, platformPackage, serveStateDir, stopServe, type StartedServe } from "./serve.js";
export { acquireDatabase, databaseEnv, releaseDatabase, setEnv } from "./database.js";
