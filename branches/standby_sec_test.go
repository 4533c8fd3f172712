package branches

import (
	"context"
	"io/fs"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/pgfork/pgfork/cluster"
	"github.com/pgfork/pgfork/instance"
	"github.com/pgfork/pgfork/internal/pgtest"
	"github.com/pgfork/pgfork/internal/statedir"
	"github.com/pgfork/pgfork/internal/testenv"
)

// replSecret is the primary's replication password in these tests: with a
// ':' and a '\', which the passfile and primary_conninfo must escape.
const replSecret = `F1-s3cr:t\pw`

// replSecretMark is the part of replSecret that no escaping changes.
const replSecretMark = "F1-s3cr"

// primary is a primary of a standby source in these tests.
type primary struct {
	in    *instance.Instance
	super string // its superuser over its socket (trust)
	url   string // the source's PrimaryURL
	ts    string // its tablespace directory, when it has one
}

// startPrimary starts a primary (wal_level replica, full page writes) of
// build b in dir. With repl, its URL is a REPLICATION role "repl" with a
// scram password (replSecret), which pg_hba.conf requires for it; with ts,
// it has a tablespace in a directory of its own holding table tt (42).
func startPrimary(t *testing.T, b pgtest.Build, dir string, repl, ts bool) primary {
	t.Helper()
	data := filepath.Join(dir, "primary")
	srv := pgtest.Server{BinDir: b.Bin, Env: b.Inst.Env(),
		Settings: map[string]string{"wal_level": "replica", "full_page_writes": "on", "password_encryption": "scram-sha-256"}}
	pgtest.InitDB(t, data, srv)
	if repl {
		hba := "local replication repl scram-sha-256\nlocal all repl scram-sha-256\nlocal all all trust\nlocal replication all trust\n"
		if err := os.WriteFile(filepath.Join(data, "pg_hba.conf"), []byte(hba), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	in := pgtest.Start(t, data, srv)
	p := primary{in: in, super: in.ConnString("", ""), url: in.ConnString("", "")}
	pgtest.Exec(t, p.super, "CREATE TABLE t (id int)", "INSERT INTO t VALUES (1)")
	if repl {
		pgtest.Exec(t, p.super, "CREATE ROLE repl LOGIN REPLICATION PASSWORD '"+replSecret+"'",
			"GRANT pg_read_all_settings TO repl", "GRANT SELECT ON t TO repl")
		u, err := url.Parse(p.super)
		if err != nil {
			t.Fatal(err)
		}
		u.User = url.UserPassword("repl", replSecret)
		p.url = u.String()
		if got := pgtest.Query(t, p.super, "SELECT (rolpassword LIKE 'SCRAM-SHA-256$%')::text FROM pg_authid WHERE rolname = 'repl'"); got != "true" {
			t.Fatalf("repl's password is not scram: %s", got)
		}
		u.User = url.User("repl")
		if err := tryQuery(u.String()); err == nil {
			t.Fatal("the primary lets repl in without its password")
		}
	}
	if ts {
		p.ts = filepath.Join(dir, "primary-ts")
		if err := b.User.MkdirOwned(p.ts, 0o700); err != nil {
			t.Fatal(err)
		}
		pgtest.Exec(t, p.super, "CREATE TABLESPACE ts LOCATION '"+p.ts+"'",
			"CREATE TABLE tt (x int) TABLESPACE ts", "INSERT INTO tt VALUES (42)")
	}
	return p
}

// standbyManager opens a Manager with one standby source "replica" of p;
// the standby is stopped when the test ends.
func standbyManager(t *testing.T, b pgtest.Build, dir string, p primary) (*Manager, Options) {
	t.Helper()
	o := Options{Layout: statedir.Layout{Root: filepath.Join(dir, "state")}, Installation: b.Inst, User: b.User,
		Sources: []Source{{Name: "replica", Kind: SourceStandby, PrimaryURL: p.url}}, AdminTokens: []string{"admin"}}
	m := open(t, o)
	t.Cleanup(func() {
		_ = cluster.Down(context.Background(), o.Layout, standbyReg("replica"), cluster.DownOptions{Timeout: 10 * time.Second})
	})
	return m, o
}

// standbyURL is the standby's superuser over its socket.
func standbyURL(t *testing.T, o Options) string {
	t.Helper()
	e, err := cluster.Get(o.Layout, standbyReg("replica"))
	if err != nil {
		t.Fatal(err)
	}
	return (&instanceAt{e.SocketDir, e.Port}).url()
}

// waitRows waits until url's table t has want rows.
func waitRows(t *testing.T, url, want string) {
	t.Helper()
	testenv.WaitFor(t, "the standby to reach "+want+" rows", func() bool {
		return pgtest.Query(t, url, "SELECT count(*) FROM t") == want
	})
}

// noSecretIn fails for every regular file below root but allow that holds
// the replication password (as written, or URL-encoded).
func noSecretIn(t *testing.T, root string, allow ...string) {
	t.Helper()
	enc := url.UserPassword("repl", replSecret).String()
	enc = enc[strings.IndexByte(enc, ':')+1:]
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			if os.IsNotExist(err) {
				return nil // a server's file that went away
			}
			return err
		}
		if !d.Type().IsRegular() || contains(allow, p) {
			return nil
		}
		b, err := os.ReadFile(p)
		if err != nil {
			return nil
		}
		if strings.Contains(string(b), replSecretMark) || strings.Contains(string(b), enc) {
			t.Errorf("%s holds the primary's replication password", p)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

func contains(l []string, s string) bool {
	for _, x := range l {
		if x == s {
			return true
		}
	}
	return false
}

// TestStandbyBranchHasNoPrimaryPassword (issue 32, F1): a standby of a
// primary whose REPLICATION role has a scram password keeps that password
// in a passfile beside its data directory (0600, the run-as user's), never
// in a file of its data directory, and still streams; no branch or
// snapshot carries it: read from inside a branch with the branch's own
// role (pg_read_file of its configuration, primary_conninfo) and as root,
// every file of the state directory but the passfile. A standby an earlier
// pgfork made, with the password in its primary_conninfo, loses it at the
// next start and streams on.
func TestStandbyBranchHasNoPrimaryPassword(t *testing.T) {
	t.Parallel() // see env
	ctx := context.Background()
	b := pgtest.Builds(t, 0)[0]
	dir := testenv.XFSDir(t)
	p := startPrimary(t, b, dir, true, false)
	m, o := standbyManager(t, b, dir, p)
	sby := standbyURL(t, o)
	alice := Caller{Token: "alice"}
	b1, err := m.Create(ctx, alice, CreateOptions{Name: "b1", Source: "replica"})
	if err != nil {
		t.Fatal(err)
	}
	pf := m.standbyPassfile("replica")
	fi, err := os.Lstat(pf)
	if err != nil {
		t.Fatalf("no passfile: %v", err)
	}
	if fi.Mode() != 0o600 || (b.User != nil && int(fi.Sys().(*syscall.Stat_t).Uid) != b.User.UID) {
		t.Errorf("passfile %s: mode %v, uid %d; want 0600, the run-as user's", pf, fi.Mode(), fi.Sys().(*syscall.Stat_t).Uid)
	}
	if got := pgtest.Query(t, sby, "SELECT current_setting('primary_conninfo')"); strings.Contains(got, "password") || !strings.Contains(got, "passfile") {
		t.Errorf("the standby's primary_conninfo: %s, want a passfile and no password", got)
	}
	// Inside the branch, as its role.
	for _, q := range []string{
		"SELECT pg_read_file('postgresql.auto.conf')",
		"SELECT pg_read_file('postgresql.conf')",
		"SELECT current_setting('primary_conninfo') || current_setting('primary_slot_name')",
		"SELECT string_agg(coalesce(setting, ''), ' ') FROM pg_settings",
	} {
		var got string
		err := queryRow(b1.URL(), q, &got)
		if err == nil && strings.Contains(got, replSecretMark) {
			t.Errorf("branch role: %s shows the primary's password", q)
		}
		if err == nil && strings.Contains(got, "user=repl") {
			t.Errorf("branch role: %s names the primary: %s", q, got)
		}
	}
	var super bool
	if err := queryRow(b1.URL(), "SELECT rolsuper FROM pg_roles WHERE rolname = current_user", &super); err != nil {
		t.Fatal(err)
	}
	if err := queryRow(b1.URL(), "SELECT pg_read_file("+pgQuote(pf)+")", new(string)); err == nil {
		// The passfile belongs to the OS user the branch's server runs
		// as: only a superuser branch role reads it (branch roles are not
		// superusers, docs/branches.md).
		if !super {
			t.Error("a branch role that is no superuser reads the standby's passfile")
		} else {
			t.Log("the branch role is a superuser: it reads the standby's passfile (branch roles that are no superusers close this)")
		}
	}
	// As root: every file of the state directory but the passfile.
	noSecretIn(t, o.Layout.Root, pf)
	// The standby still streams: a row of the primary reaches a new branch.
	pgtest.Exec(t, p.super, "INSERT INTO t VALUES (2)")
	waitRows(t, sby, "2")
	b2, err := m.Create(ctx, alice, CreateOptions{Name: "b2", Source: "replica"})
	if err != nil {
		t.Fatal(err)
	}
	if got := pgtest.Query(t, b2.URL(), "SELECT count(*) FROM t"); got != "2" {
		t.Errorf("b2 has %s rows, want 2", got)
	}
	if l := m.List(alice).Sources[0].Lag; l == nil || !l.Streaming || l.Error != "" {
		t.Errorf("lag of a streaming standby: %+v", l)
	}

	// A standby of an earlier pgfork: the password in primary_conninfo.
	m.StopAll(ctx)
	m.Close()
	if err := cluster.Down(ctx, o.Layout, standbyReg("replica"), cluster.DownOptions{KeepData: true, Timeout: 10 * time.Second}); err != nil {
		t.Fatal(err)
	}
	old := "\nprimary_conninfo = 'user=repl password=''" + strings.ReplaceAll(replSecret, `\`, `\\\\`) + "'' host=" + p.in.SocketDir +
		" port=" + strconv.Itoa(p.in.Port) + "'\n"
	auto := filepath.Join(m.standbyDir("replica"), "postgresql.auto.conf")
	f, err := os.OpenFile(auto, os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteString(old); err != nil {
		t.Fatal(err)
	}
	f.Close()
	if data, _ := os.ReadFile(auto); !strings.Contains(string(data), replSecretMark) {
		t.Fatalf("the old-style primary_conninfo was not planted:\n%s", data)
	}
	pgtest.Exec(t, p.super, "INSERT INTO t VALUES (3)")
	m2, err := Open(ctx, o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(m2.Close)
	waitRows(t, standbyURL(t, o), "3")
	noSecretIn(t, o.Layout.Root, pf)
	for _, n := range []string{"b1", "b2"} {
		if err := m2.Delete(ctx, alice, n); err != nil {
			t.Error(err)
		}
	}
}

// TestStandbyTablespacesMapped (issue 32, F15): the base backup of a
// primary with a tablespace in a directory of its own maps it into the
// standby's directory in the state directory: nothing is written at the
// primary's path (here on the same host: nothing of root's appears there
// and its contents stay the primary's), the standby's tablespace is the
// run-as user's, the standby starts and a branch of it reads the
// tablespace's table; the branch's tablespace is in the state directory.
func TestStandbyTablespacesMapped(t *testing.T) {
	t.Parallel() // see env
	ctx := context.Background()
	b := pgtest.Builds(t, 0)[0]
	dir := testenv.XFSDir(t)
	p := startPrimary(t, b, dir, false, true)
	listing := func() string {
		var names []string
		_ = filepath.WalkDir(p.ts, func(q string, d fs.DirEntry, err error) error {
			if err != nil {
				return nil
			}
			if info, err := d.Info(); err == nil && info.Sys().(*syscall.Stat_t).Uid == 0 && b.User != nil {
				t.Errorf("%s at the primary's tablespace path belongs to root", q)
			}
			if d.IsDir() {
				names = append(names, q)
			}
			return nil
		})
		return strings.Join(names, "\n")
	}
	before := listing()
	m, o := standbyManager(t, b, dir, p)
	if after := listing(); after != before {
		t.Errorf("the primary's tablespace directory changed:\n%s\nwas\n%s", after, before)
	}
	oid := pgtest.Query(t, p.super, "SELECT oid FROM pg_tablespace WHERE spcname = 'ts'")
	mine := filepath.Join(m.standbyTablespaces("replica"), oid)
	fi, err := os.Stat(mine)
	if err != nil {
		t.Fatalf("the standby's copy of the tablespace: %v", err)
	}
	if b.User != nil && int(fi.Sys().(*syscall.Stat_t).Uid) != b.User.UID {
		t.Errorf("%s belongs to uid %d, want the run-as user's", mine, fi.Sys().(*syscall.Stat_t).Uid)
	}
	if link, err := os.Readlink(filepath.Join(m.standbyDir("replica"), "pg_tblspc", oid)); err != nil || link != mine {
		t.Errorf("the standby's pg_tblspc/%s: %q %v, want %s", oid, link, err, mine)
	}
	sby := standbyURL(t, o)
	if got := pgtest.Query(t, sby, "SELECT x FROM tt"); got != "42" {
		t.Errorf("the standby's tablespace table: %s", got)
	}
	br, err := m.Create(ctx, Caller{Token: "alice"}, CreateOptions{Name: "b1", Source: "replica"})
	if err != nil {
		t.Fatal(err)
	}
	if got := pgtest.Query(t, br.URL(), "SELECT x FROM tt"); got != "42" {
		t.Errorf("the branch's tablespace table: %s", got)
	}
	loc := pgtest.Query(t, br.URL(), "SELECT pg_tablespace_location(oid) FROM pg_tablespace WHERE spcname = 'ts'")
	if !strings.HasPrefix(loc, o.Layout.Root+"/") {
		t.Errorf("the branch's tablespace is at %s, outside the state directory %s", loc, o.Layout.Root)
	}
	pgtest.Exec(t, br.URL(), "INSERT INTO tt VALUES (43)")
	if got := pgtest.Query(t, sby, "SELECT count(*) FROM tt"); got != "1" {
		t.Errorf("a branch's write reached the standby's tablespace: %s rows", got)
	}
}

// TestStandbyManagedBuildStreams (issue 32, F7): a standby run by a build
// of `pgfork pg install` (PostgreSQL 17 or newer from the test
// environment; its primary of the same build) streams: a row written on
// the primary after the standby was made shows in a new branch. Once its
// primary is gone, the standby is reported not streaming (lag.streaming
// false, lag.error "not streaming ...", pgfork_branch_source_streaming 0).
func TestStandbyManagedBuildStreams(t *testing.T) {
	ctx := context.Background()
	var b pgtest.Build
	for _, x := range pgtest.Builds(t, 17) {
		if _, err := os.Stat(filepath.Join(filepath.Dir(x.Bin), "lib", "libpq.so.5")); err == nil {
			b = x
			break
		}
	}
	if b.Bin == "" {
		t.Skip("no managed build of PostgreSQL 17 or newer in the test environment")
	}
	dir := testenv.XFSDir(t)
	p := startPrimary(t, b, dir, true, false)
	m, o := standbyManager(t, b, dir, p)
	sby := standbyURL(t, o)
	pgtest.Exec(t, p.super, "INSERT INTO t VALUES (2)")
	waitRows(t, sby, "2")
	me := Caller{Token: "me"}
	br, err := m.Create(ctx, me, CreateOptions{Name: "b1", Source: "replica"})
	if err != nil {
		t.Fatal(err)
	}
	if got := pgtest.Query(t, br.URL(), "SELECT count(*) FROM t"); got != "2" {
		t.Errorf("a branch of the source has %s rows, want 2", got)
	}
	if l := m.List(me).Sources[0].Lag; l == nil || !l.Streaming || l.Error != "" {
		t.Errorf("lag of a streaming standby: %+v", l)
	}
	streamingMetric := func() float64 {
		reg := prometheus.NewRegistry()
		reg.MustRegister(m.Collector())
		mfs, err := reg.Gather()
		if err != nil {
			t.Fatal(err)
		}
		for _, mf := range mfs {
			if mf.GetName() == "pgfork_branch_source_streaming" {
				return mf.GetMetric()[0].GetGauge().GetValue()
			}
		}
		t.Fatal("no pgfork_branch_source_streaming metric")
		return -1
	}
	if v := streamingMetric(); v != 1 {
		t.Errorf("pgfork_branch_source_streaming of a streaming standby: %v", v)
	}
	// The primary goes away.
	defer func(g time.Duration) { notStreamingGrace = g }(notStreamingGrace)
	notStreamingGrace = 2 * time.Second
	pgtest.Stop(t, p.in)
	var l *Lag
	for deadline := time.Now().Add(time.Minute); ; time.Sleep(200 * time.Millisecond) {
		l = m.List(me).Sources[0].Lag
		if l != nil && strings.HasPrefix(l.Error, NotStreaming) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("a standby whose primary is gone is not reported: %+v", l)
		}
	}
	if l.Streaming {
		t.Errorf("lag.streaming true with the primary gone: %+v", l)
	}
	t.Logf("reported: %s", l.Error)
	if v := streamingMetric(); v != 0 {
		t.Errorf("pgfork_branch_source_streaming with the primary gone: %v", v)
	}
}

// queryRow runs q on url and scans its one row into dst, within a minute
// (what a loaded machine may make of a connection and a query).
func queryRow(url, q string, dst any) error {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	c, err := pgx.Connect(ctx, url)
	if err != nil {
		return err
	}
	defer c.Close(context.Background())
	return c.QueryRow(ctx, q).Scan(dst)
}

// pgQuote quotes s as an SQL string literal.
func pgQuote(s string) string { return "'" + strings.ReplaceAll(s, "'", "''") + "'" }
