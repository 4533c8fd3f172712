package pgdata

import (
	"context"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgfork/pgfork/clone"
	"github.com/pgfork/pgfork/instance"
	"github.com/pgfork/pgfork/internal/errs"
	"github.com/pgfork/pgfork/internal/pgtest"
	"github.com/pgfork/pgfork/internal/testenv"
	"github.com/pgfork/pgfork/pgbin"
)

// builds returns the PostgreSQL builds to test against.
func builds(t *testing.T) []pgbin.Installation {
	t.Helper()
	var out []pgbin.Installation
	for _, d := range testenv.PGBinDirs(t) {
		in, err := pgbin.Find(pgbin.Options{Explicit: d}, 0)
		if err != nil {
			t.Fatalf("PostgreSQL build %s: %v", d, err)
		}
		out = append(out, in)
	}
	return out
}

// initdb makes a fresh data directory with the given build.
func initdb(t *testing.T, in pgbin.Installation, checksums bool) string {
	t.Helper()
	data := filepath.Join(testenv.Dir(t), "data")
	o := pgtest.Server{BinDir: in.BinDir, Env: in.Env()}
	if checksums {
		o.Checksums = &checksums
	} else {
		// initdb before 18 has no --no-data-checksums; add it only from 18
		// on, where checksums became the default.
		if in.Major >= 18 {
			o.Checksums = &checksums
		}
	}
	pgtest.InitDB(t, data, o)
	return data
}

func start(t *testing.T, in pgbin.Installation, data string) *instance.Instance {
	t.Helper()
	return pgtest.Start(t, data, pgtest.Server{BinDir: in.BinDir, Env: in.Env()})
}

func connect(t *testing.T, srv *instance.Instance) *pgx.Conn {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c, err := pgx.Connect(ctx, srv.ConnString("", ""))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close(context.Background()) })
	return c
}

func exec1(t *testing.T, c *pgx.Conn, sql string, args ...any) {
	t.Helper()
	if _, err := c.Exec(context.Background(), sql, args...); err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
}

func TestCheckAndVersion(t *testing.T) {
	for _, in := range builds(t) {
		data := initdb(t, in, false)
		if err := Check(data); err != nil {
			t.Errorf("Check(%s): %v", data, err)
		}
		if v, err := Version(data); err != nil || v != in.Major {
			t.Errorf("Version = %d, %v; want %d", v, err, in.Major)
		}
	}

	empty := testenv.Dir(t)
	err := Check(empty)
	if errs.KindOf(err) != errs.Usage || !strings.Contains(err.Error(), "not a PostgreSQL data directory") ||
		!strings.Contains(err.Error(), empty) || errs.HintOf(err) == "" {
		t.Errorf("Check(empty dir) = %v (hint %q)", err, errs.HintOf(err))
	}
	if _, err := Version(empty); errs.KindOf(err) != errs.Usage {
		t.Errorf("Version(empty dir) = %v", err)
	}
	missing := filepath.Join(empty, "nope")
	if err := Check(missing); errs.KindOf(err) != errs.NotFound || !strings.Contains(err.Error(), missing) {
		t.Errorf("Check(missing) = %v", err)
	}
	file := filepath.Join(empty, "PG_VERSION")
	if err := os.WriteFile(file, []byte("9.6\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := Check(file); errs.KindOf(err) != errs.Usage {
		t.Errorf("Check(file) = %v", err)
	}
	if err := Check(empty); errs.KindOf(err) != errs.Usage || !strings.Contains(err.Error(), "pg_control") {
		t.Errorf("Check(no pg_control) = %v", err)
	}
	if _, err := Version(empty); errs.KindOf(err) != errs.Unsupported {
		t.Errorf("Version(9.6) = %v, want unsupported", err)
	}
	for _, bad := range []string{"", "abc", "1", "15.2", "../15"} {
		if err := os.WriteFile(file, []byte(bad), 0o644); err != nil {
			t.Fatal(err)
		}
		if v, err := Version(empty); errs.KindOf(err) != errs.Usage {
			t.Errorf("Version(PG_VERSION=%q) = %d, %v; want usage error", bad, v, err)
		}
	}
}

func TestControlDataAndRunning(t *testing.T) {
	all := builds(t)
	for _, in := range all {
		t.Run(in.Version, func(t *testing.T) {
			ctx := context.Background()
			data := initdb(t, in, true)
			cd, err := ReadControlData(ctx, in.BinDir, data, in.Env())
			if err != nil {
				t.Fatal(err)
			}
			if cd.State != StateShutDown || !cd.CleanShutdown() {
				t.Errorf("fresh initdb: state %q, clean %v", cd.State, cd.CleanShutdown())
			}
			if cd.SystemIdentifier == 0 || cd.CatalogVersion < 201000000 || cd.ControlVersion < 1000 {
				t.Errorf("implausible ids: %+v", cd)
			}
			if cd.BlockSize != 8192 || cd.WALSegmentSize != 16<<20 || cd.TimeLineID != 1 {
				t.Errorf("block %d, segment %d, timeline %d", cd.BlockSize, cd.WALSegmentSize, cd.TimeLineID)
			}
			if !cd.ChecksumsEnabled() || !isLSN(cd.RedoLocation) || !isLSN(cd.CheckpointLocation) {
				t.Errorf("checksums %d, redo %q, checkpoint %q", cd.DataChecksumVersion, cd.RedoLocation, cd.CheckpointLocation)
			}
			if len(cd.Warnings) != 0 {
				t.Errorf("warnings: %v", cd.Warnings)
			}
			if pid, running, err := Running(data); err != nil || running || pid != 0 {
				t.Errorf("Running(stopped) = %d, %v, %v", pid, running, err)
			}

			srv := start(t, in, data)
			if pid, running, err := Running(data); err != nil || !running || pid != srv.Pid {
				t.Errorf("Running(started) = %d, %v, %v; server pid %d", pid, running, err, srv.Pid)
			}
			cd2, err := ReadControlData(ctx, in.BinDir, data, in.Env())
			if err != nil {
				t.Fatal(err)
			}
			if cd2.State != StateInProduction || cd2.CleanShutdown() || cd2.SystemIdentifier != cd.SystemIdentifier {
				t.Errorf("running: state %q, clean %v, sysid %d vs %d", cd2.State, cd2.CleanShutdown(), cd2.SystemIdentifier, cd.SystemIdentifier)
			}
			if err := ResetForClone(data, ResetOptions{}); errs.KindOf(err) != errs.Busy {
				t.Errorf("ResetForClone on a running server: want busy, got %v", err)
			}
			if err := srv.Stop(ctx, instance.Immediate); err != nil {
				t.Fatal(err)
			}
			cd3, err := ReadControlData(ctx, in.BinDir, data, in.Env())
			if err != nil {
				t.Fatal(err)
			}
			if cd3.CleanShutdown() {
				t.Errorf("after an immediate stop the state is %q, want not clean", cd3.State)
			}

			// A stale postmaster.pid: its process is gone.
			dead := deadPid(t)
			pidFile := filepath.Join(data, "postmaster.pid")
			if err := os.WriteFile(pidFile, fmt.Appendf(nil, "%d\n%s\n", dead, data), 0o600); err != nil {
				t.Fatal(err)
			}
			if pid, running, err := Running(data); err != nil || running || pid != dead {
				t.Errorf("Running(stale pid %d) = %d, %v, %v", dead, pid, running, err)
			}
			if err := os.WriteFile(pidFile, []byte("garbage\n"), 0o600); err != nil {
				t.Fatal(err)
			}
			if _, _, err := Running(data); err == nil || errs.HintOf(err) == "" {
				t.Errorf("Running(garbage pid file) = %v", err)
			}

			// Binaries of another major are refused.
			for _, other := range all {
				if other.Major != in.Major {
					_, err := ReadControlData(ctx, other.BinDir, data, other.Env())
					if errs.KindOf(err) != errs.Unsupported || !strings.Contains(errs.HintOf(err), fmt.Sprint(in.Major)) {
						t.Errorf("pg_controldata %d on a %d data dir: %v (hint %q)", other.Major, in.Major, err, errs.HintOf(err))
					}
				}
			}
			if _, err := ReadControlData(ctx, in.BinDir, testenv.Dir(t), in.Env()); errs.KindOf(err) != errs.Usage {
				t.Errorf("ReadControlData(not a data dir) = %v", err)
			}
		})
	}
}

func deadPid(t *testing.T) int {
	t.Helper()
	cmd := exec.Command("true")
	if err := cmd.Run(); err != nil {
		t.Fatal(err)
	}
	pid := cmd.Process.Pid
	if syscall.Kill(pid, 0) == nil {
		t.Skip("pid of an exited process was reused at once")
	}
	return pid
}

func TestParseControlDataRejectsGarbage(t *testing.T) {
	if _, err := ParseControlData("hello\nworld: 1\n"); err == nil {
		t.Error("parsed garbage")
	}
	good := `pg_control version number:            1300
Catalog version number:               202209061
Database system identifier:           7710737043366840121
Database cluster state:               shut down in recovery
Latest checkpoint location:           0/1500718
Latest checkpoint's REDO location:    0/15006E0
Latest checkpoint's TimeLineID:       3
Database block size:                  8192
Bytes per WAL segment:                16777216
Data page checksum version:           1
`
	cd, err := ParseControlData(good)
	if err != nil {
		t.Fatal(err)
	}
	if !cd.CleanShutdown() || cd.TimeLineID != 3 || cd.RedoLocation != "0/15006E0" || cd.SystemIdentifier != 7710737043366840121 {
		t.Errorf("%+v", cd)
	}
	if _, err := ParseControlData(strings.Replace(good, "0/15006E0", "zz", 1)); err == nil {
		t.Error("accepted a bad LSN")
	}
	if _, err := ParseControlData(strings.Replace(good, "shut down in recovery", "unrecognized status code", 1)); err == nil {
		t.Error("accepted an unknown state")
	}
}

// walk applies a filter to a real data directory as the copy engine does
// and returns the action for every path it visits.
func walk(t *testing.T, root string, f clone.Filter) map[string]clone.Action {
	t.Helper()
	got := map[string]clone.Action{}
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if p == root {
			return nil
		}
		rel, _ := filepath.Rel(root, p)
		rel = filepath.ToSlash(rel)
		a := f(rel, d)
		got[rel] = a
		if d.IsDir() && a != clone.Include {
			return filepath.SkipDir
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return got
}

// TestFiltersOnALiveDataDirectory builds a data directory with everything
// a copy must leave out (temporary tables, a replication slot, a
// tablespace, temp files, signal files, relcache init files), then checks
// what each filter does with every entry.
func TestFiltersOnALiveDataDirectory(t *testing.T) {
	in := builds(t)[0]
	ctx := context.Background()
	data := initdb(t, in, false)
	user := pgtest.User(t)
	tsDir := filepath.Join(testenv.Dir(t), "ts")
	if err := user.MkdirOwned(tsDir, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := user.MkdirOwned(filepath.Join(data, "log"), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(data, "log", "postgresql.log"), []byte("old log"), 0o600); err != nil {
		t.Fatal(err)
	}
	srv := start(t, in, data)
	c := connect(t, srv)
	exec1(t, c, "CREATE TABLE kept (id int PRIMARY KEY, v text)")
	exec1(t, c, "INSERT INTO kept SELECT g, 'x' FROM generate_series(1, 1000) g")
	exec1(t, c, "CREATE TEMP TABLE scratch (id int)")
	exec1(t, c, "INSERT INTO scratch SELECT generate_series(1, 10000)")
	exec1(t, c, "SELECT pg_create_physical_replication_slot('slot1', true)")
	exec1(t, c, "CREATE TABLESPACE ts1 LOCATION '"+tsDir+"'")
	exec1(t, c, "CREATE TABLE in_ts (id int) TABLESPACE ts1")
	exec1(t, c, "INSERT INTO in_ts VALUES (1)")
	exec1(t, c, "CHECKPOINT")
	var dbOID, tsOID uint32
	if err := c.QueryRow(ctx, "SELECT oid FROM pg_database WHERE datname = current_database()").Scan(&dbOID); err != nil {
		t.Fatal(err)
	}
	if err := c.QueryRow(ctx, "SELECT oid FROM pg_tablespace WHERE spcname = 'ts1'").Scan(&tsOID); err != nil {
		t.Fatal(err)
	}
	var tempPath, keptPath string
	if err := c.QueryRow(ctx, "SELECT pg_relation_filepath('scratch'), pg_relation_filepath('kept')").Scan(&tempPath, &keptPath); err != nil {
		t.Fatal(err)
	}
	// Files a crashed or busy server leaves behind.
	for _, f := range []string{"base/pgsql_tmp/pgsql_tmp1234.0", "standby.signal", "recovery.signal", "backup_label", "tablespace_map", "backup_manifest", "postgresql.auto.conf.tmp", "current_logfiles", OldClusterLogFile, "pg_stat_tmp/global.stat", "pg_subtrans/0000"} {
		p := filepath.Join(data, f)
		_ = os.MkdirAll(filepath.Dir(p), 0o700)
		if _, err := os.Stat(p); err == nil {
			continue
		}
		if err := os.WriteFile(p, []byte("x"), 0o600); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { os.Remove(p) })
	}

	offline := walk(t, data, Filter)
	online := walk(t, data, OnlineFilter)

	if !strings.HasPrefix(tempPath, fmt.Sprintf("base/%d/t", dbOID)) {
		t.Fatalf("temporary table file is %s, expected base/%d/t<N>_<relfilenode>", tempPath, dbOID)
	}
	tsLink := fmt.Sprintf("pg_tblspc/%d", tsOID)
	expect := map[string]clone.Action{
		"PG_VERSION": clone.Include, "postgresql.conf": clone.Include, "postgresql.auto.conf": clone.Include,
		"global/pg_control": clone.Include, keptPath: clone.Include, "pg_wal": clone.Include, "base": clone.Include,
		"postmaster.pid": clone.Skip, "postmaster.opts": clone.Skip, "standby.signal": clone.Skip, "recovery.signal": clone.Skip,
		"backup_label": clone.Skip, "tablespace_map": clone.Skip, "backup_manifest": clone.Skip,
		"postgresql.auto.conf.tmp": clone.Skip, "current_logfiles": clone.Skip, instance.LogFileName: clone.Skip, OldClusterLogFile: clone.Skip,
		tempPath: clone.Skip, "base/pgsql_tmp": clone.Skip, "global/pg_internal.init": clone.Skip,
		fmt.Sprintf("base/%d/pg_internal.init", dbOID): clone.Skip,
		tsLink:        clone.Skip,
		"pg_replslot": clone.EmptyDir, "pg_stat_tmp": clone.EmptyDir, "pg_dynshmem": clone.EmptyDir, "pg_notify": clone.EmptyDir,
		"pg_serial": clone.EmptyDir, "pg_snapshots": clone.EmptyDir, "pg_subtrans": clone.EmptyDir, "log": clone.EmptyDir,
	}
	for rel, want := range expect {
		got, ok := offline[rel]
		if !ok {
			if _, err := os.Lstat(filepath.Join(data, rel)); err != nil {
				t.Errorf("test setup: %s does not exist in the data directory", rel)
				continue
			}
			t.Errorf("walk never visited %s", rel)
			continue
		}
		if got != want {
			t.Errorf("Filter(%s) = %v, want %v", rel, got, want)
		}
		wantOnline := want
		if rel == "pg_wal" {
			wantOnline = clone.EmptyDir
		}
		if online[rel] != wantOnline {
			t.Errorf("OnlineFilter(%s) = %v, want %v", rel, online[rel], wantOnline)
		}
	}
	// Nothing under the emptied directories is visited, WAL is copied offline.
	for rel := range offline {
		if strings.HasPrefix(rel, "pg_replslot/") || strings.HasPrefix(rel, tsLink+"/") {
			t.Errorf("visited %s below a skipped or emptied directory", rel)
		}
	}
	nWAL := 0
	for rel, a := range offline {
		if strings.HasPrefix(rel, "pg_wal/0000") && a == clone.Include {
			nWAL++
		}
	}
	if nWAL == 0 {
		t.Error("offline filter copies no WAL segment")
	}

	// Tablespaces: listed with their target; the tablespace filter drops temp files.
	tss, err := Tablespaces(data)
	if err != nil {
		t.Fatal(err)
	}
	if len(tss) != 1 || tss[0].OID != fmt.Sprint(tsOID) || tss[0].Target != tsDir || tss[0].InPlace {
		t.Errorf("Tablespaces = %+v, want oid %d -> %s", tss, tsOID, tsDir)
	}
	exec1(t, c, "CREATE TEMP TABLE scratch_ts (id int) TABLESPACE ts1")
	var tempTS string
	if err := c.QueryRow(ctx, "SELECT pg_relation_filepath('scratch_ts')").Scan(&tempTS); err != nil {
		t.Fatal(err)
	}
	tsActions := walk(t, tsDir, TablespaceFilter)
	nIncluded := 0
	for rel, a := range tsActions {
		base := filepath.Base(rel)
		if strings.HasPrefix(base, "t") && strings.Contains(base, "_") && a != clone.Skip {
			t.Errorf("TablespaceFilter(%s) = %v, want skip", rel, a)
		}
		if a == clone.Include && !strings.HasPrefix(base, "t") {
			nIncluded++
		}
	}
	if !strings.Contains(tempTS, "/t") || nIncluded < 3 {
		t.Errorf("tablespace: temp file %s, %d entries kept: %v", tempTS, nIncluded, tsActions)
	}
}

func TestTablespacesInPlaceAndEmpty(t *testing.T) {
	in := builds(t)[0]
	data := initdb(t, in, false)
	if tss, err := Tablespaces(data); err != nil || len(tss) != 0 {
		t.Errorf("fresh cluster: %v, %v", tss, err)
	}
	for _, n := range []string{"16500", "200", "notanoid", "0"} {
		if err := os.Mkdir(filepath.Join(data, "pg_tblspc", n), 0o700); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Symlink("/somewhere/else", filepath.Join(data, "pg_tblspc", "16400")); err != nil {
		t.Fatal(err)
	}
	tss, err := Tablespaces(data)
	if err != nil {
		t.Fatal(err)
	}
	want := []Tablespace{{OID: "200", InPlace: true}, {OID: "16400", Target: "/somewhere/else"}, {OID: "16500", InPlace: true}}
	if fmt.Sprint(tss) != fmt.Sprint(want) {
		t.Errorf("Tablespaces = %+v, want %+v", tss, want)
	}
	got := walk(t, data, Filter)
	if got["pg_tblspc/200"] != clone.Include || got["pg_tblspc/16400"] != clone.Skip {
		t.Errorf("in-place tablespace must be copied, linked one skipped: %v %v", got["pg_tblspc/200"], got["pg_tblspc/16400"])
	}
	if _, err := Tablespaces(testenv.Dir(t)); errs.KindOf(err) != errs.Usage {
		t.Errorf("Tablespaces(not a data dir) = %v", err)
	}
}

// copyTree copies src to dst applying f, keeping modes, symlinks and owner.
// A stand-in for clone.Copy, which is built in parallel.
func copyTree(t *testing.T, src, dst string, f clone.Filter, user *instance.OSUser) {
	t.Helper()
	err := filepath.WalkDir(src, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(src, p)
		target := filepath.Join(dst, rel)
		a := clone.Include
		if p != src {
			a = f(filepath.ToSlash(rel), d)
		}
		if a == clone.Skip {
			if d.IsDir() {
				return filepath.SkipDir
			}
			return nil
		}
		info, err := d.Info()
		if err != nil {
			return err
		}
		switch {
		case d.IsDir():
			if err := os.Mkdir(target, info.Mode().Perm()); err != nil {
				return err
			}
			if a == clone.EmptyDir {
				return filepath.SkipDir
			}
		case d.Type()&fs.ModeSymlink != 0:
			l, err := os.Readlink(p)
			if err != nil {
				return err
			}
			return os.Symlink(l, target)
		default:
			in, err := os.Open(p)
			if err != nil {
				return err
			}
			defer in.Close()
			out, err := os.OpenFile(target, os.O_CREATE|os.O_EXCL|os.O_WRONLY, info.Mode().Perm())
			if err != nil {
				return err
			}
			if _, err := io.Copy(out, in); err != nil {
				out.Close()
				return err
			}
			return out.Close()
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := user.Chown(dst); err != nil {
		t.Fatal(err)
	}
	_ = os.Chmod(dst, 0o700)
}

// postgresC asks postgres what a setting resolves to in dataDir (-C).
func postgresC(t *testing.T, in pgbin.Installation, data, name string) string {
	t.Helper()
	cmd := pgtest.User(t).Command(context.Background(), in.Env(), in.Tool("postgres"), "-D", data, "-C", name)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("postgres -C %s: %v\n%s", name, err, out)
	}
	return strings.TrimSpace(string(out))
}

// TestOfflineCloneRunsOnItsOwn copies a stopped cluster that archives,
// has a replication slot and points at a primary, resets the copy, and
// starts it: it must run with none of that, on its own port, with the data.
func TestOfflineCloneRunsOnItsOwn(t *testing.T) {
	for _, in := range builds(t) {
		t.Run(in.Version, func(t *testing.T) {
			ctx := context.Background()
			user := pgtest.User(t)
			src := initdb(t, in, false)
			srv := start(t, in, src)
			c := connect(t, srv)
			exec1(t, c, "CREATE TABLE kept AS SELECT g AS id FROM generate_series(1, 5000) g")
			exec1(t, c, "SELECT pg_create_physical_replication_slot('slot1', true)")
			exec1(t, c, "ALTER SYSTEM SET archive_mode = on")
			exec1(t, c, "ALTER SYSTEM SET archive_command = 'false'")
			exec1(t, c, "ALTER SYSTEM SET primary_conninfo = 'host=primary.invalid'")
			exec1(t, c, "ALTER SYSTEM SET restore_command = 'false'")
			_ = c.Close(ctx)
			if err := srv.Stop(ctx, instance.Fast); err != nil {
				t.Fatal(err)
			}
			cd, err := ReadControlData(ctx, in.BinDir, src, in.Env())
			if err != nil || !cd.CleanShutdown() {
				t.Fatalf("source not cleanly shut down: %+v, %v", cd, err)
			}
			before := snapshot(t, src)

			dst := filepath.Join(testenv.Dir(t), "clone")
			copyTree(t, src, dst, Filter, user)
			if err := ResetForClone(dst, ResetOptions{Port: 54329}); err != nil {
				t.Fatal(err)
			}
			if after := snapshot(t, src); after != before {
				t.Error("the source changed during the clone")
			}
			for name, want := range map[string]string{"port": "54329", "archive_mode": "off", "archive_command": "", "primary_conninfo": "", "restore_command": ""} {
				if got := postgresC(t, in, dst, name); got != want {
					t.Errorf("clone's %s = %q, want %q", name, got, want)
				}
			}
			if got := postgresC(t, in, src, "archive_mode"); got != "on" {
				t.Errorf("source's archive_mode = %q: the source was modified", got)
			}
			if ents, _ := os.ReadDir(filepath.Join(dst, "pg_replslot")); len(ents) != 0 {
				t.Errorf("clone has replication slots: %v", ents)
			}
			fi, err := os.Stat(filepath.Join(dst, "postgresql.auto.conf"))
			if err != nil {
				t.Fatal(err)
			}
			if user != nil && int(fi.Sys().(*syscall.Stat_t).Uid) != user.UID {
				t.Error("postgresql.auto.conf changed owner")
			}

			clone := start(t, in, dst)
			cc := connect(t, clone)
			var n, slots int
			var arch string
			if err := cc.QueryRow(ctx, "SELECT (SELECT count(*) FROM kept), (SELECT count(*) FROM pg_replication_slots), current_setting('archive_mode')").Scan(&n, &slots, &arch); err != nil {
				t.Fatal(err)
			}
			if n != 5000 || slots != 0 || arch != "off" {
				t.Errorf("clone: %d rows, %d slots, archive_mode %s", n, slots, arch)
			}
			cd2, err := ReadControlData(ctx, in.BinDir, dst, in.Env())
			if err != nil || cd2.SystemIdentifier != cd.SystemIdentifier {
				t.Errorf("clone's system identifier: %+v, %v", cd2, err)
			}
		})
	}
}

// TestResetForCloneOfARawCopy resets a plain copy (cp -a style, no filter)
// that still has the source's leftovers.
func TestResetForCloneOfARawCopy(t *testing.T) {
	in := builds(t)[0]
	user := pgtest.User(t)
	src := initdb(t, in, false)
	dst := filepath.Join(testenv.Dir(t), "copy")
	copyTree(t, src, dst, func(string, fs.DirEntry) clone.Action { return clone.Include }, user)
	for _, f := range []string{"standby.signal", "recovery.signal", "postmaster.opts", "backup_label", "pg_replslot/s1/state"} {
		p := filepath.Join(dst, f)
		_ = os.MkdirAll(filepath.Dir(p), 0o700)
		if err := os.WriteFile(p, []byte("x"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	dead := deadPid(t)
	if err := os.WriteFile(filepath.Join(dst, "postmaster.pid"), fmt.Appendf(nil, "%d\n", dead), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(filepath.Join(dst, "postgresql.auto.conf")); err != nil {
		t.Fatal(err)
	}
	if err := ResetForClone(dst, ResetOptions{}); err != nil {
		t.Fatal(err)
	}
	for _, f := range []string{"standby.signal", "recovery.signal", "postmaster.opts", "postmaster.pid", "pg_replslot/s1"} {
		if _, err := os.Lstat(filepath.Join(dst, f)); err == nil {
			t.Errorf("%s survived the reset", f)
		}
	}
	if _, err := os.Stat(filepath.Join(dst, "backup_label")); err != nil {
		t.Error("backup_label must be kept (an online clone needs it)")
	}
	b, err := os.ReadFile(filepath.Join(dst, "postgresql.auto.conf"))
	if err != nil || !strings.Contains(string(b), AutoConfMarker) || strings.Contains(string(b), "port =") {
		t.Errorf("postgresql.auto.conf: %q, %v", b, err)
	}
	if err := ResetForClone(dst, ResetOptions{Port: 70000}); errs.KindOf(err) != errs.Usage {
		t.Errorf("bad port: %v", err)
	}
	if err := ResetForClone(testenv.Dir(t), ResetOptions{}); errs.KindOf(err) != errs.Usage {
		t.Errorf("ResetForClone(not a data dir): %v", err)
	}
}

// snapshot summarizes a tree's names, sizes and mtimes.
func snapshot(t *testing.T, root string) string {
	t.Helper()
	var b strings.Builder
	err := filepath.Walk(root, func(p string, fi os.FileInfo, err error) error {
		if err != nil {
			return err
		}
		fmt.Fprintf(&b, "%s %d %d %v\n", p, fi.Size(), fi.ModTime().UnixNano(), fi.Mode())
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return b.String()
}

func isLSN(s string) bool { _, err := ParseLSN(s); return err == nil && s != "" }
