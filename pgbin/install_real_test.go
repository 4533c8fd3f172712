package pgbin_test

// The test here runs a server from the installed build with internal/pgtest,
// which imports pgbin: it lives in the external test package so that pgtest
// can.

import (
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
	"github.com/pgfork/pgfork/pgbin"
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
	// Without pip (issue 34): the index is the one pip would use, named by
	// PIP_INDEX_URL as a machine without pip would have to.
	inst, err := installWithoutPip(t, ctx, state, major, func(s string) { lines = append(lines, s) })
	if err != nil && errs.KindOf(err) == errs.Internal && strings.Contains(err.Error(), "cannot reach the package index") {
		t.Skipf("KNOWN SKIP: the network is down: %v", err)
	}
	if err != nil {
		t.Fatalf("Install(%s): %v (hint: %s)\nprogress:\n%s", major, err, errs.HintOf(err), strings.Join(lines, "\n"))
	}
	t.Logf("installed %+v\nprogress:\n%s", inst, strings.Join(lines, "\n"))
	if !strings.Contains(strings.Join(lines, "\n"), "downloading PostgreSQL "+major+".") {
		t.Errorf("no progress line names the download: %q", lines)
	}
	if inst.Source != pgbin.SourceManaged || fmt.Sprint(inst.Major) != major || inst.BinDir != filepath.Join(state, "installs", inst.Version, "bin") {
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
	if got, err := pgbin.Find(pgbin.Options{StateDir: state}, inst.Major); err != nil || pgbin.RealDir(got.BinDir) != pgbin.RealDir(inst.BinDir) {
		t.Errorf("Find(%d) = %+v, %v", inst.Major, got, err)
	}

	// A second install of the same major or exact version is a no-op.
	for _, spec := range []string{major, inst.Version} {
		lines = nil
		again, err := pgbin.Install(ctx, state, spec, func(s string) { lines = append(lines, s) })
		if err != nil || again.BinDir != inst.BinDir {
			t.Errorf("second Install(%s) = %+v, %v", spec, again, err)
		}
		if len(lines) != 1 || !strings.Contains(lines[0], "already installed") {
			t.Errorf("second Install(%s) should only say it is already installed, said %q", spec, lines)
		}
	}

	// A version that does not exist is a clear not-found error.
	if _, err := pgbin.Install(ctx, state, major+".99", nil); errs.KindOf(err) != errs.NotFound || errs.HintOf(err) == "" {
		t.Errorf("Install(%s.99): want not-found with a hint, got %v", major, err)
	}
	ents, _ = os.ReadDir(filepath.Join(state, "installs"))
	if len(ents) != 1 {
		t.Errorf("a failed install left %v in installs/", ents)
	}

	runServer(t, ctx, inst)
}

// installWithoutPip runs pgbin.Install with neither pip nor python on PATH
// and PIP_INDEX_URL set to the index pip itself uses here (asked of pip:
// pgfork names no index).
func installWithoutPip(t *testing.T, ctx context.Context, state, spec string, progress func(string)) (pgbin.Installation, error) {
	t.Helper()
	index := os.Getenv("PIP_INDEX_URL")
	if index == "" {
		out, err := exec.Command("python3", "-c", "from pip._internal.models.index import PyPI; print(PyPI.simple_url)").Output()
		if err != nil {
			t.Fatalf("asking pip for its index (set PIP_INDEX_URL to run this test without pip): %v", err)
		}
		index = strings.TrimSpace(string(out))
	}
	t.Setenv("PIP_INDEX_URL", index)
	t.Setenv(pgbin.EnvPip, "")
	path := os.Getenv("PATH")
	empty := t.TempDir()
	if err := os.Setenv("PATH", empty); err != nil {
		t.Fatal(err)
	}
	defer os.Setenv("PATH", path)
	return pgbin.Install(ctx, state, spec, progress)
}

// runServer runs initdb and postgres from inst (as the postgres OS user when
// root), and uses contrib extensions through the build's own psql.
func runServer(t *testing.T, ctx context.Context, inst pgbin.Installation) {
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
