import { type ChildProcess, spawn, spawnSync } from "node:child_process";
import { randomBytes } from "node:crypto";
import { accessSync, chmodSync, closeSync, constants, existsSync, mkdirSync, openSync, readFileSync, realpathSync, rmSync, statSync, writeFileSync } from "node:fs";
import { createRequire } from "node:module";
import { delimiter, dirname, join, resolve } from "node:path";
import { Client } from "./client.js";
import { envSettings } from "./env.js";
import { PgforkError } from "./errors.js";

/** The one command that installs pgfork (with its binary) into a JavaScript project. */
export const INSTALL_HINT = "npm install --save-dev pgfork";

/** How long a started `pgfork serve` may take to answer (its first start may install PostgreSQL and initdb). */
export const SERVE_START_TIMEOUT_MS = 180_000;

/** The npm package carrying the binary for this platform: `@pgfork/<process.platform>-<process.arch>`. */
export function platformPackage(platform: string = process.platform, arch: string = process.arch): string {
  return `@pgfork/${platform}-${arch}`;
}

function executable(p: string): boolean {
  try {
    accessSync(p, constants.X_OK);
    return statSync(p).isFile();
  } catch {
    return false;
  }
}

/**
 * bin/pgfork of the installed platform package, resolved as pgfork itself
 * resolves it (from the pgfork package the project has, so also under pnpm),
 * else from dir; undefined when it is not installed.
 */
export function packagedBinary(dir: string = process.cwd()): string | undefined {
  const pkg = `${platformPackage()}/package.json`;
  const fromDir = createRequire(join(resolve(dir), "package.json"));
  const tries: (() => string)[] = [() => createRequire(fromDir.resolve("pgfork/package.json")).resolve(pkg), () => fromDir.resolve(pkg)];
  for (const t of tries) {
    try {
      const p = join(dirname(t()), "bin", "pgfork");
      if (executable(p)) return p;
    } catch {
      // not installed there
    }
  }
  return undefined;
}

/** True if p is this package's own bin/pgfork.js shim (as npm links it into node_modules/.bin). */
function isShim(p: string): boolean {
  try {
    return /[\\/]bin[\\/]pgfork\.js$/.test(realpathSync(p));
  } catch {
    return false;
  }
}

/**
 * The pgfork binary: the installed platform package (@pgfork/<platform>)
 * first, then $PGFORK_BIN, then `pgfork` on PATH (unless path is false;
 * this package's own shim is skipped there). Throws a PgforkError naming
 * the install command when there is none.
 */
export function findPgfork(opts: { env?: NodeJS.ProcessEnv; dir?: string; path?: boolean } = {}): string {
  const env = opts.env ?? process.env;
  const packaged = packagedBinary(opts.dir);
  if (packaged) return packaged;
  if (env.PGFORK_BIN) {
    if (!executable(env.PGFORK_BIN)) {
      throw new PgforkError(`pgfork: PGFORK_BIN=${env.PGFORK_BIN} is not an executable file: point it at a pgfork binary, or unset it and ${INSTALL_HINT}`);
    }
    return env.PGFORK_BIN;
  }
  if (opts.path !== false) {
    for (const d of (env.PATH ?? "").split(delimiter)) {
      const p = join(d || ".", "pgfork");
      if (executable(p) && !isShim(p)) return p;
    }
  }
  throw new PgforkError(
    `pgfork: no pgfork binary (no package ${platformPackage()} installed, no PGFORK_BIN${opts.path === false ? "" : ", no pgfork on PATH"}): ` +
      `${INSTALL_HINT} (it brings the binary for this platform), or set PGFORK_URL to a running pgfork serve`,
  );
}

/** The nearest directory from dir up that has a package.json (the project), else dir. */
export function projectDir(dir: string = process.cwd()): string {
  for (let d = resolve(dir); ; d = dirname(d)) {
    if (existsSync(join(d, "package.json"))) return d;
    if (dirname(d) === d) return resolve(dir);
  }
}

/**
 * The state directory of a `pgfork serve` the glue starts: $PGFORK_STATE_DIR,
 * else <project>/node_modules/.cache/pgfork. It persists, so the next run
 * finds its templates (and PostgreSQL) there.
 */
export function serveStateDir(env: NodeJS.ProcessEnv = process.env, dir?: string): string {
  return resolve(env.PGFORK_STATE_DIR || join(projectDir(dir), "node_modules", ".cache", "pgfork"));
}

/**
 * The state directory dir, created if missing, once it is proven to be this
 * user's alone: owned by this user and writable by no one else. Another
 * user's directory (one made first somewhere shared) would let them plant
 * the records the glue trusts; a PgforkError says so.
 */
export function privateStateDir(dir: string): string {
  mkdirSync(dir, { recursive: true, mode: 0o755 }); // not group-writable under a umask of 002
  const st = statSync(dir);
  const uid = process.geteuid?.();
  if (uid !== undefined && (!st.isDirectory() || st.uid !== uid || (st.mode & 0o022) !== 0)) {
    throw new PgforkError(
      `pgfork: the state directory ${dir} is not this user's alone (owner uid ${st.uid}, mode ${(st.mode & 0o7777).toString(8)}): ` +
        "pgfork keeps records there it trusts; set PGFORK_STATE_DIR to a directory you own that others cannot write",
    );
  }
  return dir;
}

/**
 * The extra arguments for a `pgfork serve` the glue starts: $PGFORK_SERVE_ARGS
 * split into words as a POSIX shell splits them (quotes and backslashes; no
 * expansions), as the Python plugin reads it. No secrets there: every local
 * user reads a command line; a password or token goes in the environment,
 * which serve inherits (PGFORK_PG_URL, …). A PgforkError says when the value
 * cannot be split (it does not show the value).
 */
export function serveArgs(env: NodeJS.ProcessEnv = process.env): string[] {
  const s = env.PGFORK_SERVE_ARGS ?? "";
  const bad = (why: string) => new PgforkError(`pgfork: PGFORK_SERVE_ARGS has ${why}: quote it as for a POSIX shell`);
  const words: string[] = [];
  let word: string | undefined;
  for (let i = 0; i < s.length; i++) {
    const c = s.charAt(i);
    if (c === "'") {
      const end = s.indexOf("'", i + 1);
      if (end < 0) throw bad("an unclosed quote");
      word = (word ?? "") + s.slice(i + 1, end);
      i = end;
    } else if (c === '"') {
      word ??= "";
      for (i++; s.charAt(i) !== '"'; i++) {
        if (i >= s.length) throw bad("an unclosed quote");
        if (s.charAt(i) === "\\" && i + 1 < s.length && '"\\$`'.includes(s.charAt(i + 1))) i++;
        word += s.charAt(i);
      }
    } else if (c === "\\") {
      if (i + 1 >= s.length) throw bad("a backslash at its end");
      word = (word ?? "") + s.charAt(++i);
    } else if (/\s/.test(c)) {
      if (word !== undefined) words.push(word);
      word = undefined;
    } else {
      word = (word ?? "") + c;
    }
  }
  if (word !== undefined) words.push(word);
  return words;
}

/**
 * The PostgreSQL major of a `pgfork serve` the glue starts: $PGFORK_PG
 * (the environment wins, so a CI matrix can override a project's pin), else
 * the option pg (e.g. pgforkSetup({ pg: 17 })); "" when neither is set:
 * serve's default, the newest PostgreSQL installed on the system. A
 * PgforkError for anything but a major number.
 */
export function pgMajor(pg?: number | string, env: NodeJS.ProcessEnv = process.env): string {
  const v = String(env.PGFORK_PG || (pg ?? "")).trim();
  if (v && !/^[1-9][0-9]?$/.test(v)) {
    throw new PgforkError(`pgfork: PGFORK_PG (the pg option) = ${JSON.stringify(v)} is not a PostgreSQL major version: give one such as 17`);
  }
  return v;
}

/** The major of a PostgreSQL version such as "17.11" ("" when unknown). */
function majorOf(version: string | undefined): string {
  return /^(\d+)/.exec(version ?? "")?.[1] ?? "";
}

/** What `pgfork serve` records of itself in <state>/locks/serve.owner. */
export interface ServeOwner {
  pid: number;
  /** The pid's start time (clock ticks since boot): with pid, one process. */
  start: number;
  uid: number;
  /** The address it listens on. */
  listen: string;
}

/** http://ADDRESS a serve listens on (an unspecified host as 127.0.0.1). */
function ownerUrl(o: ServeOwner): string {
  const i = o.listen.lastIndexOf(":");
  const host = o.listen.slice(0, i);
  return ["", "0.0.0.0", "[::]"].includes(host) ? `http://127.0.0.1:${o.listen.slice(i + 1)}` : `http://${o.listen}`;
}

/** The start time of process pid (field 22 of /proc/PID/stat), 0 when unknown (outside Linux). */
function startTime(pid: number): number {
  const stat = readText(`/proc/${pid}/stat`);
  const v = Number(stat.slice(stat.lastIndexOf(")") + 1).trim().split(/\s+/)[19]);
  return Number.isSafeInteger(v) ? v : 0;
}

/**
 * Whether process pid holds the flock on path, as /proc/locks lists it
 * (Node has no flock: this reads who holds it, which also names the holder).
 */
function lockHeldBy(path: string, pid: number): boolean {
  let st;
  try {
    st = statSync(path, { bigint: true });
  } catch {
    return false;
  }
  // glibc's dev_t: major and minor as the kernel prints them, in hex.
  const major = ((st.dev >> 8n) & 0xfffn) | ((st.dev >> 32n) & ~0xfffn);
  const minor = (st.dev & 0xffn) | ((st.dev >> 12n) & ~0xffn);
  const want = `${major.toString(16).padStart(2, "0")}:${minor.toString(16).padStart(2, "0")}:${st.ino}`;
  return readText("/proc/locks")
    .split("\n")
    .some((line) => {
      const f = line.trim().split(/\s+/);
      return f[1] === "FLOCK" && f[3] === "WRITE" && Number(f[4]) === pid && f[5] === want;
    });
}

/**
 * The `pgfork serve` that holds the state directory stateDir, proven as
 * pgfork's servelock.Find proves it (docs/SECURITY.md, rule 3): its record
 * names a pid that runs as this user (the owner of /proc/PID) with the
 * recorded start time, and that pid holds the state directory's lock.
 * undefined for anything else: no record, a serve killed with -9 (its record
 * stays), a pid another process or user holds now; and outside Linux, where
 * nothing can be proven.
 */
export function serveOwner(stateDir: string): ServeOwner | undefined {
  let o: ServeOwner;
  try {
    o = JSON.parse(readFileSync(join(stateDir, "locks", "serve.owner"), "utf8").slice(0, 4096)) as ServeOwner;
  } catch {
    return undefined;
  }
  if (!Number.isSafeInteger(o.pid) || o.pid < 1 || !o.start || typeof o.listen !== "string" || !o.listen || o.uid !== process.geteuid?.()) return undefined;
  try {
    // The user first, then the start time: the same process both times.
    if (statSync(`/proc/${o.pid}`).uid !== o.uid) return undefined;
  } catch {
    return undefined;
  }
  if (startTime(o.pid) !== o.start) return undefined;
  return lockHeldBy(join(stateDir, "locks", "serve.lock"), o.pid) ? o : undefined;
}

/** What the glue records about the server it started (js-serve.json in the state directory). */
interface ServeRecord {
  /** The test run's main process: the server stops when it exits. */
  runner: number;
  /** The process that stops the server on SIGTERM: the watchdog that started it, or serve itself. */
  watchdog: number;
  url: string;
  token: string;
  /** The serve's pid and start time (its ServeOwner): the record counts only while serveOwner proves them. */
  pid: number;
  start: number;
  /** The PostgreSQL it runs, as its --json line says (e.g. "17.11"). */
  pgVersion?: string;
}

/** A `pgfork serve` this package started. */
export interface StartedServe {
  url: string;
  token: string;
  stateDir: string;
  /** The pid whose SIGTERM stops the server: the watchdog that started it, or serve itself when the run's main process started it. */
  watchdog: number;
  /** True if this process started it (and so stops it). */
  owner: boolean;
  /** The PostgreSQL it runs (e.g. "17.11"), when known: serve says it when it starts. */
  pgVersion?: string;
}

// Runs in its own process group between the test run and serve: it stops
// serve (SIGTERM) when the run's main process is gone, even when that one was
// killed, and exits with serve. serve's --exit-with-parent, when it has it,
// also stops serve if the watchdog itself is killed.
const WATCHDOG = `
const { spawn } = require("node:child_process");
const fs = require("node:fs");
const [runner, bin, outFile, logFile, ...args] = process.argv.slice(1);
const child = spawn(bin, args, { stdio: ["ignore", fs.openSync(outFile, "w"), fs.openSync(logFile, "w")] });
child.on("error", (e) => { fs.appendFileSync(logFile, "cannot run " + bin + ": " + e.message + "\\n"); process.exit(127); });
child.on("exit", (code, sig) => process.exit(code ?? (sig ? 128 : 1)));
let stopping = false;
const stop = () => { if (!stopping) { stopping = true; child.kill("SIGTERM"); } };
process.on("SIGTERM", stop);
process.on("SIGINT", stop);
process.on("SIGHUP", stop);
setInterval(() => { try { process.kill(Number(runner), 0); } catch { stop(); } }, 200);
`;

const sleep = (ms: number): Promise<void> => new Promise((r) => setTimeout(r, ms));

function alive(pid: number): boolean {
  try {
    process.kill(pid, 0);
    return true;
  } catch (e) {
    return (e as NodeJS.ErrnoException).code === "EPERM";
  }
}

/** The listen address in serve's --json output (one line, or a whole object), or undefined while incomplete. */
export function listenFromJson(out: string): string | undefined {
  return serveLine(out)?.listen;
}

/** serve's --json line (one line, or a whole object): where it listens and the PostgreSQL it runs; undefined while incomplete. */
function serveLine(out: string): { listen: string; pgVersion?: string } | undefined {
  const first = out.split("\n", 1)[0] ?? "";
  for (const text of [first, out]) {
    try {
      const v = JSON.parse(text) as { listen?: unknown; pg_version?: unknown };
      if (typeof v.listen === "string") return { listen: v.listen, ...(typeof v.pg_version === "string" ? { pgVersion: v.pg_version } : {}) };
    } catch {
      // not (yet) a whole JSON object
    }
  }
  return undefined;
}

function readText(p: string): string {
  try {
    return readFileSync(p, "utf8");
  } catch {
    return "";
  }
}

/** Runs fn holding the lock directory lock (mkdir is atomic); a lock whose holder died is taken over. */
async function withLock<T>(lock: string, timeoutMs: number, fn: () => Promise<T>): Promise<T> {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    try {
      mkdirSync(lock);
      writeFileSync(join(lock, "pid"), String(process.pid));
      break;
    } catch (e) {
      if ((e as NodeJS.ErrnoException).code !== "EEXIST") throw e;
      const holder = Number(readText(join(lock, "pid")));
      if (holder && !alive(holder)) {
        rmSync(lock, { recursive: true, force: true });
        continue;
      }
      if (Date.now() > deadline) throw new PgforkError(`pgfork: ${lock} is held by process ${holder || "?"} for more than ${timeoutMs / 1000} s: remove it if that process is gone`);
      await sleep(50);
    }
  }
  try {
    return await fn();
  } finally {
    rmSync(lock, { recursive: true, force: true });
  }
}

function supportsExitWithParent(bin: string): boolean {
  const r = spawnSync(bin, ["serve", "--help"], { encoding: "utf8", timeout: 10_000 });
  return `${r.stdout}${r.stderr}`.includes("--exit-with-parent");
}

const STATE = Symbol.for("pgfork.startedServe");
type Global = typeof globalThis & { [STATE]?: { serve: StartedServe; child: ChildProcess } };

/**
 * Starts `pgfork serve` on a free loopback port with a random token and the
 * state directory stateDir, and the arguments extra (serveArgs), through a
 * watchdog that stops it when process runner exits; resolves once it answers.
 */
async function startServe(bin: string, stateDir: string, runner: number, extra: string[]): Promise<{ serve: StartedServe; child: ChildProcess }> {
  const token = randomBytes(18).toString("base64url");
  const out = join(stateDir, "js-serve.out");
  const log = join(stateDir, "js-serve.log");
  // The token goes in the environment, never on a command line: every local
  // user reads /proc/PID/cmdline (docs/SECURITY.md, rule 2).
  const args = ["serve", "--listen", "127.0.0.1:0", "--json", "--state-dir", stateDir, ...extra];
  const env = { ...process.env, PGFORK_TOKEN: token };
  const followsParent = supportsExitWithParent(bin);
  if (followsParent) args.push("--exit-with-parent");
  rmSync(out, { force: true });
  // The run's main process starts serve itself when serve follows its
  // parent: no watchdog (a node process that starts in 70-100 ms before
  // serve does). Another process of the run, or a serve without
  // --exit-with-parent, goes through the watchdog, which follows runner.
  let child: ChildProcess;
  if (followsParent && runner === process.pid) {
    const fds = [openSync(out, "w"), openSync(log, "w")];
    try {
      child = spawn(bin, args, { detached: true, env, stdio: ["ignore", fds[0], fds[1]] });
    } finally {
      fds.forEach((fd) => closeSync(fd));
    }
  } else {
    // The watchdog passes its environment, PGFORK_TOKEN with it, on to serve.
    child = spawn(process.execPath, ["-e", WATCHDOG, String(runner), bin, out, log, ...args], { detached: true, env, stdio: "ignore" });
  }
  child.unref();
  let exited: string | undefined;
  child.on("exit", (code, sig) => (exited = sig ?? `exit ${code}`));
  child.on("error", (e) => (exited = e.message));
  const shown = `${bin} ${args.join(" ")}`;
  const deadline = Date.now() + SERVE_START_TIMEOUT_MS;
  for (;;) {
    const line = serveLine(readText(out));
    if (line) {
      const url = `http://${line.listen}`;
      if (await new Client(url, { token }).healthy(5000)) {
        return { serve: { url, token, stateDir, watchdog: child.pid ?? 0, owner: runner === process.pid, pgVersion: line.pgVersion }, child };
      }
    }
    if (exited !== undefined) {
      throw new PgforkError(`pgfork: \`${shown}\` exited (${exited}) before it answered; its output (${log}):\n${readText(log).slice(-2000).trimEnd()}`);
    }
    if (Date.now() > deadline) {
      if (child.pid) stopPid(child.pid);
      throw new PgforkError(`pgfork: \`${shown}\` did not answer within ${SERVE_START_TIMEOUT_MS / 1000} s; its output (${log}):\n${readText(log).slice(-2000).trimEnd()}`);
    }
    await sleep(10);
  }
}

function stopPid(pid: number): void {
  try {
    process.kill(pid, "SIGTERM");
  } catch {
    // gone already
  }
}

/**
 * Makes sure a server answers for this test run. Does nothing when
 * PGFORK_URL or INTEGRESQL_CLIENT_BASE_URL is set, as the Go and Python
 * clients. Otherwise the run's `pgfork serve`: the one holding the state
 * directory (serveStateDir) when serveOwner proves it (this run's, with the
 * token recorded in js-serve.json; or one you started, with PGFORK_TOKEN),
 * else one started now (found by findPgfork), once per run: runner is the
 * run's main process (default this one), and the processes of one run share
 * the server through a lock and that record. Nothing is used because it
 * answers on a port (docs/SECURITY.md, rule 3): not the default URL, not a
 * port an old record names. The server stops when runner exits (or
 * stopServe is called). Sets PGFORK_URL and PGFORK_TOKEN in process.env,
 * which worker processes inherit.
 *
 * The PostgreSQL major is the project's (pgMajor: $PGFORK_PG, else pg): a
 * server started here gets `--pg N` (serve installs a missing major); one
 * started here before with another major is stopped first, and a running
 * serve of the state directory with another major (or one whose major this
 * glue did not record) is not used: a PgforkError says how to go on.
 */
export async function ensureServe(opts: { runner?: number; env?: NodeJS.ProcessEnv; pg?: number | string } = {}): Promise<StartedServe | undefined> {
  const env = opts.env ?? process.env;
  const g = globalThis as Global;
  // PGFORK_URL set by an earlier call here names the server started here: look at it again.
  const startedHere = g[STATE] !== undefined && env.PGFORK_URL === g[STATE].serve.url;
  if (!startedHere && envSettings(env).from !== "default") return undefined;
  const want = pgMajor(opts.pg, env);
  if (g[STATE]) {
    // Started here before: reuse it while its process runs (then the port is still its own) and it answers,
    // unless it runs another major than asked (then it goes: one serve holds a state directory).
    const { serve: s, child } = g[STATE];
    if (want && majorOf(s.pgVersion) !== want) await stopServe(30_000, env);
    else if (child.exitCode === null && child.signalCode === null && (await new Client(s.url, { token: s.token }).healthy(2000))) return exportServe(s, env);
  }
  const bin = findPgfork({ env });
  const extra = serveArgs(env);
  const runner = opts.runner ?? process.pid;
  const dir = privateStateDir(serveStateDir(env));
  // The managed PostgreSQL runs as an unprivileged user when we are root.
  if (process.getuid?.() === 0) chmodSync(dir, 0o755);
  const recordFile = join(dir, "js-serve.json");
  const started = await withLock(join(dir, "js-serve.lock"), SERVE_START_TIMEOUT_MS + 10_000, async () => {
    const o = serveOwner(dir);
    if (o) {
      let r: ServeRecord | undefined;
      try {
        r = JSON.parse(readText(recordFile)) as ServeRecord;
      } catch {
        // no record (or a broken one): a serve of yours
      }
      const url = ownerUrl(o);
      const ours = r?.pid === o.pid && r.start === o.start;
      if (want && !(ours && majorOf(r?.pgVersion) === want)) {
        const runs = ours && r?.pgVersion ? `runs PostgreSQL ${r.pgVersion}` : "was not started by this glue, so its PostgreSQL major is not known";
        throw new PgforkError(
          `pgfork: the pgfork serve holding the state directory ${dir} (pid ${o.pid}) ${runs}, and PGFORK_PG (the pg option) asks for ${want}: ` +
            `let the test run that started it end (its serve stops with it), or stop it (kill ${o.pid}); or give this run a state directory of its own (PGFORK_STATE_DIR); ` +
            "or set PGFORK_URL to use that server as it is",
        );
      }
      if (r && ours) {
        if (r.runner !== runner) {
          throw new PgforkError(`pgfork: another test run's pgfork serve (pid ${o.pid}, ${url}) uses the state directory ${dir}: wait for that run to end, or give this one PGFORK_STATE_DIR of its own`);
        }
        return { serve: { url, token: r.token, stateDir: dir, watchdog: r.watchdog, owner: false, pgVersion: r.pgVersion }, child: undefined };
      }
      const token = env.PGFORK_TOKEN ?? "";
      if (!(await new Client(url, { token: token || undefined }).healthy(5000))) {
        throw new PgforkError(`pgfork: the pgfork serve holding the state directory ${dir} (pid ${o.pid}) does not answer at ${url}: stop it, or set PGFORK_URL (and PGFORK_TOKEN) to a server to use`);
      }
      return { serve: { url, token, stateDir: dir, watchdog: o.pid, owner: false }, child: undefined };
    }
    const s = await startServe(bin, dir, runner, [...(want ? ["--pg", want] : []), ...extra]);
    const own = serveOwner(dir);
    const record: ServeRecord = {
      runner,
      watchdog: s.serve.watchdog,
      url: s.serve.url,
      token: s.serve.token,
      pid: own?.pid ?? 0,
      start: own?.start ?? 0,
      ...(s.serve.pgVersion ? { pgVersion: s.serve.pgVersion } : {}),
    };
    writeFileSync(recordFile, JSON.stringify(record) + "\n", { mode: 0o600 });
    return s;
  });
  if (started.child && started.serve.owner) {
    g[STATE] = { serve: started.serve, child: started.child };
    // Also when the run ends without its teardown (the watchdog would notice, a little later).
    process.once("exit", () => stopPid(started.serve.watchdog));
  }
  return exportServe(started.serve, env);
}

function exportServe(s: StartedServe, env: NodeJS.ProcessEnv): StartedServe {
  env.PGFORK_URL = s.url;
  env.PGFORK_TOKEN = s.token;
  return s;
}

/**
 * Stops the server ensureServe started in this process, if any, and waits
 * (up to timeoutMs) until it has exited; forgets PGFORK_URL/PGFORK_TOKEN it set.
 */
export async function stopServe(timeoutMs = 30_000, env: NodeJS.ProcessEnv = process.env): Promise<void> {
  const g = globalThis as Global;
  const st = g[STATE];
  if (!st) return;
  Reflect.deleteProperty(g, STATE);
  if (env.PGFORK_URL === st.serve.url) {
    Reflect.deleteProperty(env, "PGFORK_URL");
    Reflect.deleteProperty(env, "PGFORK_TOKEN");
  }
  const pid = st.serve.watchdog;
  if (!alive(pid)) return;
  const gone = new Promise<void>((r) => st.child.once("exit", () => r()));
  stopPid(pid);
  const deadline = Date.now() + timeoutMs;
  while (alive(pid) && Date.now() < deadline) await Promise.race([gone, sleep(50)]);
  if (alive(pid)) {
    throw new PgforkError(`pgfork: the pgfork serve started for the tests (watchdog pid ${pid}) did not stop within ${timeoutMs / 1000} s of SIGTERM; see ${join(st.serve.stateDir, "js-serve.log")}`);
  }
}
