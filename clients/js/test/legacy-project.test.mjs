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

// Its jest suite (pgfork/jest-environment, a failing test's database kept) runs in
// test/serve.test.mjs, with no server configured: the glue starts one.
