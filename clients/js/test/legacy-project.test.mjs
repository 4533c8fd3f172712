// Issue 34's findings, on a fixture project shaped like the real one
// (test/legacy-project): node-pg-migrate 6, "moduleResolution":
// "node", a jest suite that opens its store in beforeEach from the
// environment, with pgfork/jest-environment.
import { test } from "node:test";
import assert from "node:assert/strict";
import { execFile } from "node:child_process";
import { readFileSync } from "node:fs";
import { createRequire } from "node:module";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";
import { templateHash } from "pgfork";
import { liveClient } from "./helpers.mjs";

const here = dirname(fileURLToPath(import.meta.url));
const root = join(here, "..");
const project = join(here, "legacy-project");
const bin = (name) => join(root, "node_modules", ".bin", name);
const require = createRequire(import.meta.url);
const semver = require("semver");

function run(cmd, args, env = {}) {
  return new Promise((resolve) => {
    execFile(cmd, args, { cwd: project, env: { ...process.env, NO_COLOR: "1", ...env }, maxBuffer: 16 << 20 }, (err, stdout, stderr) =>
      resolve({ code: err ? (err.code ?? 1) : 0, out: stdout + stderr }),
    );
  });
}

test("the peer ranges admit what the fixture runs: node-pg-migrate 6", () => {
  const peers = JSON.parse(readFileSync(join(root, "package.json"), "utf8")).peerDependencies;
  const npm = JSON.parse(readFileSync(join(project, "node_modules", "node-pg-migrate", "package.json"), "utf8"));
  assert.equal(npm.version, "6.2.2");
  // The adapter loads it from the project, as an installed pgfork does.
  const fromPgfork = createRequire(join(project, "node_modules", "pgfork", "dist", "cjs", "index.js"));
  assert.equal(fromPgfork("node-pg-migrate/package.json").version, "6.2.2");
  assert.ok(semver.satisfies(npm.version, peers["node-pg-migrate"]), `node-pg-migrate ${npm.version} is outside the peer range ${peers["node-pg-migrate"]}`);
  // Every peer range is one minimum, ">=N": what the adapters were written against.
  for (const [name, range] of Object.entries(peers)) assert.match(range, /^>=\d+(\.\d+)*$/, `${name}: ${range}`);
});

test('"moduleResolution": "node" type-checks pgfork/jest, /jest-environment, /vitest, /node-test, /vitest-setup', async () => {
  const r = await run(bin("tsc"), ["-p", "tsconfig.json"]);
  assert.equal(r.code, 0, r.out);
});

test("jest with pgfork/jest-environment: each test's store (opened in beforeEach) gets its own database, migrated by node-pg-migrate 6; a failing test's is kept (URL printed, password masked), the others given back", async () => {
  const client = liveClient();
  const dir = join(project, "migrations");
  const hash = templateHash(dir, "");
  const inUse = async () => (await client.listTemplates()).templates.find((t) => t.templateHash === hash)?.databases?.in_use ?? 0;
  const before = await inUse();
  const r = await run(bin("jest"), ["--config", "jest.config.js"], { FIXTURE_FAIL: "1" });
  assert.notEqual(r.code, 0, r.out);
  assert.match(r.out, /Tests: +1 failed, 3 passed, 4 total/, r.out);
  const failed = /FAILED-DB (\S+)/.exec(r.out)?.[1];
  assert.ok(failed, r.out);
  const line = r.out.split("\n").find((l) => l.includes(`keeping test database ${failed}`));
  assert.ok(line, r.out);
  assert.match(line, /postgres:\/\/\w+:\*\*\*@/);
  assert.equal((await inUse()) - before, 1, "only the failed test's database is kept");
  assert.ok(!r.out.includes(`keeping test database ${/PASSED-DB (\S+)/.exec(r.out)?.[1]}`), r.out);
  await client.discardTemplate(hash);
});
