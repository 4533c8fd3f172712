package pgclone_test

import (
	"bytes"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"

	"github.com/pgfork/pgfork/instance"
	"github.com/pgfork/pgfork/internal/pgtest"
)

// pgEnv is one PostgreSQL build under test; the methods below start
// clusters with it.
type pgEnv struct{ pgtest.Build }

// forEachPG runs f once per PostgreSQL build under test.
func forEachPG(t *testing.T, f func(t *testing.T, e pgEnv)) {
	t.Helper()
	pgtest.ForEachBuild(t, 0, func(t *testing.T, b pgtest.Build) { f(t, pgEnv{b}) })
}

// forEachPGOnFS runs f once per PostgreSQL build under test, on ext4 or
// XFS so that both filesystems run (pgtest.ForEachBuildOnFS): what the
// major changes (the backup functions, the control file) does not depend
// on the filesystem, and what the filesystem changes (the copy method)
// does not depend on the major.
func forEachPGOnFS(t *testing.T, f func(t *testing.T, e pgEnv, base string)) {
	t.Helper()
	pgtest.ForEachBuildOnFS(t, 0, func(t *testing.T, b pgtest.Build, base string) { f(t, pgEnv{b}, base) })
}

// newCluster runs initdb in base/name.
func (e pgEnv) newCluster(t *testing.T, base, name string) string {
	t.Helper()
	data := filepath.Join(base, name)
	pgtest.InitDB(t, data, e.Server())
	return data
}

// start starts a server on data and stops it (fast) when the test ends.
func (e pgEnv) start(t *testing.T, data string, settings map[string]string) *instance.Instance {
	t.Helper()
	return pgtest.Start(t, data, pgtest.Server{BinDir: e.Bin, Env: e.Inst.Env(), Settings: settings, LogFile: data + ".server.log"})
}

// load is a program (pgbench) writing to a source in the background while
// a test copies it.
type load struct {
	what string
	cmd  *exec.Cmd
	out  bytes.Buffer
	done chan struct{}
	err  error
}

// startLoad starts cmd with its output kept; what names it in failures
// ("pgbench on the source"). It is killed when the test ends if it still
// runs.
func startLoad(t *testing.T, what string, cmd *exec.Cmd) *load {
	t.Helper()
	l := &load{what: what, cmd: cmd, done: make(chan struct{})}
	cmd.Stdout, cmd.Stderr = &l.out, &l.out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { l.err = cmd.Wait(); close(l.done) }()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		<-l.done
	})
	return l
}

// checkRunning fails the test now if the program has already ended; why
// says what that means ("the copy was not taken under load").
func (l *load) checkRunning(t *testing.T, why string) {
	t.Helper()
	select {
	case <-l.done:
		t.Fatalf("%s ended too early (%v): %s\n%s", l.what, l.err, why, l.out.String())
	default:
	}
}

// stop ends the program now, its load no longer needed, and fails the
// test if it had already failed on its own.
func (l *load) stop(t *testing.T) {
	t.Helper()
	select {
	case <-l.done:
		l.wait(t)
		return
	default:
	}
	_ = l.cmd.Process.Kill()
	<-l.done
}

// wait waits for the program to end and fails the test if it failed.
func (l *load) wait(t *testing.T) {
	t.Helper()
	<-l.done
	if l.err != nil {
		t.Errorf("%s failed: %v\n%s", l.what, l.err, l.out.String())
	}
}

// leftovers lists the hidden staging entries beside dst.
func leftovers(t *testing.T, dst string) []string {
	t.Helper()
	m, _ := filepath.Glob(filepath.Join(filepath.Dir(dst), "."+filepath.Base(dst)+"*"))
	return m
}

// ownedBy checks that everything under dir belongs to u (when root).
func ownedBy(t *testing.T, dir string, u *instance.OSUser) {
	t.Helper()
	if u == nil {
		return
	}
	var bad []string
	_ = filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return nil
		}
		fi, err := os.Lstat(p)
		if err != nil {
			return nil
		}
		if st := fi.Sys().(*syscall.Stat_t); int(st.Uid) != u.UID || int(st.Gid) != u.GID {
			bad = append(bad, p)
		}
		return nil
	})
	if len(bad) > 0 {
		t.Errorf("%d entries of %s are not owned by %s, e.g. %s", len(bad), dir, u.Name, bad[0])
	}
}
