package pgclone_test

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/pgfork/pgfork/clone"
	"github.com/pgfork/pgfork/instance"
	"github.com/pgfork/pgfork/internal/errs"
	"github.com/pgfork/pgfork/internal/pgtest"
	"github.com/pgfork/pgfork/internal/testenv"
	"github.com/pgfork/pgfork/pgclone"
)

func TestOfflineClone(t *testing.T) {
	forEachPGOnFS(t, func(t *testing.T, e pgEnv, base string) {
		ctx := context.Background()
		src := e.newCluster(t, base, "src")
		in := e.start(t, src, nil)
		url := in.ConnString("", "")
		pgtest.Exec(t, url, "CREATE TABLE t AS SELECT g AS id, md5(g::text) AS v FROM generate_series(1, 20000) g")
		pgtest.Exec(t, url, "SELECT pg_create_physical_replication_slot('keeps_wal', true)")
		pgtest.Exec(t, url, "ALTER SYSTEM SET archive_mode = on")
		pgtest.Exec(t, url, "ALTER SYSTEM SET archive_command = 'false'")
		sum := pgtest.Query(t, url, "SELECT sum(hashtext(v))::text FROM t")
		sysid := pgtest.Query(t, url, "SELECT system_identifier::text FROM pg_control_system()")
		pgtest.Stop(t, in)
		before := testenv.TreeHash(t, src)

		dst := filepath.Join(base, "dst")
		res, err := pgclone.Clone(ctx, pgclone.Options{Src: src, Dst: dst, Installation: e.Inst, User: e.User, Port: 5439})
		if err != nil {
			t.Fatal(err)
		}
		testenv.SameTree(t, "source after an offline clone", before, testenv.TreeHash(t, src))
		if res.Online || res.Files < 100 || res.Bytes < 1<<20 || res.SystemIdentifier != sysid || res.Port != 5439 {
			t.Errorf("unexpected result: %+v (source system id %s)", res, sysid)
		}
		if fs, _ := clone.FSType(base); fs == "xfs" && res.SharedBytes < res.Bytes/2 {
			t.Errorf("on XFS only %d of %d bytes are shared with the source", res.SharedBytes, res.Bytes)
		}
		if l := leftovers(t, dst); len(l) > 0 {
			t.Errorf("leftovers beside the clone: %v", l)
		}
		ownedBy(t, dst, e.User)
		for _, f := range []string{"postmaster.pid", "postmaster.opts", "pg_replslot/keeps_wal"} {
			if _, err := os.Lstat(filepath.Join(dst, f)); err == nil {
				t.Errorf("the clone has %s", f)
			}
		}

		cl := e.start(t, dst, nil)
		curl := cl.ConnString("", "")
		if got := pgtest.Query(t, curl, "SELECT sum(hashtext(v))::text FROM t"); got != sum {
			t.Errorf("clone data differs: %s, source %s", got, sum)
		}
		if got := pgtest.Query(t, curl, "SELECT system_identifier::text FROM pg_control_system()"); got != sysid {
			t.Errorf("clone system identifier %s, want the source's %s", got, sysid)
		}
		if got := pgtest.Query(t, curl, "SHOW archive_mode"); got != "off" {
			t.Errorf("clone archive_mode = %s, want off", got)
		}
		if got := pgtest.Query(t, curl, "SELECT count(*)::text FROM pg_replication_slots"); got != "0" {
			t.Errorf("clone has %s replication slots, want 0", got)
		}
		conf, _ := os.ReadFile(filepath.Join(dst, "postgresql.auto.conf"))
		if !strings.Contains(string(conf), "port = 5439") {
			t.Errorf("clone's postgresql.auto.conf does not set the port:\n%s", conf)
		}
		pgtest.Exec(t, curl, "INSERT INTO t SELECT g, 'clone' FROM generate_series(1, 100) g")
		pgtest.Stop(t, cl)

		// The source is untouched and still starts with its own data.
		testenv.SameTree(t, "source after the clone ran", before, testenv.TreeHash(t, src))
		in = e.start(t, src, nil)
		if got := pgtest.Query(t, in.ConnString("", ""), "SELECT count(*)::text FROM t"); got != "20000" {
			t.Errorf("source has %s rows, want 20000", got)
		}
		pgtest.Stop(t, in)

		// Cloning onto an existing destination is refused.
		_, err = pgclone.Clone(ctx, pgclone.Options{Src: src, Dst: dst, Installation: e.Inst, User: e.User})
		if errs.KindOf(err) != errs.Exists {
			t.Errorf("clone onto an existing destination: got %v, want Exists", err)
		}
	})
}

func TestRefusals(t *testing.T) {
	forEachPG(t, func(t *testing.T, e pgEnv) {
		ctx := context.Background()
		base := testenv.Dir(t)
		src := e.newCluster(t, base, "src")
		dst := filepath.Join(base, "dst")
		opts := func(o pgclone.Options) pgclone.Options {
			o.User = e.User
			if o.Installation.BinDir == "" {
				o.Installation = e.Inst
			}
			if o.Src == "" {
				o.Src = src
			}
			if o.Dst == "" {
				o.Dst = dst
			}
			return o
		}
		check := func(name string, want errs.Kind, msg string, o pgclone.Options) {
			t.Helper()
			_, err := pgclone.Clone(ctx, opts(o))
			if errs.KindOf(err) != want || !strings.Contains(err.Error(), msg) {
				t.Errorf("%s: got %v (%s), want %s containing %q", name, err, errs.KindOf(err), want, msg)
			} else if errs.HintOf(err) == "" {
				t.Errorf("%s: error without a hint: %v", name, err)
			}
			if _, err := os.Lstat(dst); err == nil {
				_ = os.RemoveAll(dst)
				t.Errorf("%s: the destination was created", name)
			}
			if l := leftovers(t, dst); len(l) > 0 {
				t.Errorf("%s: leftovers %v", name, l)
			}
		}
		empty := filepath.Join(base, "empty")
		_ = os.Mkdir(empty, 0o755)
		check("not a data directory", errs.Usage, "not a PostgreSQL data directory", pgclone.Options{Src: empty})
		check("missing source", errs.NotFound, "", pgclone.Options{Src: filepath.Join(base, "nope")})
		other := e.Inst
		other.Major, other.Version = e.Inst.Major+1, fmt.Sprint(e.Inst.Major+1)+".0"
		check("binaries of another major", errs.Unsupported, fmt.Sprintf("PostgreSQL %d", e.Inst.Major), pgclone.Options{Installation: other})
		check("destination inside the source", errs.Usage, "overlaps", pgclone.Options{Dst: filepath.Join(src, "x")})
		check("online on a stopped source", errs.Usage, "no server runs", pgclone.Options{Online: true})

		in := e.start(t, src, nil)
		pgtest.Exec(t, in.ConnString("", ""), "CREATE TABLE t AS SELECT 1 AS x")
		check("running without --online", errs.Busy, "running", pgclone.Options{})
		if got := pgtest.Query(t, in.ConnString("", ""), "SELECT count(*)::text FROM t"); got != "1" {
			t.Errorf("source after the refusal: %s rows", got)
		}

		// --url reaching another server than the source's is refused.
		other2 := e.newCluster(t, base, "other")
		oin := e.start(t, other2, nil)
		check("--url of another server", errs.Usage, "not of the source", pgclone.Options{Online: true, ConnString: oin.ConnString("", "")})

		// A crashed source (stopped immediately) is not cleanly shut down.
		if err := in.Stop(ctx, instance.Immediate); err != nil {
			t.Fatal(err)
		}
		check("crashed source", errs.Busy, "not shut down cleanly", pgclone.Options{})
	})
}

func TestOnlineCloneUnderPgbench(t *testing.T) {
	forEachPGOnFS(t, func(t *testing.T, e pgEnv, base string) {
		ctx := context.Background()
		src := e.newCluster(t, base, "src")
		// Small max_wal_size: checkpoints during the copy, as on a busy server.
		in := e.start(t, src, map[string]string{"max_wal_size": "64MB", "min_wal_size": "32MB"})
		url := in.ConnString("", "")
		pgArgs := []string{"-h", in.SocketDir, "-p", fmt.Sprint(in.Port), "-U", "postgres"}
		e.Tool(t, "pgbench", append(pgArgs, "-i", "-q", "-s", "5", "postgres")...)

		// Until stopped (bg.stop), however slow the machine makes the copy.
		bench := exec.Command(filepath.Join(e.Bin, "pgbench"), append(pgArgs, "-T", "600", "-c", "4", "-j", "2", "-n", "postgres")...)
		bench.Env = append(os.Environ(), e.Inst.Env()...)
		bg := startLoad(t, "pgbench on the source", bench)
		time.Sleep(4 * time.Second)

		dst := filepath.Join(base, "dst")
		res, err := pgclone.Clone(ctx, pgclone.Options{Src: src, Dst: dst, Installation: e.Inst, User: e.User, Online: true, Port: 5440})
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("online clone: %d files, %d bytes (%d shared), WAL %s..%s in %d files, %s, warnings %v",
			res.Files, res.Bytes, res.SharedBytes, res.StartLSN, res.StopLSN, res.WALFiles, res.Elapsed, res.Warnings)
		if !res.Online || res.WALFiles < 1 || res.StartLSN == "" || res.StopLSN == "" {
			t.Errorf("unexpected result: %+v", res)
		}
		if l := leftovers(t, dst); len(l) > 0 {
			t.Errorf("leftovers beside the clone: %v", l)
		}
		label, err := os.ReadFile(filepath.Join(dst, "backup_label"))
		if err != nil || !strings.Contains(string(label), "START WAL LOCATION") {
			t.Fatalf("clone's backup_label: %v\n%s", err, label)
		}
		ownedBy(t, dst, e.User)
		bg.checkRunning(t, "before the clone did: the copy was not taken under load")

		// The clone recovers to consistency while the source keeps writing.
		cl := e.start(t, dst, nil)
		curl := cl.ConnString("", "")
		pgtest.CheckPgbenchInvariant(t, curl, "the copy was not taken under load")
		e.Tool(t, "pg_amcheck", "-h", cl.SocketDir, "-p", fmt.Sprint(cl.Port), "-U", "postgres",
			"--all", "--install-missing", "--heapallindexed", "--rootdescend")
		pgtest.Exec(t, curl, "UPDATE pgbench_accounts SET abalance = abalance + 1 WHERE aid = 1")
		pgtest.Stop(t, cl)

		// The load did its part (the source wrote all through the copy
		// and the clone's recovery); the rest of its 20 s proves nothing
		// more. Its transactions are atomic, so the source still holds.
		bg.stop(t)
		pgtest.CheckPgbenchInvariant(t, url, "the copy was not taken under load")
	})
}

func TestTablespaceClone(t *testing.T) {
	forEachPG(t, func(t *testing.T, e pgEnv) {
		ctx := context.Background()
		base := testenv.Dir(t)
		tsDir := filepath.Join(testenv.Dir(t), "ts")
		if err := e.User.MkdirOwned(tsDir, 0o700); err != nil {
			t.Fatal(err)
		}
		src := e.newCluster(t, base, "src")
		in := e.start(t, src, nil)
		url := in.ConnString("", "")
		pgtest.Exec(t, url, "CREATE TABLESPACE ts LOCATION '"+tsDir+"'")
		pgtest.Exec(t, url, "CREATE TABLE tt TABLESPACE ts AS SELECT g AS id FROM generate_series(1, 5000) g")
		pgtest.Exec(t, url, "CREATE INDEX ON tt (id) TABLESPACE ts")
		oid := pgtest.Query(t, url, "SELECT oid::text FROM pg_tablespace WHERE spcname = 'ts'")

		checkClone := func(t *testing.T, dst string, res *pgclone.Result) {
			t.Helper()
			wantTarget := filepath.Join(pgclone.TablespaceDir(dst), oid)
			if len(res.Tablespaces) != 1 || res.Tablespaces[0].Target != wantTarget || res.Tablespaces[0].Source != tsDir {
				t.Errorf("result tablespaces %+v, want %s -> %s", res.Tablespaces, tsDir, wantTarget)
			}
			ownedBy(t, pgclone.TablespaceDir(dst), e.User)
			if _, err := os.Stat(filepath.Join(pgclone.TablespaceDir(dst), ".pgfork-clone-incomplete")); err == nil {
				t.Errorf("the finished tablespace copy is still marked incomplete")
			}
			cl := e.start(t, dst, nil)
			curl := cl.ConnString("", "")
			link, err := os.Readlink(filepath.Join(dst, "pg_tblspc", oid))
			if err != nil || link != wantTarget {
				t.Errorf("clone's tablespace link points to %q (%v), want %s", link, err, wantTarget)
			}
			if got := pgtest.Query(t, curl, "SELECT pg_tablespace_location("+oid+")"); got != wantTarget {
				t.Errorf("clone's tablespace location %s, want %s", got, wantTarget)
			}
			if got := pgtest.Query(t, curl, "SELECT count(*)::text FROM tt WHERE id > 0"); got != "5000" {
				t.Errorf("clone reads %s rows from the tablespace, want 5000", got)
			}
			pgtest.Exec(t, curl, "INSERT INTO tt SELECT g FROM generate_series(1, 1000) g")
			pgtest.Exec(t, curl, "CHECKPOINT")
			pgtest.Stop(t, cl)
		}

		t.Run("online", func(t *testing.T) {
			dst := filepath.Join(base, "online")
			// With a URL, pgfork's own connection holds the backup (as root
			// without one, a psql session as the cluster's owner does).
			res, err := pgclone.Clone(ctx, pgclone.Options{Src: src, Dst: dst, Installation: e.Inst, User: e.User, Online: true, ConnString: url})
			if err != nil {
				t.Fatal(err)
			}
			if res.BackupUser != "" {
				t.Errorf("with a URL the backup ran in a psql session as %s, want pgfork's own connection", res.BackupUser)
			}
			m, err := os.ReadFile(filepath.Join(dst, "tablespace_map"))
			want := oid + " " + filepath.Join(pgclone.TablespaceDir(dst), oid) + "\n"
			if err != nil || string(m) != want {
				t.Errorf("tablespace_map = %q (%v), want %q", m, err, want)
			}
			checkClone(t, dst, res)
			if got := pgtest.Query(t, url, "SELECT count(*)::text FROM tt"); got != "5000" {
				t.Errorf("source has %s rows after the clone wrote to its copy, want 5000", got)
			}
		})
		t.Run("offline", func(t *testing.T) {
			pgtest.Stop(t, in)
			before := testenv.TreeHash(t, tsDir)
			dst := filepath.Join(base, "offline")
			res, err := pgclone.Clone(ctx, pgclone.Options{Src: src, Dst: dst, Installation: e.Inst, User: e.User})
			if err != nil {
				t.Fatal(err)
			}
			checkClone(t, dst, res)
			testenv.SameTree(t, "source tablespace after the clone wrote to its copy", before, testenv.TreeHash(t, tsDir))
		})
	})
}
