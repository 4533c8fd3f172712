// The template hash: every case of the shared vectors file, and one
// directory hashed by the JS, Go and Python clients with the same result.
import { test } from "node:test";
import assert from "node:assert/strict";
import { execFileSync } from "node:child_process";
import { mkdtempSync, mkdirSync, readFileSync, rmSync, symlinkSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";
import { templateHash, PgforkError } from "pgfork";

const here = dirname(fileURLToPath(import.meta.url));
const clients = join(here, "..", "..");
const vectors = JSON.parse(readFileSync(join(clients, "testdata", "template-hash-vectors.json"), "utf8"));

function write(base, files) {
  for (const [p, content] of Object.entries(files ?? {})) {
    mkdirSync(dirname(join(base, p)), { recursive: true });
    writeFileSync(join(base, p), content, "utf8");
  }
}

test("vectors file has cases", () => {
  assert.equal(vectors.algorithm, "pgfork-template-hash/1");
  assert.ok(vectors.cases.length >= 8);
});

for (const c of vectors.cases) {
  test(`template hash vector ${c.name}`, (t) => {
    const base = mkdtempSync(join(tmpdir(), "pgfork-js-vec-"));
    t.after(() => rmSync(base, { recursive: true, force: true }));
    const tree = join(base, "tree");
    mkdirSync(tree);
    write(tree, c.files);
    write(base, c.outside);
    for (const s of c.symlinks ?? []) symlinkSync(s.target, join(tree, s.path));
    assert.equal(templateHash(c.no_dir ? undefined : tree, c.extra_key), c.hash);
  });
}

test("template hash of a missing directory is an error", () => {
  assert.throws(() => templateHash("/nonexistent/pgfork-js", ""), (e) => e instanceof PgforkError && /is not a directory/.test(e.message));
});

test("Go, Python and JS clients hash the same directory alike", (t) => {
  const base = mkdtempSync(join(tmpdir(), "pgfork-js-3way-"));
  t.after(() => rmSync(base, { recursive: true, force: true }));
  const dir = join(base, "migrations");
  write(dir, {
    "001_init.sql": "CREATE TABLE t (id int);\r\n",
    "002_ünï.sql": "SELECT 'é';\n",
    "sub/003.sql": "",
    ".hidden": "x",
    "Z.sql": "z",
  });
  symlinkSync("001_init.sql", join(dir, "004_link.sql"));
  const key = "three clients ✓";
  const js = templateHash(dir, key);

  const py = execFileSync("python3", ["-c", "import sys; from pgfork.hashing import template_hash; print(template_hash(sys.argv[1], sys.argv[2]))", dir, key], {
    env: { ...process.env, PYTHONPATH: join(clients, "python", "src") },
    encoding: "utf8",
  }).trim();

  // A throwaway main package laid over the Go client's module (nothing written in the tree).
  const main = join(base, "main.go");
  writeFileSync(
    main,
    'package main\n\nimport (\n\t"fmt"\n\t"os"\n\n\t"github.com/pgfork/pgfork/clients/go/client"\n)\n\nfunc main() {\n\th, err := client.TemplateHash(os.Args[1], os.Args[2])\n\tif err != nil {\n\t\tpanic(err)\n\t}\n\tfmt.Println(h)\n}\n',
  );
  const goDir = join(clients, "go");
  const overlay = join(base, "overlay.json");
  writeFileSync(overlay, JSON.stringify({ Replace: { [join(goDir, "internal", "jshashcheck", "main.go")]: main } }));
  const go = execFileSync("go", ["run", "-overlay", overlay, "./internal/jshashcheck", dir, key], { cwd: goDir, encoding: "utf8" }).trim();

  assert.match(js, /^[0-9a-f]{32}$/);
  assert.equal(py, js, "Python and JS differ");
  assert.equal(go, js, "Go and JS differ");
});
