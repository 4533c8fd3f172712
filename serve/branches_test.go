package serve

import (
	"context"
	"path/filepath"
	"testing"

	"github.com/pgfork/pgfork/branches"
	"github.com/pgfork/pgfork/internal/pgtest"
	"github.com/pgfork/pgfork/internal/statedir"
	"github.com/pgfork/pgfork/internal/testenv"
	"github.com/pgfork/pgfork/pgbackup"
	"github.com/pgfork/pgfork/pgbin"
)

// TestBranchesBackupSource: a backup chain declared as a source is
// restored (restoreFunc, what serve passes) into a snapshot and branched:
// the branch has the rows of the backup, not those written after it, and
// its reset keeps them.
func TestBranchesBackupSource(t *testing.T) {
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

	m, err := branches.Open(ctx, branches.Options{Layout: statedir.Layout{Root: filepath.Join(dir, "state")},
		Installation: b.Inst, User: b.User, Restore: restoreFunc(b.User),
		Sources: []branches.Source{{Name: "nightly", Kind: branches.SourceBackup, Chain: chain}}})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	me := branches.Caller{Token: "me"}
	br, err := m.Create(ctx, me, branches.CreateOptions{Name: "restored", Source: "nightly"})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = m.Delete(ctx, me, "restored") }()
	if got := pgtest.Query(t, br.URL(), "SELECT string_agg(id::text, ',') FROM t"); got != "1" {
		t.Errorf("branch of the backup has rows %q, want 1", got)
	}
	pgtest.Exec(t, br.URL(), "TRUNCATE t")
	if _, err := m.Reset(ctx, me, "restored"); err != nil {
		t.Fatal(err)
	}
	if got := pgtest.Query(t, br.URL(), "SELECT count(*) FROM t"); got != "1" {
		t.Errorf("after reset the branch has %s rows, want 1", got)
	}
}
