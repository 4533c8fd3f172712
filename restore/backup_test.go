package restore

import (
	"context"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/pgfork/pgfork/clone"
	"github.com/pgfork/pgfork/internal/errs"
	"github.com/pgfork/pgfork/internal/pgtest"
	"github.com/pgfork/pgfork/internal/testenv"
	"github.com/pgfork/pgfork/pgbackup"
	"github.com/pgfork/pgfork/pgbin"
)

// TestBackupChainDirectory takes a full and two incremental backups with
// pgbackup.Take (after it refused an incremental while summarize_wal was
// off), lists them, and restores the chain directory whole and up to the
// middle backup.
func TestBackupChainDirectory(t *testing.T) {
	e := newestPG(t)
	base := testenv.XFSDir(t)
	_, in := e.newCluster(t, base, "src", map[string]string{"summarize_wal": ""})
	url := in.ConnString("", "")
	dir := filepath.Join(base, "chain")
	opts := pgbackup.TakeOptions{Dir: dir, ConnString: url, PGBin: pgbin.Options{Explicit: e.Bin, StateDir: t.TempDir()}}

	inc := opts
	inc.Incremental = true
	_, err := pgbackup.Take(context.Background(), inc)
	if errs.KindOf(err) != errs.Unsupported || !strings.Contains(errs.HintOf(err), "summarize_wal = on") {
		t.Fatalf("incremental with summarize_wal off: got %v (hint %q), want unsupported with how to turn it on", err, errs.HintOf(err))
	}
	pgtest.Exec(t, url, "ALTER SYSTEM SET summarize_wal = on", "SELECT pg_reload_conf()")
	for i := 0; pgtest.Query(t, url, "SHOW summarize_wal") != "on"; i++ { // the reload is asynchronous
		if i > 600 {
			t.Fatal("summarize_wal did not turn on after a reload")
		}
		time.Sleep(100 * time.Millisecond)
	}
	_, err = pgbackup.Take(context.Background(), inc)
	if errs.KindOf(err) != errs.NotFound {
		t.Fatalf("incremental without a full backup: got %v, want not-found", err)
	}

	pgtest.Exec(t, url, "CREATE TABLE t(x int)", "INSERT INTO t SELECT generate_series(1, 1000)")
	full, err := pgbackup.Take(context.Background(), opts)
	if err != nil {
		t.Fatal(err)
	}
	pgtest.Exec(t, url, "INSERT INTO t SELECT generate_series(1, 1000)")
	i1, err := pgbackup.Take(context.Background(), inc)
	if err != nil {
		t.Fatal(err)
	}
	pgtest.Exec(t, url, "INSERT INTO t SELECT generate_series(1, 1000)")
	i2, err := pgbackup.Take(context.Background(), inc)
	if err != nil {
		t.Fatal(err)
	}
	all, err := pgbackup.List(dir)
	if err != nil {
		t.Fatal(err)
	}
	var kinds []string
	for _, b := range all {
		kinds = append(kinds, b.Name()[strings.LastIndex(b.Name(), "-")+1:]+"/"+b.Kind())
	}
	if got := strings.Join(kinds, " "); got != "full/full incr/incremental incr/incremental" {
		t.Fatalf("backups listed: %s", got)
	}
	if i1.Label.PrevLSN != full.Label.StartLSN || i2.Label.PrevLSN != i1.Label.StartLSN {
		t.Errorf("incrementals are not based on the newest backup each")
	}
	pgtest.Stop(t, in)

	whole, err := pgbackup.Discover(dir, "")
	if err != nil {
		t.Fatal(err)
	}
	if len(whole) != 3 || whole[2] != i2.Dir {
		t.Fatalf("chain %v", whole)
	}
	upto, err := pgbackup.Discover(dir, i1.Name())
	if err != nil {
		t.Fatal(err)
	}
	if len(upto) != 2 || upto[0] != full.Dir || upto[1] != i1.Dir {
		t.Fatalf("chain up to %s: %v", i1.Name(), upto)
	}
	for _, c := range [][]string{whole, upto} {
		dst := filepath.Join(base, "restored-"+filepath.Base(c[len(c)-1]))
		if _, err := Restore(context.Background(), c, dst, Options{Sync: clone.SyncNone}); err != nil {
			t.Fatal(err)
		}
		e.Tool(t, "pg_verifybackup", dst)
	}
	if _, err := pgbackup.Discover(dir, "nope"); errs.KindOf(err) != errs.NotFound {
		t.Errorf("--upto of an unknown backup: %v", err)
	}
}
