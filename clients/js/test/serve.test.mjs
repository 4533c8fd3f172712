// The glue starting `pgfork serve` itself: finding the binary (the platform
// package, then PGFORK_BIN, then PATH, else an error naming the install
// command), and, with no server configured, jest's global setup and a
// `node --test` run each starting one server for the run that is gone after it.
import { after, test } from "node:test";
import assert from "node:assert/strict";
import { execFile, spawn } from "node:child_process";
import { chmodSync, existsSync, mkdirSync, mkdtempSync, readdirSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { dirname, join } from "node:path";
import { performance } from "node:perf_hooks";
import { fileURLToPath } from "node:url";
import { findPgfork, listenFromJson, platformPackage, serveArgs, serveStateDir } from "../dist/esm/serve.js";

const here = dirname(fileURLToPath(import.meta.url));
const root = join(here, "..");
const base = existsSync("/var/tmp") ? "/var/tmp" : tmpdir(); // not a small /tmp: PostgreSQL's data goes there

function scratch(t) {
  const d = mkdtempSync(join(base, "pgfork-js-"));
  t.after(() => rmSync(d, { recursive: true, force: true }));
  return d;
}

function fakeBinary(path) {
  mkdirSync(dirname(path), { recursive: true });
  writeFileSync(path, "#!/bin/sh\nexit 0\n");
  chmodSync(path, 0o755);
  return path;
}

test("findPgfork: the platform package first, then PGFORK_BIN, then PATH; else the install command", (t) => {
  const d = scratch(t);
  const onPath = fakeBinary(join(d, "path", "pgfork"));
  const fromEnv = fakeBinary(join(d, "env", "pgfork"));
  const project = join(d, "project");
  mkdirSync(project);
  assert.throws(() => findPgfork({ env: { PATH: join(d, "nowhere") }, dir: project }), (e) => {
    assert.match(e.message, /no pgfork binary \(no package @pgfork\/\S+ installed, no PGFORK_BIN, no pgfork on PATH\): npm install --save-dev pgfork/);
    return true;
  });
  assert.equal(findPgfork({ env: { PATH: join(d, "path") }, dir: project }), onPath);
  assert.equal(findPgfork({ env: { PATH: join(d, "path"), PGFORK_BIN: fromEnv }, dir: project }), fromEnv);
  assert.throws(() => findPgfork({ env: { PGFORK_BIN: join(d, "missing") }, dir: project }), /PGFORK_BIN=\S+ is not an executable file/);
  const pkg = join(project, "node_modules", ...platformPackage().split("/"));
  mkdirSync(pkg, { recursive: true });
  writeFileSync(join(pkg, "package.json"), JSON.stringify({ name: platformPackage(), version: "0.0.0" }));
  const packaged = fakeBinary(join(pkg, "bin", "pgfork"));
  assert.equal(findPgfork({ env: { PATH: join(d, "path"), PGFORK_BIN: fromEnv }, dir: project }), packaged);
});

test("bin/pgfork.js runs the binary with the arguments and exit status; without one it names the install command", async (t) => {
  const d = scratch(t);
  const fake = join(d, "pgfork");
  writeFileSync(fake, '#!/bin/sh\necho "args: $*"\nexit 3\n');
  chmodSync(fake, 0o755);
  const shim = join(root, "bin", "pgfork.js");
  const env = { PATH: process.env.PATH, PGFORK_BIN: fake };
  const r = await run(process.execPath, [shim, "serve", "--help"], { env });
  assert.equal(r.code, 3, r.out);
  assert.equal(r.out, "args: serve --help\n");
  const none = await run(process.execPath, [shim, "version"], { env: { PATH: process.env.PATH } });
  assert.equal(none.code, 127, none.out);
  assert.match(none.out, /no pgfork binary .*npm install --save-dev pgfork/);
});

test("serveStateDir: <project>/node_modules/.cache/pgfork, PGFORK_STATE_DIR wins", (t) => {
  const d = scratch(t);
  writeFileSync(join(d, "package.json"), "{}");
  mkdirSync(join(d, "src", "deep"), { recursive: true });
  assert.equal(serveStateDir({}, join(d, "src", "deep")), join(d, "node_modules", ".cache", "pgfork"));
  assert.equal(serveStateDir({ PGFORK_STATE_DIR: join(d, "mine") }, d), join(d, "mine"));
});

test("listenFromJson: one line, or the whole object printed over several", () => {
  assert.equal(listenFromJson('{"listen":"127.0.0.1:5"}\n'), "127.0.0.1:5");
  assert.equal(listenFromJson('{\n  "listen": "127.0.0.1:6",\n  "socket": ""\n}\n'), "127.0.0.1:6");
  assert.equal(listenFromJson('{\n  "listen": "127.0.0.1:6",'), undefined);
});

test("serveArgs: PGFORK_SERVE_ARGS split as a POSIX shell splits words; an unclosed quote is an error", () => {
  assert.deepEqual(serveArgs({}), []);
  assert.deepEqual(serveArgs({ PGFORK_SERVE_ARGS: "  " }), []);
  assert.deepEqual(serveArgs({ PGFORK_SERVE_ARGS: " --pool-max 16\t--copies  databases " }), ["--pool-max", "16", "--copies", "databases"]);
  assert.deepEqual(serveArgs({ PGFORK_SERVE_ARGS: `--a 'b c' "d \\"e\\"" f\\ g '' h'i'"j"` }), ["--a", "b c", 'd "e"', "f g", "", "hij"]);
  assert.throws(() => serveArgs({ PGFORK_SERVE_ARGS: "--a 'b" }), /PGFORK_SERVE_ARGS.*unclosed quote/);
});

// --- with no server configured: the glue starts one ---------------------

function noServerEnv(stateDir) {
  const bin = process.env.PGFORK_BIN;
  if (!bin) throw new Error("PGFORK_BIN is not set: point it at a built pgfork (clients/test.sh exports it)");
  const env = { ...process.env, NO_COLOR: "1", PGFORK_BIN: bin, PGFORK_STATE_DIR: stateDir };
  return Object.fromEntries(
    Object.entries(env).filter(([k]) => !["PGFORK_URL", "PGFORK_TOKEN", "INTEGRESQL_CLIENT_BASE_URL", "NODE_TEST_CONTEXT"].includes(k)),
  );
}

function run(cmd, args, opts) {
  return new Promise((resolve) => {
    const t0 = performance.now();
    execFile(cmd, args, { ...opts, maxBuffer: 16 << 20 }, (err, stdout, stderr) =>
      resolve({ code: err ? (err.code ?? 1) : 0, out: stdout + stderr, ms: Math.round(performance.now() - t0) }),
    );
  });
}

/** Processes whose command line names dir (the watchdog, serve, its PostgreSQL); Linux only. */
function processesUsing(dir) {
  if (!existsSync("/proc/self/cmdline")) return [];
  const found = [];
  for (const pid of readdirSync("/proc").filter((p) => /^\d+$/.test(p))) {
    try {
      const cmd = readFileSync(`/proc/${pid}/cmdline`, "utf8").replace(/\0/g, " ");
      if (cmd.includes(dir)) found.push(`${pid}: ${cmd}`);
    } catch {
      // gone meanwhile
    }
  }
  return found;
}

// Generous: the server stops on SIGTERM within seconds, but this machine may
// be loaded (stopping promptly is serve's own tests' business).
async function noneLeft(dir, ms = 30_000) {
  const deadline = Date.now() + ms;
  let left = processesUsing(dir);
  while (left.length > 0 && Date.now() < deadline) {
    await new Promise((r) => setTimeout(r, 100));
    left = processesUsing(dir);
  }
  return left;
}

// One state directory for both runs below, as a project keeps it: the second
// run finds the PostgreSQL the first one initialized.
let shared;
function stateDir() {
  shared ??= mkdtempSync(join(base, "pgfork-js-"));
  return shared;
}
after(() => shared && rmSync(shared, { recursive: true, force: true }));

test("no server configured: jest's global setup starts pgfork serve for the run; pgfork/jest-environment gives each test's store (opened in beforeEach) its database, migrated by node-pg-migrate 6, and keeps a failing test's; nothing is left after the run", async (t) => {
  const state = stateDir();
  const project = join(here, "legacy-project");
  const env = { ...noServerEnv(state), FIXTURE_FAIL: "1" };
  const r = await run(join(root, "node_modules", ".bin", "jest"), ["--config", "jest.config.js"], { cwd: project, env });
  assert.notEqual(r.code, 0, r.out);
  assert.match(r.out, /Tests: +1 failed, 3 passed, 4 total/, r.out);
  const failed = /FAILED-DB (\S+)/.exec(r.out)?.[1];
  assert.ok(failed, r.out);
  const line = r.out.split("\n").find((l) => l.includes(`keeping test database ${failed}`));
  assert.ok(line, r.out);
  assert.match(line, /postgres:\/\/\w+:\*\*\*@/);
  // Only the failing test's database is kept. (The passing test's may have
  // been recreated and handed to the failing one under the same name.)
  assert.ok(/PASSED-DB (\S+)/.test(r.out), r.out);
  assert.equal(r.out.split("\n").filter((l) => l.includes("keeping test database")).length, 1, r.out);
  assert.deepEqual(await noneLeft(state), [], "a process of the started server outlived the run");
  const record = JSON.parse(readFileSync(join(state, "js-serve.json"), "utf8"));
  assert.match(record.url, /^http:\/\/127\.0\.0\.1:\d+$/);
  assert.ok(record.token.length >= 16);
  // The state directory persists (its templates and PostgreSQL) for the next run.
  assert.ok(existsSync(join(state, "templates")), readdirSync(state).join(" "));
  t.diagnostic(`jest with a server it started: ${r.ms} ms`);
});

test("no server configured: a `node --test` run of two files starts one pgfork serve for both, gone after the run", async () => {
  const state = stateDir();
  const dir = join(here, "fixtures", "node-test-serve");
  const env = { ...noServerEnv(state), PGFORK_JS_MIGRATIONS: join(root, "examples", "migrations") };
  const r = await run(process.execPath, ["--test", "--test-concurrency=2", join(dir, "a.test.mjs"), join(dir, "b.test.mjs")], { cwd: root, env });
  assert.equal(r.code, 0, r.out);
  assert.match(r.out, /^# pass 2$/m, r.out);
  const urls = [...r.out.matchAll(/SERVE-URL (\S+)/g)].map((m) => m[1]);
  assert.equal(urls.length, 2, r.out);
  assert.equal(urls[0], urls[1], "both files must share one server");
  assert.match(urls[0], /^http:\/\/127\.0\.0\.1:\d+$/);
  assert.deepEqual(await noneLeft(state), [], "a process of the started server outlived the run");
});

test("no server configured: a run killed with SIGKILL leaves no server behind", async () => {
  const state = stateDir();
  const script = `import("pgfork").then(async ({ ensureServe }) => { const s = await ensureServe(); console.log("STARTED " + s.url); setInterval(() => {}, 1000); })`;
  const child = spawn(process.execPath, ["-e", script], { cwd: root, env: noServerEnv(state), stdio: ["ignore", "pipe", "pipe"] });
  let out = "";
  child.stdout.on("data", (b) => (out += b));
  child.stderr.on("data", (b) => (out += b));
  const exited = new Promise((r) => child.on("exit", r));
  const deadline = Date.now() + 120_000;
  while (!out.includes("STARTED") && child.exitCode === null && Date.now() < deadline) await new Promise((r) => setTimeout(r, 50));
  assert.match(out, /STARTED http:\/\/127\.0\.0\.1:\d+/, out);
  assert.notDeepEqual(processesUsing(state), [], "the server runs while the run does");
  child.kill("SIGKILL");
  await exited;
  assert.deepEqual(await noneLeft(state), [], "a process of the started server outlived the killed run");
});

/** The pids of root's process tree (root and every descendant, by the parent pid in /proc/PID/stat); Linux only. */
function processTree(root) {
  const parent = new Map();
  for (const pid of readdirSync("/proc").filter((p) => /^\d+$/.test(p))) {
    try {
      const stat = readFileSync(`/proc/${pid}/stat`, "utf8");
      parent.set(Number(pid), Number(stat.slice(stat.lastIndexOf(")") + 2).split(" ")[1]));
    } catch {
      // gone meanwhile
    }
  }
  const tree = new Set([root]);
  for (let grew = true; grew; ) {
    grew = false;
    for (const [pid, ppid] of parent) {
      if (tree.has(ppid) && !tree.has(pid)) {
        tree.add(pid);
        grew = true;
      }
    }
  }
  return [...tree];
}

function cmdline(pid) {
  try {
    return readFileSync(`/proc/${pid}/cmdline`, "utf8").replace(/\0/g, " ");
  } catch {
    return ""; // gone meanwhile
  }
}

test("no server configured: PGFORK_SERVE_ARGS reach the pgfork serve the glue starts", async (t) => {
  const state = stateDir();
  const script = `import("pgfork").then(async ({ Client, ensureServe }) => {
    const s = await ensureServe();
    const tpl = await new Client(s.url, { token: s.token }).initializeTemplate("jsargs58");
    console.log("TEMPLATE " + tpl.config.database);
    process.exit(0);
  })`;
  const env = { ...noServerEnv(state), PGFORK_SERVE_ARGS: "--db-prefix 'jsargs' --kept-max 7" };
  const r = await run(process.execPath, ["-e", script], { cwd: root, env });
  t.after(async () => assert.deepEqual(await noneLeft(state), [], "a process of the started server outlived the run"));
  assert.equal(r.code, 0, r.out);
  assert.match(r.out, /TEMPLATE jsargs_template_jsargs58\n/);
});

// docs/SECURITY.md, rule 2 (G3): every local user reads /proc/PID/cmdline.
// Both ways the glue starts serve: from the run's main process (serve itself,
// --exit-with-parent) and from another process of the run (through the node
// watchdog).
for (const via of ["the run's main process", "the watchdog"]) {
  test(`no server configured: the token of the pgfork serve the glue starts (from ${via}) is on no process's command line`, { skip: !existsSync("/proc/self/cmdline") && "KNOWN SKIP: no /proc" }, async (t) => {
    const state = stateDir();
    // The watchdog follows the runner: this test's process, not the child.
    const runner = via === "the watchdog" ? process.pid : 0;
    const script = `import("pgfork").then(async ({ ensureServe }) => { const s = await ensureServe({ runner: ${runner} || undefined }); console.log("STARTED " + s.watchdog + " " + s.token); setInterval(() => {}, 1000); })`;
    const child = spawn(process.execPath, ["-e", script], { cwd: root, env: noServerEnv(state), stdio: ["ignore", "pipe", "pipe"] });
    let out = "";
    child.stdout.on("data", (b) => (out += b));
    child.stderr.on("data", (b) => (out += b));
    const exited = new Promise((r) => child.on("exit", r));
    let watchdog = 0;
    t.after(async () => {
      child.kill("SIGKILL");
      await exited;
      if (watchdog) {
        try {
          process.kill(watchdog, "SIGTERM");
        } catch {
          // gone already
        }
      }
      assert.deepEqual(await noneLeft(state), [], "a process of the started server outlived the test");
    });
    const deadline = Date.now() + 120_000;
    while (!/STARTED \d+ \S+\n/.test(out) && child.exitCode === null && Date.now() < deadline) await new Promise((r) => setTimeout(r, 50));
    const m = /STARTED (\d+) (\S+)\n/.exec(out);
    assert.ok(m, out);
    watchdog = Number(m[1]);
    const token = m[2];
    assert.ok(token.length >= 16, out);
    const tree = processTree(child.pid).map((pid) => `${pid}: ${cmdline(pid)}`);
    assert.ok(tree.some((l) => / serve .*--state-dir/.test(l)), `pgfork serve is not in the run's process tree:\n${tree.join("\n")}`);
    if (via === "the watchdog") assert.ok(tree.some((l) => l.includes("process.argv.slice(1)")), `no watchdog in the run's process tree:\n${tree.join("\n")}`);
    // The tree, and for good measure every other process: the token is random.
    const leaks = readdirSync("/proc")
      .filter((p) => /^\d+$/.test(p))
      .map((pid) => `${pid}: ${cmdline(pid)}`)
      .filter((l) => l.includes(token));
    assert.deepEqual(leaks, [], `the token is on a command line (the run's process tree:\n${tree.join("\n")})`);
  });
}
