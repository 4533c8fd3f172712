package client

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// hashFixture builds a migrations tree that exercises every rule of
// TemplateHash: nested files, dot names, a symlink to a file, a symlinked
// subdirectory (not followed by either client), a dangling symlink (left
// out), non-ASCII names. It returns the real directory and a symlink to it.
func hashFixture(t *testing.T) (real, link string) {
	t.Helper()
	base := t.TempDir()
	real = filepath.Join(base, "real")
	write := func(rel, data string) {
		p := filepath.Join(real, filepath.FromSlash(rel))
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(data), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("001_schema.sql", "CREATE TABLE t (id int);\n")
	write("002_seed.sql", "INSERT INTO t VALUES (1);\n")
	write("nested/deeper/003_more.sql", "SELECT 1;\n")
	write("nested/Zé.sql", "-- utf-8 name\n")
	write("nested/a.sql", "-- sorts after Z\n")
	write(".hidden", "ignored")
	write("nested/.git/HEAD", "ignored")
	outside := filepath.Join(base, "outside")
	if err := os.MkdirAll(outside, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(outside, "shared.sql"), []byte("-- shared\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, l := range [][2]string{
		{filepath.Join(outside, "shared.sql"), filepath.Join(real, "004_shared.sql")}, // hashed, content of the target
		{outside, filepath.Join(real, "linked_dir")},                                  // not followed
		{filepath.Join(base, "nowhere"), filepath.Join(real, "dangling.sql")},         // left out
	} {
		if err := os.Symlink(l[0], l[1]); err != nil {
			t.Fatal(err)
		}
	}
	link = filepath.Join(base, "migrations")
	if err := os.Symlink(real, link); err != nil {
		t.Fatal(err)
	}
	return real, link
}

// TestTemplateHashSymlinkedRoot: a MigrationsDir that is a symlink to the
// real directory hashes like the real directory (it used to hash as empty,
// so edits never rebuilt the template), and an edit changes it.
func TestTemplateHashSymlinkedRoot(t *testing.T) {
	real, link := hashFixture(t)
	want, err := TemplateHash(real, "k")
	if err != nil {
		t.Fatal(err)
	}
	got, err := TemplateHash(link, "k")
	if err != nil {
		t.Fatal(err)
	}
	if got != want {
		t.Fatalf("TemplateHash(symlink) = %s, TemplateHash(real dir) = %s: want equal", got, want)
	}
	empty, _ := TemplateHash(t.TempDir(), "k")
	if got == empty {
		t.Fatal("TemplateHash(symlink) equals the hash of an empty directory")
	}
	if err := os.WriteFile(filepath.Join(real, "nested", "a.sql"), []byte("-- edited\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if edited, _ := TemplateHash(link, "k"); edited == got {
		t.Fatal("editing a file under the symlinked root did not change the hash")
	}
}

// TestTemplateHashSameAsPython runs the Python client's hashing module on
// the same directories (real, through a symlinked root, and with a non-ASCII
// extra key) and requires the same hashes, so both clients share templates.
func TestTemplateHashSameAsPython(t *testing.T) {
	py, err := exec.LookPath("python3")
	if err != nil {
		t.Fatal("python3 is needed to compare with the Python client's hash (clients/python): not found on PATH")
	}
	src, err := filepath.Abs(filepath.Join("..", "..", "python", "src", "pgfork", "hashing.py"))
	if err != nil {
		t.Fatal(err)
	}
	real, link := hashFixture(t)
	const script = `
import importlib.util, sys
spec = importlib.util.spec_from_file_location("pgfork_hashing", sys.argv[1])
m = importlib.util.module_from_spec(spec)
spec.loader.exec_module(m)
for d in sys.argv[3:]:
    print(m.template_hash(d or None, sys.argv[2]))
`
	for _, key := range []string{"", "k", "clé-v2"} {
		dirs := []string{real, link, filepath.Join(real, "nested"), ""}
		out, err := exec.Command(py, append([]string{"-c", script, src, key}, dirs...)...).Output()
		if err != nil {
			if ee, ok := err.(*exec.ExitError); ok {
				t.Fatalf("python3: %v\n%s", err, ee.Stderr)
			}
			t.Fatalf("python3: %v", err)
		}
		pyHashes := strings.Fields(string(out))
		if len(pyHashes) != len(dirs) {
			t.Fatalf("python3 printed %q, want %d hashes", out, len(dirs))
		}
		for i, d := range dirs {
			goHash, err := TemplateHash(d, key)
			if err != nil {
				t.Fatal(err)
			}
			if goHash != pyHashes[i] {
				t.Errorf("dir %q key %q: Go %s, Python %s", d, key, goHash, pyHashes[i])
			}
		}
	}
}

// TestTemplateHashFS: hashing an fs.FS (as adapters do for embedded
// migrations) gives the same hash as hashing the directory.
func TestTemplateHashFS(t *testing.T) {
	real, _ := hashFixture(t)
	want, err := TemplateHash(real, "k")
	if err != nil {
		t.Fatal(err)
	}
	got, err := TemplateHashFS(os.DirFS(real), "k")
	if err != nil {
		t.Fatal(err)
	}
	if got != want {
		t.Fatalf("TemplateHashFS = %s, TemplateHash = %s", got, want)
	}
	none, _ := TemplateHashFS(nil, "k")
	emptyDir, _ := TemplateHash("", "k")
	if none != emptyDir {
		t.Fatalf("nil FS %s, no dir %s: want equal", none, emptyDir)
	}
}
