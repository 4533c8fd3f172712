package restore

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/pgfork/pgfork/clone"
	"github.com/pgfork/pgfork/cluster"
	"github.com/pgfork/pgfork/internal/errs"
	"github.com/pgfork/pgfork/internal/pgtest"
	"github.com/pgfork/pgfork/internal/statedir"
	"github.com/pgfork/pgfork/internal/testenv"
)

// TestRestoreTablespaces restores a chain of a cluster with a user
// tablespace (a table in it from the start, changed between the backups,
// and one created after the full backup) as pg_combinebackup -T does:
// same files in the data directory and in the tablespace, same manifest,
// the link pointing to the new directory; then starts it as a branch and
// compares its rows with the source's. A chain without the mapping, and
// bad mappings, are refused before anything is written.
func TestRestoreTablespaces(t *testing.T) {
	forEachPG(t, func(t *testing.T, e pgEnv) {
		base := testenv.XFSDir(t)
		tsSrc := filepath.Join(base, "ts-src")
		if err := e.User.MkdirOwned(tsSrc, 0o700); err != nil {
			t.Fatal(err)
		}
		_, in := e.newCluster(t, base, "src", nil)
		url := in.ConnString("", "")
		pgtest.Exec(t, url, "CREATE TABLESPACE ts LOCATION '"+tsSrc+"'",
			"CREATE TABLE inTS(x int, pad text) TABLESPACE ts",
			"INSERT INTO inTS SELECT g, repeat('x', 200) FROM generate_series(1, 20000) g",
			"CREATE INDEX ON inTS(x) TABLESPACE ts")
		b0, b1 := filepath.Join(base, "b0"), filepath.Join(base, "b1")
		ts0, ts1 := filepath.Join(base, "b0-ts"), filepath.Join(base, "b1-ts")
		e.basebackup(t, in, b0, "", "-T", tsSrc+"="+ts0)
		pgtest.Exec(t, url, "UPDATE inTS SET pad = 'y' WHERE x % 10 = 0",
			"CREATE TABLE later(x int) TABLESPACE ts", "INSERT INTO later SELECT generate_series(1, 1000)")
		e.basebackup(t, in, b1, b0, "-T", tsSrc+"="+ts1)
		want := pgtest.Query(t, url, "SELECT count(*) || ' ' || sum(x) || ' ' || sum(length(pad)) FROM inTS") + " / " +
			pgtest.Query(t, url, "SELECT count(*)::text FROM later")
		pgtest.Stop(t, in)
		dirs := []string{b0, b1}

		// Without a mapping: refused, naming the directory, nothing written.
		out := filepath.Join(base, "restored")
		outTS := filepath.Join(base, "restored-ts")
		_, err := Restore(context.Background(), dirs, out, Options{})
		if errs.KindOf(err) != errs.Usage || !strings.Contains(err.Error(), "the tablespace at "+ts1+" (pg_tblspc/") {
			t.Fatalf("no mapping: %v, want a usage error naming %s", err, ts1)
		}
		for _, bad := range []struct {
			mapping map[string]string
			want    string
		}{
			{map[string]string{ts1: outTS, "/nowhere": outTS + "2"}, "no tablespace of the newest backup is at /nowhere"},
			{map[string]string{ts1: filepath.Join(out, "ts")}, "overlap"},
			{map[string]string{ts1: filepath.Join(b0, "ts")}, "inside a backup"},
		} {
			if _, err := Restore(context.Background(), dirs, out, Options{Tablespaces: bad.mapping}); err == nil || !strings.Contains(err.Error(), bad.want) {
				t.Errorf("mapping %v: %v, want an error saying %q", bad.mapping, err, bad.want)
			}
		}
		for _, p := range []string{out, outTS} {
			if _, err := os.Lstat(p); !os.IsNotExist(err) || len(leftovers(p)) > 0 {
				t.Fatalf("a refused restore left %s or its staging: %v %v", p, err, leftovers(p))
			}
		}

		ref, refTS := filepath.Join(base, "combined"), filepath.Join(base, "combined-ts")
		e.Tool(t, "pg_combinebackup", "-o", ref, "--no-sync", "-T", ts1+"="+refTS, b0, b1)
		sum, err := Restore(context.Background(), dirs, out, Options{Sync: clone.SyncFsync, Owner: e.owner(),
			Tablespaces: map[string]string{ts1: outTS}})
		if err != nil {
			t.Fatal(err)
		}
		if len(sum.Tablespaces) != 1 || sum.Tablespaces[0].Dir != outTS || sum.Tablespaces[0].From != ts1 {
			t.Errorf("summary tablespaces %+v", sum.Tablespaces)
		}
		if sum.FilesRebuilt == 0 {
			t.Errorf("nothing was rebuilt: the chain does not exercise incremental files in the tablespace")
		}
		sameFiles(t, ref, out)
		sameFilesAtLeast(t, refTS, outTS, 5) // the two tables, their index, fsm and vm forks
		sameManifest(t, ref, out)
		link := filepath.Join(out, "pg_tblspc", sum.Tablespaces[0].OID)
		if got, err := os.Readlink(link); err != nil || got != outTS {
			t.Errorf("%s links to %q (%v), want %s", link, got, err, outTS)
		}
		if fi, err := os.Stat(outTS); err != nil || fi.Mode().Perm() != 0o700 {
			t.Errorf("the restored tablespace directory: %v %v, want mode 0700", fi, err)
		}
		e.Tool(t, "pg_verifybackup", "--no-parse-wal", out)

		// It starts as a branch, with the source's rows.
		lay := statedir.Layout{Root: filepath.Join(testenv.Dir(t), "state")}
		st, err := Start(context.Background(), out, StartOptions{Layout: lay, Installation: e.Inst, User: e.User, Source: b0 + " " + b1})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			_ = cluster.Down(context.Background(), lay, st.Name, cluster.DownOptions{Timeout: time.Second})
		})
		got := pgtest.Query(t, st.URL, "SELECT count(*) || ' ' || sum(x) || ' ' || sum(length(pad)) FROM inTS") + " / " +
			pgtest.Query(t, st.URL, "SELECT count(*)::text FROM later")
		if got != want {
			t.Errorf("the branch has %q, the source had %q", got, want)
		}
		if loc := pgtest.Query(t, st.URL, "SELECT pg_tablespace_location(oid) FROM pg_tablespace WHERE spcname = 'ts'"); loc != outTS {
			t.Errorf("the branch's tablespace is at %s, want %s", loc, outTS)
		}
	})
}
