// The client against a live `pgfork serve`: the v2 lifecycle, error classes,
// token, timeouts and AbortSignal, retries on 503, v1 and the fallback to it.
import { test } from "node:test";
import assert from "node:assert/strict";
import http from "node:http";
import { randomBytes } from "node:crypto";
import util from "node:util";
import pg from "pg";
import {
  ApiError,
  ApiVersionUnsupported,
  BadRequest,
  Client,
  PgforkError,
  RequestAborted,
  ServerUnreachable,
  ServiceUnavailable,
  TemplateAlreadyInitialized,
  TemplateDiscarded,
  TemplateNotFound,
  TestDatabaseNotFound,
  Unauthorized,
  clientFromEnv,
  databaseUrl,
  maskBaseUrl,
  maskPassword,
} from "pgfork";
import { liveClient, server, uniqueHash } from "./helpers.mjs";

async function sql(url, q) {
  const c = new pg.Client({ connectionString: url });
  await c.connect();
  try {
    return (await c.query(q)).rows;
  } finally {
    await c.end();
  }
}

async function listen(handler) {
  const srv = http.createServer(handler);
  await new Promise((r) => srv.listen(0, "127.0.0.1", r));
  return { srv, url: `http://127.0.0.1:${srv.address().port}` };
}

async function freePortUrl() {
  const { srv, url } = await listen(() => {});
  await new Promise((r) => srv.close(r));
  return url;
}

test("v2 lifecycle: initialize, migrate, finalize, get, recreate, unlock, discard", async () => {
  const c = liveClient();
  const hash = uniqueHash("life");
  const tpl = await c.initializeTemplate(hash);
  assert.equal(tpl.templateHash, hash);
  await sql(tpl.url, "CREATE TABLE t (id int); INSERT INTO t VALUES (42)");
  await assert.rejects(c.initializeTemplate(hash), (e) => e instanceof TemplateAlreadyInitialized && e instanceof ApiError && e.status === 423);
  await c.finalizeTemplate(hash);
  const db = await c.getTestDatabase(hash);
  assert.match(db.token, /^[0-9a-f]{32}$/);
  assert.equal(typeof db.id, "number");
  assert.deepEqual(await sql(db.url, "SELECT id FROM t"), [{ id: 42 }]);
  await c.recreate(db);
  await assert.rejects(c.recreate(db), (e) => e instanceof TestDatabaseNotFound && e.status === 404);
  const db2 = await c.getTestDatabase(hash);
  await c.unlock(db2);
  await assert.rejects(c.unlock(db2), TestDatabaseNotFound);
  const list = await c.listTemplates();
  assert.ok(list.templates.some((t) => t.templateHash === hash));
  await c.discardTemplate(hash);
  await assert.rejects(c.getTestDatabase(hash), (e) => e instanceof TemplateDiscarded && e.status === 410);
  await assert.rejects(c.finalizeTemplate(uniqueHash("nope")), TemplateNotFound);
  await assert.rejects(c.initializeTemplate("bad\u0001hash"), BadRequest);
});

test("wrong token is Unauthorized", async () => {
  const s = server();
  if (!s.token) throw new Error("PGFORK_TOKEN is not set: these tests expect a server started with a token (PGFORK_TOKEN)");
  const c = new Client(s.url, { token: "wrong" });
  await assert.rejects(c.initializeTemplate(uniqueHash("tok")), (e) => e instanceof Unauthorized && e.status === 401);
  // The token as the first path segment, as IntegreSQL's clients send it.
  const inPath = new Client(`${s.url.replace(/\/+$/, "").replace(/\/api$/, "")}/${s.token}/api`);
  const hash = uniqueHash("tokpath");
  await inPath.initializeTemplate(hash);
  await inPath.discardTemplate(hash);
});

test("unreachable server names the URL and says to start pgfork serve", async () => {
  const url = await freePortUrl();
  const c = new Client(url);
  await assert.rejects(c.getTestDatabase("x"), (e) => {
    assert.ok(e instanceof ServerUnreachable && e instanceof PgforkError, String(e));
    assert.ok(e.message.includes(url), e.message);
    assert.match(e.message, /pgfork serve/);
    return true;
  });
  assert.equal(await c.reachable(), false);
});

test("timeouts and AbortSignal end a request that gets no answer", async (t) => {
  const held = [];
  const { srv, url } = await listen((req, res) => held.push(res)); // never answers
  t.after(() => {
    for (const r of held) r.destroy();
    srv.close();
  });
  const c = new Client(url, { timeoutMs: 200 });
  // The client's own timeout ended it ("within 200 ms"), not the server or
  // the test runner's; how long a loaded machine took to fire it is no verdict.
  await assert.rejects(c.getTestDatabase("x"), (e) => e instanceof RequestAborted && /within 200 ms/.test(e.message));
  const ac = new AbortController();
  const slow = new Client(url, { timeoutMs: 60_000 });
  setTimeout(() => ac.abort(new Error("test is over")), 100);
  await assert.rejects(slow.getTestDatabase("x", { signal: ac.signal }), (e) => e instanceof RequestAborted && /test is over/.test(e.message));
});

test("a 503 (template not finalized in time) is retried with backoff", async () => {
  const hash = uniqueHash("retry");
  const setup = liveClient();
  await setup.initializeTemplate(hash);
  const retries = [];
  // The server waits --finalize-timeout (15 s in clients/test.sh) and answers 503;
  // the hook finalizes the template then, so the retry gets a database.
  const c = liveClient({
    retries: 2,
    backoffMs: 10,
    onRetry: async (info) => {
      retries.push(info);
      await setup.finalizeTemplate(hash);
    },
  });
  const db = await c.getTestDatabase(hash);
  assert.equal(retries.length, 1);
  assert.ok(retries[0].error instanceof ServiceUnavailable, String(retries[0].error));
  assert.equal(retries[0].delayMs, 10);
  await c.recreate(db);
  await setup.discardTemplate(hash);
});

test("v1 (IntegreSQL's API): numeric ids, no token", async () => {
  const s = server();
  const c = liveClient({ apiVersion: 1 });
  assert.equal(c.apiVersion, 1);
  const hash = uniqueHash("v1");
  const tpl = await c.initializeTemplate(hash);
  await sql(tpl.url, "CREATE TABLE v1 (id int)");
  await c.finalizeTemplate(hash);
  const db = await c.getTestDatabase(hash);
  assert.equal(db.token, undefined);
  await sql(db.url, "SELECT * FROM v1");
  await c.recreateTestDatabase(hash, db.id);
  const db2 = await c.getTestDatabase(hash);
  await c.unlock(db2);
  await c.discardTemplate(hash);
  await assert.rejects(c.getTestDatabase(hash), TemplateNotFound); // v1: 404 after a discard
  assert.ok(new Client(`${s.url}/api/v1`).apiVersion === 1);
});

test("a server without /api/v2 makes the client fall back to v1, or say why", async (t) => {
  // A server that knows only IntegreSQL's routes: /api/v2 answers 404 as
  // IntegreSQL does; everything else goes to the live pgfork serve.
  const s = server();
  const upstream = new URL(s.url);
  const { srv, url } = await listen((req, res) => {
    if (req.url.includes("/api/v2")) {
      res.writeHead(404, { "Content-Type": "application/json" });
      res.end('{"message":"Not Found"}');
      return;
    }
    const p = http.request({ host: upstream.hostname, port: upstream.port, path: req.url, method: req.method, headers: req.headers }, (r) => {
      res.writeHead(r.statusCode, r.headers);
      r.pipe(res);
    });
    req.pipe(p);
  });
  t.after(() => srv.close());
  const c = new Client(url, { token: s.token });
  const hash = uniqueHash("fallback");
  await c.initializeTemplate(hash);
  assert.equal(c.apiVersion, 1);
  await c.finalizeTemplate(hash);
  const db = await c.getTestDatabase(hash);
  await c.recreate(db);
  await c.discardTemplate(hash);
  const fixed = new Client(`${url}/api/v2`, { token: s.token });
  await assert.rejects(fixed.initializeTemplate(uniqueHash("fixed")), (e) => e instanceof ApiVersionUnsupported && /no \/api\/v2/.test(e.message));
});

test("environment variables: PGFORK_URL, PGFORK_TOKEN, INTEGRESQL_CLIENT_BASE_URL", () => {
  const a = clientFromEnv({}, { PGFORK_URL: "http://h:1/api", PGFORK_TOKEN: "tk", INTEGRESQL_CLIENT_BASE_URL: "http://other:2/api" });
  assert.equal(a.baseUrl, "http://h:1");
  assert.equal(a.token, "tk");
  assert.equal(a.apiVersion, 2);
  const b = clientFromEnv({}, { INTEGRESQL_CLIENT_BASE_URL: "http://other:2/api" });
  assert.equal(b.baseUrl, "http://other:2");
  assert.equal(b.apiVersion, 1);
  const c = clientFromEnv({}, { INTEGRESQL_CLIENT_BASE_URL: "http://other:2/api/v2/" });
  assert.equal(c.apiVersion, 2);
  const d = clientFromEnv({}, {});
  assert.equal(d.baseUrl, "http://127.0.0.1:5000");
  assert.throws(() => new Client("ftp://x"), PgforkError);
});

test("URLs: databaseUrl encodes, maskPassword hides the password", () => {
  const cfg = { host: "127.0.0.1", port: 5432, username: "u@x", password: "p:w/@d", database: "db", additionalParams: {} };
  const url = databaseUrl(cfg);
  assert.equal(url, "postgres://u%40x:p%3Aw%2F%40d@127.0.0.1:5432/db?sslmode=disable");
  assert.equal(maskPassword(url), "postgres://u%40x:***@127.0.0.1:5432/db?sslmode=disable");
  assert.ok(!maskPassword(url).includes("p%3Aw"));
});

test("a token or password in the base URL never shows in errors or util.inspect (no server needed)", async (t) => {
  const secret = `s3cr3t${randomBytes(8).toString("hex")}`;
  const where = new URL(await freePortUrl()).host;
  const check = (text) => {
    assert.ok(!text.includes(secret), `the secret shows: ${text}`);
    assert.ok(text.includes(where), `the server's address is gone: ${text}`);
  };
  for (const url of [`http://${where}/${secret}/api`, `http://${where}/${secret}`, `http://u:${secret}@${where}/api/v2`]) {
    const c = new Client(url, { token: secret, retries: 0 });
    check(util.inspect(c));
    await assert.rejects(c.initializeTemplate("x"), (e) => {
      assert.ok(e instanceof ServerUnreachable, String(e));
      check(e.message);
      return true;
    });
  }
  const held = [];
  const { srv, url } = await listen((req, res) => held.push(res)); // never answers
  t.after(() => {
    for (const r of held) r.destroy();
    srv.close();
  });
  const slow = new Client(`${url}/${secret}/api`, { timeoutMs: 200, retries: 0 });
  await assert.rejects(slow.getTestDatabase("x"), (e) => {
    assert.ok(e instanceof RequestAborted, String(e));
    assert.ok(!e.message.includes(secret) && e.message.includes(new URL(url).host), e.message);
    return true;
  });
  assert.throws(() => new Client(`ftp://h/${secret}`), (e) => e instanceof PgforkError && !e.message.includes(secret));
  assert.equal(maskBaseUrl(`http://h:5000/${secret}`), "http://h:5000/***");
  assert.equal(maskBaseUrl(`https://u:${secret}@h/x?token=${secret}`), "https://***@h/***?***");
  assert.equal(maskBaseUrl("http://h:5000"), "http://h:5000");
});
