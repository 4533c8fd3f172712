// The README's examples are the files under examples/, included verbatim
// (checked here), and each is run as written against the live server.
import { test } from "node:test";
import assert from "node:assert/strict";
import { execFile } from "node:child_process";
import { readdirSync, readFileSync, statSync } from "node:fs";
import { dirname, join, relative } from "node:path";
import { fileURLToPath } from "node:url";

const root = join(dirname(fileURLToPath(import.meta.url)), "..");
const bin = (name) => join(root, "node_modules", ".bin", name);

function run(cmd, args) {
  // Without node:test's own variable, so a child `node --test` runs its files.
  const env = { ...process.env };
  delete env.NODE_TEST_CONTEXT;
  return new Promise((resolve) => {
    execFile(cmd, args, { cwd: root, env: { ...env, NO_COLOR: "1" }, maxBuffer: 16 << 20 }, (err, stdout, stderr) =>
      resolve({ code: err ? (err.code ?? 1) : 0, out: stdout + stderr }),
    );
  });
}

function exampleFiles(dir = join(root, "examples")) {
  return readdirSync(dir).flatMap((name) => {
    if (name === "node_modules") return [];
    const p = join(dir, name);
    return statSync(p).isDirectory() ? exampleFiles(p) : [relative(root, p)];
  });
}

test("README.md includes every example file verbatim", () => {
  const readme = readFileSync(join(root, "README.md"), "utf8");
  const blocks = new Map();
  for (const m of readme.matchAll(/<!-- example: (\S+) -->\n```\w*\n([\s\S]*?)```\n/g)) blocks.set(m[1], m[2]);
  const files = exampleFiles();
  assert.ok(files.length >= 20, files.join(" "));
  for (const f of files) {
    assert.ok(blocks.has(f), `README.md does not include ${f}`);
    assert.equal(blocks.get(f), readFileSync(join(root, f), "utf8"), `README.md's copy of ${f} differs from the file`);
  }
  for (const f of blocks.keys()) assert.ok(files.includes(f), `README.md includes ${f}, which is not a file`);
});

for (const name of ["node-test/users", "knex/knex", "node-pg-migrate/node-pg-migrate", "drizzle/drizzle"]) {
  test(`example ${name}.test.mjs (node:test)`, async () => {
    const r = await run(process.execPath, ["--test", `examples/${name}.test.mjs`]);
    assert.equal(r.code, 0, r.out);
    assert.match(r.out, /^# fail 0$/m, r.out);
    assert.doesNotMatch(r.out, /^# pass 0$/m, r.out);
  });
}

test("example vitest", async () => {
  const r = await run(bin("vitest"), ["run", "--root", "examples/vitest"]);
  assert.equal(r.code, 0, r.out);
  assert.match(r.out, /Tests {2}2 passed \(2\)/, r.out);
});

test("example jest", async () => {
  const r = await run(bin("jest"), ["--config", "examples/jest/jest.config.cjs"]);
  assert.equal(r.code, 0, r.out);
  assert.match(r.out, /Tests: +2 passed, 2 total/, r.out);
});

test("example prisma (prisma migrate deploy)", async (t) => {
  const r = await run(process.execPath, ["--test", "examples/prisma/prisma.test.mjs"]);
  if (r.code !== 0 && /schema-engine|getaddrinfo|ENOTFOUND|EAI_AGAIN/.test(r.out)) {
    // The adapter ran the prisma CLI against the template with its URL, the
    // CLI failed, the template was discarded and the test failed with the
    // CLI's output: all of that is checked before saying why it cannot pass.
    assert.match(r.out, /prisma migrate deploy failed \(exit \d+\):/, r.out);
    assert.match(r.out, /Loaded Prisma config from prisma\.config\.mjs/, r.out);
    assert.match(r.out, /failed; template discarded/, r.out);
    const why = /\b(ENOTFOUND|EAI_AGAIN|ECONNREFUSED|ETIMEDOUT)\b/.exec(r.out)?.[1] ?? "no answer";
    t.skip(
      `KNOWN SKIP: prisma migrate deploy needs Prisma's schema-engine binary, which its CLI downloads from Prisma's own server ` +
        `at first use (npm's @prisma/engines ships none); this machine reaches only package registries (${why})`,
    );
    return;
  }
  assert.equal(r.code, 0, r.out);
  assert.match(r.out, /^# pass 1$/m, r.out);
});
