// The PostgreSQL major is the project's (issue 58): the setups' pg option
// (or $PGFORK_PG) gives the `pgfork serve` the glue starts that major, and a
// serve of the state directory with another major is not used. Real pgfork
// serve and PostgreSQL: 15 from the system, 17 from the test environment's
// installs (PGFORK_TEST_PG_BINS, see scripts/test-env.sh env).
import { test } from "node:test";
import assert from "node:assert/strict";
import { execFile, spawn } from "node:child_process";
import { chmodSync, existsSync, mkdirSync, mkdtempSync, readdirSync, readFileSync, rmSync, symlinkSync } from "node:fs";
import { tmpdir } from "node:os";
import { basename, dirname, join } from "node:path";
import { fileURLToPath } from "node:url";
import { pgMajor } from "../dist/esm/serve.js";

const here = dirname(fileURLToPath(import.meta.url));
const root = join(here, "..");
const base = existsSync("/var/tmp") ? "/var/tmp" : tmpdir(); // not a small /tmp: PostgreSQL's data goes there

/** A new directory the postgres OS user can reach (as root the managed PostgreSQL runs as that user). */
function scratch(t, what) {
  const d = mkdtempSync(join(base, `pgfork-js-${what}-`));
  chmodSync(d, 0o755);
  t.after(() => rmSync(d, { recursive: true, force: true }));
  return d;
}

/** A PGFORK_HOME whose installs/ holds the test environment's build of major (a link), as `pgfork pg install` leaves one. */
function homeWithMajor(t, major) {
  for (const bin of (process.env.PGFORK_TEST_PG_BINS ?? "").split(":")) {
    const inst = dirname(bin);
    if (basename(dirname(inst)) === "installs" && basename(inst).split(".")[0] === String(major)) {
      const home = scratch(t, "home");
      mkdirSync(join(home, "installs"), { mode: 0o755 });
      symlinkSync(inst, join(home, "installs", basename(inst)));
      return home;
    }
  }
  throw new Error(`no PostgreSQL ${major} install in PGFORK_TEST_PG_BINS: run under eval "$(scripts/test-env.sh env)"`);
}

/** No server configured, no pgfork setting; PGFORK_BIN and the state directory given. */
function noServerEnv(extra) {
  const bin = process.env.PGFORK_BIN;
  if (!bin) throw new Error("PGFORK_BIN is not set: point it at a built pgfork (clients/test.sh exports it)");
  const drop = ["PGFORK_URL", "PGFORK_TOKEN", "INTEGRESQL_CLIENT_BASE_URL", "NODE_TEST_CONTEXT", "PGFORK_PG", "PGFORK_PG_BIN", "PGFORK_HOME", "PGFORK_SERVE_ARGS"];
  const env = Object.fromEntries(Object.entries(process.env).filter(([k]) => !drop.includes(k)));
  return { ...env, NO_COLOR: "1", PGFORK_BIN: bin, ...extra };
}

function run(cmd, args, opts) {
  return new Promise((resolve) => {
    execFile(cmd, args, { ...opts, maxBuffer: 16 << 20 }, (err, stdout, stderr) => resolve({ code: err ? (err.code ?? 1) : 0, out: stdout + stderr }));
  });
}

/** Processes whose command line names dir; Linux only. */
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

async function noneLeft(dir, ms = 30_000) {
  const deadline = Date.now() + ms;
  let left = processesUsing(dir);
  while (left.length > 0 && Date.now() < deadline) {
    await new Promise((r) => setTimeout(r, 100));
    left = processesUsing(dir);
  }
  return left;
}

// SHOW server_version of the server PGFORK_URL names, through a template database.
const VERSION = `
async function version() {
  const { Client } = await import("pgfork");
  const pg = (await import("pg")).default;
  const c = new Client(process.env.PGFORK_URL, { token: process.env.PGFORK_TOKEN });
  const h = "jsmajor" + Math.random().toString(16).slice(2);
  const tpl = await c.initializeTemplate(h);
  const db = new pg.Client({ connectionString: tpl.url });
  await db.connect();
  const r = await db.query("SHOW server_version");
  await db.end();
  await c.discardTemplate(h);
  return r.rows[0].server_version;
}
`;

test("pgMajor: PGFORK_PG wins over the pg option; anything but a major is an error naming the fix", () => {
  assert.equal(pgMajor(undefined, {}), "");
  assert.equal(pgMajor(17, {}), "17");
  assert.equal(pgMajor("16", { PGFORK_PG: "18" }), "18");
  assert.throws(() => pgMajor("17.2", {}), /"17\.2" is not a PostgreSQL major version: give one such as 17/);
});

test("no server configured: the pg option gives the started serve that PostgreSQL major; asking another major later does not reuse it", async (t) => {
  const state = scratch(t, "state");
  const env = noServerEnv({ PGFORK_STATE_DIR: state, PGFORK_HOME: homeWithMajor(t, 17) });
  const script = `${VERSION}
  import("pgfork").then(async ({ ensureServe, stopServe }) => {
    const first = await ensureServe({ pg: 17 });
    console.log("FIRST " + (await version()) + " " + first?.pgVersion);
    await ensureServe({ pg: 15 });
    console.log("SECOND " + (await version()));
    await stopServe();
    process.exit(0);
  }).catch((e) => { console.log("ERROR " + e.message); process.exit(1); })`;
  const r = await run(process.execPath, ["-e", script], { cwd: root, env });
  t.after(async () => assert.deepEqual(await noneLeft(state), [], "a process of the started server outlived the run"));
  assert.equal(r.code, 0, r.out);
  assert.match(r.out, /^FIRST 17\.\S+ 17\./m, r.out);
  assert.match(r.out, /^SECOND 15\./m, `the second call, asking for 15, used the serve of 17:\n${r.out}`);
});

test("no server configured: PGFORK_PG=17 refuses a serve of the state directory the glue did not start, saying how to go on", async (t) => {
  const state = scratch(t, "state");
  const token = "tok" + Math.random().toString(16).slice(2).padEnd(20, "0");
  const env = noServerEnv({ PGFORK_STATE_DIR: state, PGFORK_TOKEN: token });
  // Yours: a pgfork serve you started on the project's state directory (PostgreSQL 15, the system's).
  const serve = spawn(env.PGFORK_BIN, ["serve", "--listen", "127.0.0.1:0", "--json", "--state-dir", state], { env, stdio: ["ignore", "pipe", "pipe"] });
  const exited = new Promise((r) => serve.on("exit", r));
  t.after(async () => {
    serve.kill("SIGTERM");
    await exited;
  });
  let out = "";
  serve.stdout.on("data", (b) => (out += b));
  serve.stderr.on("data", () => {});
  const deadline = Date.now() + 180_000;
  while (!out.includes("\n") && serve.exitCode === null && Date.now() < deadline) await new Promise((r) => setTimeout(r, 50));
  assert.match(out, /"pg_major":15/, out);
  const script = `${VERSION}
  import("pgfork").then(async ({ ensureServe }) => {
    await ensureServe();
    console.log("USED " + (await version()));
    process.exit(0);
  }).catch((e) => { console.log("ERROR " + e.message); process.exit(1); })`;
  const r = await run(process.execPath, ["-e", script], { cwd: root, env: { ...env, PGFORK_PG: "17" } });
  assert.doesNotMatch(r.out, /USED/, `a run asking for 17 used the serve of 15:\n${r.out}`);
  assert.match(r.out, /ERROR pgfork: the pgfork serve holding the state directory .* was not started by this glue, so its PostgreSQL major is not known, and PGFORK_PG \(the pg option\) asks for 17: .*PGFORK_STATE_DIR.*PGFORK_URL/, r.out);
  // Without a major asked, it is used as before.
  const same = await run(process.execPath, ["-e", script], { cwd: root, env });
  assert.match(same.out, /^USED 15\./m, same.out);
});
