package branches

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/pgfork/pgfork/cluster"
	"github.com/pgfork/pgfork/internal/errs"
	"github.com/pgfork/pgfork/internal/pgtest"
	"github.com/pgfork/pgfork/internal/statedir"
	"github.com/pgfork/pgfork/internal/testenv"
	"github.com/pgfork/pgfork/pgbackup"
	"github.com/pgfork/pgfork/pgbin"
)

// TestBranchesBackupSource: a backup chain declared as a source is
// restored straight into the branch (direct.go): no snapshot directory,
// its snapshot is the backups; the branch has the rows of the backup, not
// those written after it, and its reset restores them again. A reset
// while the backups are gone is refused with the branch still running as
// it was.
func TestBranchesBackupSource(t *testing.T) {
	t.Parallel() // see env
	ctx := context.Background()
	b := pgtest.Builds(t, 0)[0]
	dir := testenv.XFSDir(t)
	src := filepath.Join(dir, "src")
	pgtest.InitDB(t, src, pgtest.Server{BinDir: b.Bin})
	in := pgtest.Start(t, src, pgtest.Server{BinDir: b.Bin})
	pgtest.Exec(t, in.ConnString("", ""), "CREATE TABLE t (id int)", "INSERT INTO t VALUES (1)")
	chain := filepath.Join(dir, "chain")
	if _, err := pgbackup.Take(ctx, pgbackup.TakeOptions{Dir: chain, ConnString: in.ConnString("", ""),
		PGBin: pgbin.Options{Explicit: b.Bin, StateDir: t.TempDir()}}); err != nil {
		t.Fatal(err)
	}
	pgtest.Exec(t, in.ConnString("", ""), "INSERT INTO t VALUES (2)")

	m, err := Open(ctx, Options{Layout: statedir.Layout{Root: filepath.Join(dir, "state")},
		Installation: b.Inst, User: b.User,
		Sources: []Source{{Name: "nightly", Kind: SourceBackup, Chain: chain}}})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	me := Caller{Token: "me"}
	br, err := m.Create(ctx, me, CreateOptions{Name: "restored", Source: "nightly"})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = m.Delete(ctx, me, "restored") }()
	if got := pgtest.Query(t, br.URL(), "SELECT string_agg(id::text, ',') FROM t"); got != "1" {
		t.Errorf("branch of the backup has rows %q, want 1", got)
	}
	m.mu.Lock()
	snap, refs := m.snapOfBranch(m.st.Branches[0]), m.backupsOf(m.st.Branches[0])
	m.mu.Unlock()
	if _, err := os.Lstat(snap); !os.IsNotExist(err) {
		t.Errorf("a branch of backups needing no recovery has a snapshot directory %s (%v): it is restored straight into the branch", snap, err)
	}
	if len(refs) != 1 || refs[0].ManifestChecksum == "" {
		t.Errorf("the branch's snapshot records backups %+v, want the one full backup with its manifest's checksum", refs)
	}
	pgtest.Exec(t, br.URL(), "TRUNCATE t")
	if _, err := m.Reset(ctx, me, "restored"); err != nil {
		t.Fatal(err)
	}
	if got := pgtest.Query(t, br.URL(), "SELECT count(*) FROM t"); got != "1" {
		t.Errorf("after reset the branch has %s rows, want 1", got)
	}

	// The backups gone: the reset is refused before the server stops.
	pgtest.Exec(t, br.URL(), "INSERT INTO t VALUES (3)")
	full, err := pgbackup.Discover(chain, "")
	if err != nil || len(full) != 1 {
		t.Fatalf("backups of the chain: %v %v", full, err)
	}
	if err := os.Rename(full[0], full[0]+".away"); err != nil {
		t.Fatal(err)
	}
	_, err = m.Reset(ctx, me, "restored")
	if !errs.IsNotFound(err) || !strings.Contains(err.Error(), "cannot be reset") {
		t.Errorf("reset with the backups gone: %v, want a not-found error saying the branch cannot be reset", err)
	}
	if got := pgtest.Query(t, br.URL(), "SELECT string_agg(id::text, ',' ORDER BY id) FROM t"); got != "1,3" {
		t.Errorf("after a refused reset the branch has rows %q, want 1,3 as it was", got)
	}
	if err := os.Rename(full[0]+".away", full[0]); err != nil {
		t.Fatal(err)
	}
	if _, err := m.Reset(ctx, me, "restored"); err != nil {
		t.Fatal(err)
	}
	if got := pgtest.Query(t, br.URL(), "SELECT string_agg(id::text, ',') FROM t"); got != "1" {
		t.Errorf("after the backups came back, reset gives rows %q, want 1", got)
	}
}

// TestBranchesBackupSourcePITR: a backup source with a WAL archive and a
// restore point as target: its snapshot is recovered to the restore point
// (rows committed before it, not after) and branches of it start promoted.
// A source of the backups themselves with the archive and no target
// replays all the archive holds.
func TestBranchesBackupSourcePITR(t *testing.T) {
	t.Parallel() // see env
	ctx := context.Background()
	b := pgtest.Builds(t, 0)[0]
	dir := testenv.XFSDir(t)
	chain, arch := pitrChain(t, b, dir)
	backups, err := pgbackup.Discover(chain, "")
	if err != nil {
		t.Fatal(err)
	}
	lay := statedir.Layout{Root: filepath.Join(dir, "state")}
	m, err := Open(ctx, Options{Layout: lay, PGBin: b.Bin, User: b.User,
		Sources: []Source{{Name: "pitr", Kind: SourceBackup, Chain: chain, WALDir: arch, TargetName: "before"},
			{Name: "all", Kind: SourceBackup, Backups: backups, WALDir: arch}}})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	me := Caller{Token: "me"}
	br, err := m.Create(ctx, me, CreateOptions{Name: "at-before", Source: "pitr"})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = m.Delete(ctx, me, "at-before") }()
	if got := pgtest.Query(t, br.URL(), "SELECT string_agg(id::text, ',' ORDER BY id) FROM t"); got != "1,2" {
		t.Errorf("branch at the restore point has rows %q, want 1,2", got)
	}
	if got := pgtest.Query(t, br.URL(), "SELECT pg_is_in_recovery()::text"); got != "false" {
		t.Error("the branch is still in recovery")
	}
	if l, _ := cluster.List(lay); len(l) != 1 {
		t.Errorf("registry: %+v, want only the branch (the recovery server stopped and forgotten)", l)
	}
	all, err := m.Create(ctx, me, CreateOptions{Name: "at-end", Source: "all"})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = m.Delete(ctx, me, "at-end") }()
	if got := pgtest.Query(t, all.URL(), "SELECT string_agg(id::text, ',' ORDER BY id) FROM t"); got != "1,2,3" {
		t.Errorf("branch of the whole archive has rows %q, want 1,2,3", got)
	}
}

// pitrChain is a backup chain of a server (rows 1, 2, then a restore point
// "before", then 3) and the WAL archive that reaches past the restore point.
func pitrChain(t *testing.T, b pgtest.Build, dir string) (chain, arch string) {
	t.Helper()
	ctx := context.Background()
	arch = filepath.Join(dir, "archive")
	if err := b.User.MkdirOwned(arch, 0o755); err != nil {
		t.Fatal(err)
	}
	src := filepath.Join(dir, "src")
	pgtest.InitDB(t, src, pgtest.Server{BinDir: b.Bin})
	in := pgtest.Start(t, src, pgtest.Server{BinDir: b.Bin, Settings: map[string]string{"archive_mode": "on",
		"archive_command": "cp %p " + arch + "/%f", "wal_level": "replica"}})
	url := in.ConnString("", "")
	pgtest.Exec(t, url, "CREATE TABLE t (id int)", "INSERT INTO t VALUES (1)")
	chain = filepath.Join(dir, "chain")
	if _, err := pgbackup.Take(ctx, pgbackup.TakeOptions{Dir: chain, ConnString: url,
		PGBin: pgbin.Options{Explicit: b.Bin, StateDir: t.TempDir()}}); err != nil {
		t.Fatal(err)
	}
	pgtest.Exec(t, url, "INSERT INTO t VALUES (2)", "SELECT pg_create_restore_point('before')", "INSERT INTO t VALUES (3)")
	seg := pgtest.Query(t, url, "SELECT pg_walfile_name(pg_switch_wal())")
	testenv.WaitFor(t, "WAL segment "+seg+" to be archived", func() bool {
		return pgtest.Query(t, url, "SELECT coalesce(last_archived_wal, '') FROM pg_stat_archiver") >= seg
	})
	return chain, arch
}

// TestBranchesPITRKilled: serve killed with SIGKILL while a point-in-time
// snapshot's recovery server runs (a hook at that step); the next Open
// stops that server, forgets it and removes its directory: no postmaster
// and no directory left.
func TestBranchesPITRKilled(t *testing.T) {
	t.Parallel() // see env
	type child struct{ Root, Chain, Arch string }
	b := pgtest.Builds(t, 0)[0]
	opts := func(c child) Options {
		lay := statedir.Layout{Root: c.Root}
		return Options{Layout: lay, Installation: b.Inst, User: b.User,
			Sources: []Source{{Name: "pitr", Kind: SourceBackup, Chain: c.Chain, WALDir: c.Arch, TargetName: "before"}}}
	}
	if env := os.Getenv("PGFORK_PITR_CHILD"); env != "" {
		var c child
		if err := json.Unmarshal([]byte(env), &c); err != nil {
			t.Fatal(err)
		}
		m, err := Open(context.Background(), opts(c))
		if err != nil {
			t.Fatal(err)
		}
		testHookRecovered = func() { _ = syscall.Kill(os.Getpid(), syscall.SIGKILL) }
		_, err = m.Create(context.Background(), Caller{Token: "me"}, CreateOptions{Name: "k", Source: "pitr"})
		t.Fatalf("create returned (%v) instead of being killed", err)
	}
	dir := testenv.XFSDir(t)
	c := child{Root: filepath.Join(dir, "state")}
	c.Chain, c.Arch = pitrChain(t, b, dir)
	raw, _ := json.Marshal(c)
	cmd := exec.Command(os.Args[0], "-test.run=^TestBranchesPITRKilled$", "-test.count=1")
	cmd.Env = append(os.Environ(), "PGFORK_PITR_CHILD="+string(raw))
	out, err := cmd.CombinedOutput()
	if ee, ok := err.(*exec.ExitError); !ok || ee.Sys().(syscall.WaitStatus).Signal() != syscall.SIGKILL {
		t.Fatalf("the child was not killed (%v):\n%s", err, out)
	}
	lay := statedir.Layout{Root: c.Root}
	l, _ := cluster.List(lay)
	var pid int
	var data, name string
	for _, e := range l {
		if strings.HasPrefix(e.Name, tempPrefix) && e.State == cluster.Running {
			pid, data, name = e.Pid, e.DataDir, e.Name
		}
	}
	if pid == 0 {
		t.Fatalf("no recovery server running after the kill (the hook ran too early?): %+v", l)
	}
	// If Open failed to: Down checks it is still the server recorded.
	t.Cleanup(func() {
		_ = cluster.Down(context.Background(), lay, name, cluster.DownOptions{DeleteData: true, Timeout: 10 * time.Second})
	})

	m, err := Open(context.Background(), opts(c))
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	testenv.WaitFor(t, fmt.Sprintf("the recovery server (pid %d) to be gone after Open", pid), func() bool {
		return syscall.Kill(pid, 0) != nil
	})
	if l, _ := cluster.List(lay); len(l) != 0 {
		t.Errorf("the registry keeps %+v", l)
	}
	if _, err := os.Stat(data); err == nil {
		t.Errorf("the recovery server's directory %s is left", data)
	}
	for _, sub := range []string{"snap", "data"} {
		if ents, _ := os.ReadDir(filepath.Join(Dir(lay), sub)); len(ents) != 0 {
			t.Errorf("%s/ keeps %v", sub, ents)
		}
	}
}
