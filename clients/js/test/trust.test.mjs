// Rule 3 of docs/SECURITY.md in the glue (issue 57, G5, G6, G10): with no
// server configured, a server is used only when serveOwner proves it is the
// `pgfork serve` holding the run's state directory; nothing that merely
// answers on a port is sent a request. The fakes run as another user
// (nobody, through setpriv), as an attacker on the same host would; flock(1)
// --no-fork gives a fake the state directory's lock under its own pid.
import { test } from "node:test";
import assert from "node:assert/strict";
import { execFile, spawn } from "node:child_process";
import { chmodSync, chownSync, mkdirSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { dirname, join } from "node:path";
import { createInterface } from "node:readline";
import { fileURLToPath } from "node:url";

const root = join(dirname(fileURLToPath(import.meta.url)), "..");
const NOBODY = 65534;
const TOKEN = "secret-token-of-the-run";
const skip = process.platform !== "linux" || process.geteuid?.() !== 0 ? "KNOWN SKIP: the fake servers run as another user (nobody), which takes root on Linux" : false;

// A fake server: prints "port N", then "req <json>" for every request (its
// path and Authorization), and answers 200 as serve's /healthz does.
const FAKE = `
const http = require("node:http");
const s = http.createServer((req, res) => {
  console.log("req " + JSON.stringify({ url: req.url, auth: req.headers.authorization ?? null }));
  res.writeHead(200, { "Content-Type": "application/json" });
  res.end('{"status":"ok"}');
});
s.listen(Number(process.argv[1]), "127.0.0.1", () => console.log("port " + s.address().port));
`;

/** Starts a fake on port (0: any), as nobody unless asRoot, holding lock (a path) if given; undefined if the port is taken. */
async function fake({ port = 0, asRoot = false, lock } = {}) {
  let cmd = [process.execPath, "-e", FAKE, String(port)];
  if (!asRoot) cmd = ["setpriv", "--reuid", String(NOBODY), "--regid", String(NOBODY), "--clear-groups", ...cmd];
  if (lock) {
    mkdirSync(dirname(lock), { recursive: true });
    writeFileSync(lock, "");
    cmd = ["flock", "--no-fork", "-x", lock, ...cmd];
  }
  const p = spawn(cmd[0], cmd.slice(1), { cwd: "/", stdio: ["ignore", "pipe", "ignore"] });
  const lines = createInterface({ input: p.stdout });
  const seen = [];
  let ready;
  const up = new Promise((r) => (ready = r));
  lines.on("line", (l) => (l.startsWith("port ") ? ready(Number(l.slice(5))) : seen.push(l)));
  p.on("exit", () => ready(undefined));
  const got = await up;
  if (!got) return undefined;
  const closed = new Promise((r) => lines.on("close", r));
  return {
    pid: p.pid,
    port: got,
    url: `http://127.0.0.1:${got}`,
    /** Stops the fake; the requests it got. */
    async requests() {
      p.kill("SIGKILL");
      await closed;
      return seen;
    },
  };
}

function startTime(pid) {
  const stat = readFileSync(`/proc/${pid}/stat`, "utf8");
  return Number(stat.slice(stat.lastIndexOf(")") + 1).trim().split(/\s+/)[19]);
}

/** A fresh state directory (this user's, 0755) and a PGFORK_BIN that only says it was run. */
function setup(t) {
  const d = mkdtempSync(join(tmpdir(), "pgfork-js-trust-"));
  t.after(() => rmSync(d, { recursive: true, force: true }));
  const state = join(d, "state");
  mkdirSync(join(state, "locks"), { recursive: true });
  chmodSync(state, 0o755);
  const bin = join(d, "pgfork");
  writeFileSync(bin, `#!/bin/sh\necho "$*" >> ${join(d, "ran")}\nexit 3\n`);
  chmodSync(bin, 0o755);
  return { state, bin, ran: join(d, "ran") };
}

/** What a serve started by the glue leaves: its owner record (as pgfork serve writes it) and js-serve.json, naming pid and port, for run 4242. */
function record(state, pid, port, uid = 0) {
  const start = startTime(pid);
  writeFileSync(join(state, "locks", "serve.owner"), JSON.stringify({ pid, start, uid, listen: `127.0.0.1:${port}` }));
  const rec = { runner: 4242, watchdog: pid, url: `http://127.0.0.1:${port}`, token: TOKEN, pid, start };
  writeFileSync(join(state, "js-serve.json"), JSON.stringify(rec), { mode: 0o600 });
}

/** ensureServe of run 4242 in a process of its own, with no server configured: "URL TOKEN", or its error. */
function ensure({ state, bin }) {
  const env = Object.fromEntries(Object.entries(process.env).filter(([k]) => !["PGFORK_URL", "PGFORK_TOKEN", "INTEGRESQL_CLIENT_BASE_URL", "NODE_TEST_CONTEXT"].includes(k)));
  Object.assign(env, { PGFORK_STATE_DIR: state, PGFORK_BIN: bin });
  const script = `import("pgfork").then(({ ensureServe }) => ensureServe({ runner: 4242 })).then((s) => console.log("USED " + s.url + " " + s.token), (e) => console.log("ERROR " + e.message))`;
  return new Promise((resolve) => execFile(process.execPath, ["-e", script], { cwd: root, env }, (_err, stdout, stderr) => resolve(stdout + stderr)));
}

test("G5: another user's fake at the default URL is never sent anything; the glue starts its own", { skip }, async (t) => {
  const f = await fake({ port: 5000 });
  if (!f) return t.skip("KNOWN SKIP: 127.0.0.1:5000 is taken on this host: what listens there cannot be watched");
  const s = setup(t);
  const out = await ensure(s);
  const got = await f.requests();
  assert.deepEqual(got, [], `the glue sent the fake at the default URL: ${out}`);
  assert.match(out, /ERROR .*exited/, out);
  assert.match(readFileSync(s.ran, "utf8"), /serve .*--state-dir/);
});

test("G10: a stale record naming a pid and port another user holds now (with the lock) is never sent anything", { skip }, async (t) => {
  const s = setup(t);
  const f = await fake({ lock: join(s.state, "locks", "serve.lock") });
  record(s.state, f.pid, f.port);
  const out = await ensure(s);
  const got = await f.requests();
  assert.deepEqual(got, [], `the glue sent a stale record's port: ${out}`);
  assert.match(out, /ERROR .*exited/, out);
});

test("the run's own serve (ours, alive with its start time, holding the lock) is found through its record", { skip }, async (t) => {
  const s = setup(t);
  const own = await fake({ asRoot: true, lock: join(s.state, "locks", "serve.lock") });
  record(s.state, own.pid, own.port);
  const out = await ensure(s);
  await own.requests();
  assert.equal(out.trim(), `USED ${own.url} ${TOKEN}`);
});

for (const how of ["another user's", "writable by others"]) {
  test(`G6: a state directory ${how} is refused before anything in it is read`, { skip }, async (t) => {
    const s = setup(t);
    const f = await fake();
    record(s.state, f.pid, f.port);
    if (how === "another user's") chownSync(s.state, NOBODY, NOBODY);
    else chmodSync(s.state, 0o777);
    const out = await ensure(s);
    const got = await f.requests();
    assert.deepEqual(got, [], `the glue sent a port named there: ${out}`);
    assert.match(out, /is not this user's alone/, out);
  });
}
