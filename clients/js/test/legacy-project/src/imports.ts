// Type-checked with "moduleResolution": "node", where subpath exports are
// invisible: these resolve through pgfork's typesVersions.
import { Client, nodePgMigrateMigrator } from "pgfork";
import { globalSetup, globalTeardown, withDatabase } from "pgfork/jest";
import PgforkEnvironment from "pgfork/jest-environment";
import { pgforkTemplate } from "pgfork/node-test";
import { test, useDatabaseEnv } from "pgfork/vitest";
import { pgforkSetup } from "pgfork/vitest-setup";

export const used = [Client, nodePgMigrateMigrator, globalSetup, globalTeardown, withDatabase, PgforkEnvironment, pgforkTemplate, test, useDatabaseEnv, pgforkSetup];
