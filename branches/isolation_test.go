package branches

import (
	"context"
	"errors"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pgfork/pgfork/cluster"
	"github.com/pgfork/pgfork/instance"
	"github.com/pgfork/pgfork/internal/errs"
	"github.com/pgfork/pgfork/internal/pgtest"
	"github.com/pgfork/pgfork/internal/statedir"
	"github.com/pgfork/pgfork/internal/testenv"
)

// sourceRoles are the roles and tables of the application in the source of
// the isolation tests: app_owner owns accounts, app logs in with a
// password; ops reaches the host (pg_execute_server_program), via_ops
// through ops, boss is a superuser, migrator has CREATEROLE (as good as a
// superuser before PostgreSQL 16). seed belongs to the bootstrap superuser.
var sourceRoles = []string{
	"CREATE ROLE app_owner NOLOGIN",
	"CREATE ROLE app LOGIN PASSWORD 'app-secret' IN ROLE app_owner",
	"CREATE ROLE ops NOLOGIN IN ROLE pg_execute_server_program",
	"CREATE ROLE via_ops NOLOGIN IN ROLE ops",
	"CREATE ROLE boss NOLOGIN SUPERUSER",
	"CREATE ROLE migrator NOLOGIN CREATEROLE",
	"CREATE TABLE accounts (id int PRIMARY KEY, balance int)",
	"INSERT INTO accounts VALUES (1, 100)",
	"ALTER TABLE accounts OWNER TO app_owner",
}

// isolationEnv is env on build b, the source holding sourceRoles; it
// returns the source's server too.
func isolationEnv(t *testing.T, b pgtest.Build) (Options, *instance.Instance) {
	t.Helper()
	dir := testenv.XFSDir(t)
	src := filepath.Join(dir, "src")
	pgtest.InitDB(t, src, b.Server())
	in := pgtest.Start(t, src, b.Server())
	pgtest.Exec(t, in.ConnString("", ""), append([]string{"CREATE TABLE seed (id int)", "INSERT INTO seed VALUES (1)"}, sourceRoles...)...)
	return Options{Layout: statedir.Layout{Root: filepath.Join(dir, "state")}, Installation: b.Inst, User: b.User,
		Sources:     []Source{{Name: "prod", Kind: SourceCluster, DataDir: src, ConnString: in.ConnString("", "")}},
		AdminTokens: []string{"admin"}}, in
}

// sqlErr runs one statement on a new connection to url and returns its
// error (nil when it ran).
func sqlErr(url, sql string) error {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	c, err := pgx.Connect(ctx, url)
	if err != nil {
		return err
	}
	defer c.Close(ctx)
	_, err = c.Exec(ctx, sql)
	return err
}

// sqlState is the SQLSTATE of a server's error ("" for another error).
func sqlState(err error) string {
	var pe *pgconn.PgError
	if errors.As(err, &pe) {
		return pe.Code
	}
	return ""
}

// refused wants sql, run as the branch's role, refused for want of
// privilege (SQLSTATE 42501).
func refused(t *testing.T, url, sql string) {
	t.Helper()
	if err := sqlErr(url, sql); sqlState(err) != "42501" {
		t.Errorf("the branch's role ran %s: %v; want permission denied (42501)", sql, err)
	}
}

// superSocket is the bootstrap superuser's URL on a branch's private
// socket (what pgfork itself uses).
func superSocket(t *testing.T, m *Manager, branch string) string {
	t.Helper()
	e, err := cluster.Get(m.o.Layout, regName(branch))
	if err != nil {
		t.Fatal(err)
	}
	return (&instance.Instance{SocketDir: e.SocketDir, Port: e.Port}).ConnString("", "")
}

// TestBranchRoleIsNoSuperuser: as a branch token holder would, connected
// with the branch's URL (its own role), nothing reaches the host, the
// source or another branch: COPY ... FROM PROGRAM (psql on the source's
// socket, on Bob's branch's socket), pg_read_file, lo_import, ALTER
// SYSTEM, SET ROLE to a superuser, granting oneself a role that reaches
// the host are refused, and the source's password hashes are gone. The
// role still does what work on a copy of the application needs: reads and
// writes every table (the superuser's too), ALTERs the application
// owner's table, creates tables, schemas and databases. A role given
// superuser and pg_execute_server_program (as a branch made before branch
// roles stopped being superusers) loses them at the branch's next start.
// The source is unchanged. On every build: CREATEROLE differs before 16.
func TestBranchRoleIsNoSuperuser(t *testing.T) {
	t.Parallel() // see env
	pgtest.ForEachBuild(t, 0, func(t *testing.T, bld pgtest.Build) {
		ctx := context.Background()
		o, src := isolationEnv(t, bld)
		m := open(t, o)
		alice, bob := Caller{Token: "alice"}, Caller{Token: "bob"}
		a1, err := m.Create(ctx, alice, CreateOptions{Name: "a1", Source: "prod"})
		if err != nil {
			t.Fatal(err)
		}
		b1, err := m.Create(ctx, bob, CreateOptions{Name: "b1", Source: "prod"})
		if err != nil {
			t.Fatal(err)
		}
		url := a1.URL()
		if got := pgtest.Query(t, url, "SELECT rolsuper::text || rolreplication::text FROM pg_roles WHERE rolname = current_user"); got != "falsefalse" {
			t.Fatalf("the branch's role: rolsuper, rolreplication = %s, want false, false", got)
		}
		major, _ := strconv.Atoi(pgtest.Query(t, url, "SELECT (current_setting('server_version_num')::int / 10000)::text"))
		member := func(role string) bool {
			t.Helper()
			return pgtest.Query(t, url, "SELECT pg_has_role(current_user, '"+role+"', 'MEMBER')::text") == "true"
		}
		for role, want := range map[string]bool{"pg_read_all_data": true, "pg_write_all_data": true, "app_owner": true, "app": true,
			"migrator": major >= 16, "ops": false, "via_ops": false, "boss": false, "pg_execute_server_program": false,
			"pg_read_server_files": false, "pg_write_server_files": false, "postgres": false, "pg_checkpoint": true} {
			if got := member(role); got != want {
				t.Errorf("the branch's role is a member of %s: %v, want %v", role, got, want)
			}
		}

		// What the token holder must not do.
		psql := filepath.Join(bld.Bin, "psql")
		be, _ := cluster.Get(m.o.Layout, regName("b1"))
		pgtest.Exec(t, url, "CREATE TABLE pwn (line text)")
		refused(t, url, "COPY pwn FROM PROGRAM '"+psql+" -h "+src.SocketDir+" -p "+strconv.Itoa(src.Port)+
			" -U postgres -d postgres -Atc \"INSERT INTO seed VALUES (666)\"'")
		refused(t, url, "COPY pwn FROM PROGRAM '"+psql+" -h "+be.SocketDir+" -p "+strconv.Itoa(be.Port)+
			" -U postgres -d postgres -Atc \"ALTER ROLE "+b1.Role+" PASSWORD ''stolen''\"'")
		refused(t, url, "COPY pwn TO '/tmp/pgfork-pwn'")
		refused(t, url, "SELECT pg_read_file('postgresql.auto.conf')")
		refused(t, url, "SELECT pg_read_file('/etc/passwd')")
		refused(t, url, "SELECT lo_import('/etc/passwd')")
		refused(t, url, "ALTER SYSTEM SET work_mem = '1MB'")
		refused(t, url, "SET ROLE postgres")
		refused(t, url, "SET ROLE boss")
		refused(t, url, "SET ROLE ops")
		refused(t, url, "GRANT pg_execute_server_program TO current_user")
		refused(t, url, "CREATE ROLE evil SUPERUSER")
		refused(t, url, "ALTER ROLE current_user SUPERUSER")
		if err := sqlErr(url, "ALTER ROLE migrator CREATEROLE"); err == nil {
			t.Error("the branch's role altered another role")
		}
		// The source's password hashes are not in the branch (pg_read_all_data reads pg_authid).
		if got := pgtest.Query(t, url, "SELECT count(*)::text FROM pg_authid WHERE rolpassword IS NOT NULL AND rolname <> current_user"); got != "0" {
			t.Errorf("%s roles other than the branch's keep a password hash in the branch", got)
		}
		if got := pgtest.Query(t, b1.URL(), "SELECT current_user"); got != b1.Role {
			t.Errorf("bob's branch answers as %s", got)
		}

		// What work on the copy needs.
		pgtest.Exec(t, url,
			"INSERT INTO seed VALUES (2)", "UPDATE seed SET id = 3 WHERE id = 2", "DELETE FROM seed WHERE id = 3",
			"INSERT INTO accounts VALUES (2, 5)", "UPDATE accounts SET balance = 0 WHERE id = 1", "DELETE FROM accounts WHERE id = 2",
			"ALTER TABLE accounts ADD COLUMN note text", "CREATE INDEX ON accounts (balance)",
			"ALTER TABLE accounts RENAME COLUMN note TO remark",
			"CREATE TABLE mine (x int)", "INSERT INTO mine VALUES (1)", "CREATE SCHEMA work", "CREATE TABLE work.t (x int)",
			"CREATE DATABASE scratch", "CHECKPOINT")
		if got := pgtest.Query(t, url, "SELECT count(*)::text FROM seed"); got != "1" {
			t.Errorf("seed in the branch has %s rows, want 1", got)
		}
		scratch := strings.Replace(url, "/postgres?", "/scratch?", 1)
		pgtest.Exec(t, scratch, "CREATE TABLE s (x int)", "INSERT INTO s VALUES (1)")
		if major >= 16 {
			pgtest.Exec(t, url, "CREATE ROLE reader NOLOGIN", "GRANT SELECT ON mine TO reader")
		}

		// A branch role left superuser with a role that reaches the host
		// (self-granted; on 16+ also granted by another superuser than the bootstrap
		// superuser) is no more at the next start.
		pgtest.Exec(t, superSocket(t, m, "a1"), "ALTER ROLE "+a1.Role+" SUPERUSER")
		pgtest.Exec(t, url, "GRANT pg_execute_server_program TO current_user", "GRANT boss TO current_user")
		if major >= 16 {
			pgtest.Exec(t, url, "GRANT pg_read_server_files TO boss WITH ADMIN OPTION", "GRANT pg_read_server_files TO current_user GRANTED BY boss")
		}
		if _, err := m.Stop(ctx, alice, "a1"); err != nil {
			t.Fatal(err)
		}
		if _, err := m.Start(ctx, alice, "a1"); err != nil {
			t.Fatal(err)
		}
		if got := pgtest.Query(t, url, "SELECT rolsuper::text FROM pg_roles WHERE rolname = current_user"); got != "false" {
			t.Error("the branch's role is still a superuser after a start")
		}
		for _, role := range []string{"pg_execute_server_program", "pg_read_server_files", "boss"} {
			if member(role) {
				t.Errorf("after a start the branch's role is still a member of %s", role)
			}
		}
		refused(t, url, "SELECT pg_read_file('postgresql.auto.conf')")
		if got := pgtest.Query(t, url, "SELECT count(*)::text FROM mine"); got != "1" {
			t.Errorf("after a start mine has %s rows", got)
		}

		// The source saw none of it.
		s := src.ConnString("", "")
		if got := pgtest.Query(t, s, "SELECT count(*)::text FROM seed"); got != "1" {
			t.Errorf("the source's seed has %s rows, want 1", got)
		}
		if got := pgtest.Query(t, s, "SELECT string_agg(balance::text, ',') FROM accounts"); got != "100" {
			t.Errorf("the source's accounts: %s, want 100", got)
		}
		if got := pgtest.Query(t, s, "SELECT count(*)::text FROM pg_attribute WHERE attrelid = 'accounts'::regclass AND attname = 'remark'"); got != "0" {
			t.Error("the source's accounts got the branch's column")
		}
		if got := pgtest.Query(t, s, "SELECT (rolpassword IS NOT NULL)::text FROM pg_authid WHERE rolname = 'app'"); got != "true" {
			t.Error("the source's role app lost its password")
		}
	})
}

// TestBranchSnapshotIsTheOwners: a snapshot of Alice's branch is hers
// (and the admin's): Bob does not list it, cannot branch it nor delete it
// (404 as for a missing one); the admin can branch it, and in that branch
// Alice's role (carried by the snapshot) does not log in with her
// password while the admin's branch role does, and reaches the table
// Alice's role made there (it is a member of her role, now NOLOGIN).
// Snapshots of a source stay every token's to see and branch.
func TestBranchSnapshotIsTheOwners(t *testing.T) {
	t.Parallel() // see env
	ctx := context.Background()
	o, _ := isolationEnv(t, pgtest.Builds(t, 0)[0])
	m := open(t, o)
	alice, bob, admin := Caller{Token: "alice"}, Caller{Token: "bob"}, Caller{Token: "admin"}
	a1, err := m.Create(ctx, alice, CreateOptions{Name: "a1", Source: "prod"})
	if err != nil {
		t.Fatal(err)
	}
	pgtest.Exec(t, a1.URL(), "CREATE TABLE alice_t (x int)", "INSERT INTO alice_t VALUES (1)")
	if _, err := m.CreateSnapshot(ctx, alice, SnapshotOptions{Name: "alice-s", Branch: "a1"}); err != nil {
		t.Fatal(err)
	}
	if _, err := m.CreateSnapshot(ctx, alice, SnapshotOptions{Name: "prod-s", Source: "prod"}); err != nil {
		t.Fatal(err)
	}
	names := func(c Caller) string {
		var n []string
		for _, s := range m.List(c).Snapshots {
			n = append(n, s.Name)
		}
		slices.Sort(n)
		return strings.Join(n, ",")
	}
	if got := names(bob); got != "prod-s" {
		t.Errorf("bob lists snapshots %q, want only the source's prod-s", got)
	}
	for _, c := range []Caller{alice, admin} {
		if got := names(c); got != "alice-s,prod-s" {
			t.Errorf("%s lists snapshots %q, want alice-s,prod-s", c.Token, got)
		}
	}
	_, err = m.Create(ctx, bob, CreateOptions{Name: "b1", Snapshot: "alice-s"})
	wantKind(t, "bob branches alice's branch snapshot", err, errs.NotFound)
	if err != nil && !strings.Contains(err.Error(), "no snapshot named") {
		t.Errorf("bob branching alice's branch snapshot: %v, want no snapshot named", err)
	}
	wantKind(t, "bob deletes alice's branch snapshot", m.DeleteSnapshot(bob, "alice-s"), errs.NotFound)
	wantKind(t, "bob deletes alice's source snapshot", m.DeleteSnapshot(bob, "prod-s"), errs.NotFound)
	b1, err := m.Create(ctx, bob, CreateOptions{Name: "b1", Snapshot: "prod-s"})
	if err != nil {
		t.Fatalf("bob branches alice's snapshot of the source: %v", err)
	}
	if got := pgtest.Query(t, b1.URL(), "SELECT count(*)::text FROM seed"); got != "1" {
		t.Errorf("bob's branch of prod-s: seed has %s rows", got)
	}

	adm, err := m.Create(ctx, admin, CreateOptions{Name: "adm", Snapshot: "alice-s"})
	if err != nil {
		t.Fatal(err)
	}
	stolen := a1
	stolen.Port = adm.Port
	if err := tryQuery(stolen.URL()); err == nil {
		t.Error("alice's role and password log in to the admin's branch of her snapshot")
	} else if st := sqlState(err); st != "28P01" && st != "28000" {
		t.Errorf("alice logging in to the admin's branch: %v, want an authentication failure", err)
	}
	if got := pgtest.Query(t, adm.URL(), "SELECT count(*)::text FROM alice_t"); got != "1" {
		t.Errorf("the admin's branch: alice_t has %s rows, want 1", got)
	}
	pgtest.Exec(t, adm.URL(), "ALTER TABLE alice_t ADD COLUMN y int")
	if got := pgtest.Query(t, adm.URL(), "SELECT rolcanlogin::text FROM pg_roles WHERE rolname = '"+a1.Role+"'"); got != "false" {
		t.Errorf("alice's role in the admin's branch: rolcanlogin %s", got)
	}
	if got := pgtest.Query(t, a1.URL(), "SELECT current_user"); got != a1.Role {
		t.Errorf("alice's own branch answers as %s", got)
	}
}

// TestRetainPerOwner: `snapshot --keep N` counts and removes only the
// caller's own snapshots of that source: Bob's keep leaves Alice's and
// the admin's scheduled ones alone, Alice's leaves Bob's.
func TestRetainPerOwner(t *testing.T) {
	t.Parallel() // see env
	ctx := context.Background()
	m := open(t, env(t))
	alice, bob := Caller{Token: "alice"}, Caller{Token: "bob"}
	take := func(c Caller, name string, keep int) {
		t.Helper()
		if _, err := m.CreateSnapshot(ctx, c, SnapshotOptions{Name: name, Source: "prod", Keep: keep}); err != nil {
			t.Fatal(err)
		}
	}
	take(alice, "a-1", 0)
	take(alice, "a-2", 0)
	sched, err := m.ScheduledSnapshot(ctx, "prod", 1)
	if err != nil {
		t.Fatal(err)
	}
	take(bob, "b-1", 1)
	take(bob, "b-2", 1)
	take(alice, "a-3", 2)
	var got []string
	for _, s := range m.List(Caller{Token: "admin"}).Snapshots {
		got = append(got, s.Name)
	}
	slices.Sort(got)
	want := []string{"a-2", "a-3", "b-2", sched.Name}
	slices.Sort(want)
	if !slices.Equal(got, want) {
		t.Errorf("snapshots kept: %v, want %v (each owner's newest)", got, want)
	}
}

// TestBranchHoldsNoOtherSystemsCredentials: the credentials of other
// systems that the source keeps in its catalogs — a logical
// subscription's connection string, a user mapping's password, in any
// database — are gone from a branch, as its role (which reads every
// catalog through pg_read_all_data) looks for them; the subscription no
// longer exists there (it would take changes from the publisher's slot),
// no logical replication worker runs; the source keeps both. And the
// application's objects a superuser owns are the branch role's there.
func TestBranchHoldsNoOtherSystemsCredentials(t *testing.T) {
	t.Parallel() // see env
	ctx := context.Background()
	o, src := isolationEnv(t, pgtest.Builds(t, 0)[0])
	pgtest.Exec(t, src.ConnString("", ""), "CREATE DATABASE appdb")
	for _, db := range []string{"postgres", "appdb"} {
		pgtest.Exec(t, src.ConnString("", db),
			"CREATE FOREIGN DATA WRAPPER other_fdw",
			"CREATE SERVER other FOREIGN DATA WRAPPER other_fdw OPTIONS (host 'billing.internal')",
			"CREATE USER MAPPING FOR PUBLIC SERVER other OPTIONS (user 'billing', password 'UMSECRET-"+db+"')",
			"CREATE USER MAPPING FOR app SERVER other OPTIONS (user 'app', password 'UMSECRET2-"+db+"')")
	}
	pgtest.Exec(t, src.ConnString("", "appdb"),
		"CREATE TABLE orders (id serial PRIMARY KEY, note text)", "INSERT INTO orders (note) VALUES ('x')",
		"CREATE SCHEMA billing", "CREATE TABLE billing.invoices (id bigint GENERATED ALWAYS AS IDENTITY, total int)",
		"CREATE TYPE mood AS ENUM ('ok')", "CREATE FUNCTION answer() RETURNS int LANGUAGE sql AS 'SELECT 42'")
	pgtest.Exec(t, src.ConnString("", "appdb"), "CREATE SUBSCRIPTION upstream CONNECTION 'host=127.0.0.1 port=1 user=repl password=SUBSECRET dbname=x' "+
		"PUBLICATION p WITH (connect = false)")
	m := open(t, o)
	b, err := m.Create(ctx, Caller{Token: "alice"}, CreateOptions{Name: "a1", Source: "prod"})
	if err != nil {
		t.Fatal(err)
	}
	leaks := func(url string) string {
		t.Helper()
		return pgtest.Query(t, url, `SELECT (SELECT count(*) FROM pg_subscription)::text || ',' ||
			(SELECT count(*) FROM pg_user_mapping WHERE array_to_string(umoptions, ',') LIKE '%SECRET%')::text`)
	}
	appURL := func(u string) string { return strings.Replace(u, "/postgres?", "/appdb?", 1) }
	if !strings.Contains(b.URL(), "/postgres?") {
		t.Fatalf("branch URL %s does not name database postgres", b.URL())
	}
	for _, u := range []string{b.URL(), appURL(b.URL())} {
		if got := leaks(u); got != "0,0" {
			t.Errorf("as the branch's role on %s: subscriptions, user mappings with a password = %s, want 0,0", u, got)
		}
	}
	if got := pgtest.Query(t, b.URL(), "SHOW max_logical_replication_workers"); got != "0" {
		t.Errorf("max_logical_replication_workers = %s in a branch, want 0", got)
	}
	// The user mappings stay (without their password), and the source keeps everything.
	if got := pgtest.Query(t, appURL(b.URL()), "SELECT count(*)::text FROM pg_user_mapping"); got != "2" {
		t.Errorf("user mappings in the branch's appdb: %s, want 2 (without passwords)", got)
	}
	for _, db := range []string{"postgres", "appdb"} {
		want := "1,2"
		if got := leaks(src.ConnString("", db)); got != want {
			t.Errorf("the source's %s: subscriptions, user mappings with a password = %s, want %s", db, got, want)
		}
	}
	// The application's objects a superuser owns (migrations run as
	// postgres) are the branch role's: it alters, truncates and replaces
	// them, in every database; the source keeps its owners.
	pgtest.Exec(t, b.URL(), "TRUNCATE seed", "ALTER TABLE seed ADD COLUMN note text")
	pgtest.Exec(t, appURL(b.URL()), "TRUNCATE orders", "ALTER TABLE orders ADD COLUMN due date", "INSERT INTO orders (note) VALUES ('y')",
		"ALTER TABLE billing.invoices ADD COLUMN paid bool", "INSERT INTO billing.invoices (total) VALUES (1)",
		"ALTER TYPE mood ADD VALUE 'great'", "CREATE OR REPLACE FUNCTION answer() RETURNS int LANGUAGE sql AS 'SELECT 43'",
		"CREATE TABLE billing.refunds (id int)")
	if got := pgtest.Query(t, src.ConnString("", "appdb"), "SELECT pg_get_userbyid(relowner)::text FROM pg_class WHERE relname = 'orders'"); got != "postgres" {
		t.Errorf("the source's orders table belongs to %s now, want postgres", got)
	}
	// A reset (a new copy of the snapshot) is scrubbed again.
	if _, err := m.Reset(ctx, Caller{Token: "alice"}, "a1"); err != nil {
		t.Fatal(err)
	}
	if got := leaks(appURL(b.URL())); got != "0,0" {
		t.Errorf("after a reset: subscriptions, user mappings with a password = %s, want 0,0", got)
	}
}

// TestBranchScrubsClosedDatabases (issue 57, G7): a database of the source
// closed to connections (datallowconn false) is scrubbed like every other.
// Its subscription, whose connection string with the publisher's password
// sits in pg_subscription (a shared catalog the branch's role reads from
// any database), is gone, and so is its user mappings' password. The
// database is closed again in the branch, and when the branch's role reopens
// it (it owns it through app_owner) it finds nothing. The source keeps
// everything, the database closed.
func TestBranchScrubsClosedDatabases(t *testing.T) {
	t.Parallel() // see env
	ctx := context.Background()
	o, src := isolationEnv(t, pgtest.Builds(t, 0)[0])
	pgtest.Exec(t, src.ConnString("", ""), "CREATE DATABASE closed OWNER app_owner")
	pgtest.Exec(t, src.ConnString("", "closed"),
		"CREATE FOREIGN DATA WRAPPER other_fdw",
		"CREATE SERVER other FOREIGN DATA WRAPPER other_fdw OPTIONS (host 'billing.internal')",
		"CREATE USER MAPPING FOR PUBLIC SERVER other OPTIONS (user 'billing', password 'UMSECRET')",
		"CREATE USER MAPPING FOR app SERVER other OPTIONS (user 'app', password 'UMSECRET2')")
	pgtest.Exec(t, src.ConnString("", "closed"), "CREATE SUBSCRIPTION hidden CONNECTION 'host=127.0.0.1 port=1 user=repl password=SUBSECRET dbname=x' "+
		"PUBLICATION p WITH (connect = false)")
	pgtest.Exec(t, src.ConnString("", ""), "ALTER DATABASE closed ALLOW_CONNECTIONS false")
	m := open(t, o)
	b, err := m.Create(ctx, Caller{Token: "alice"}, CreateOptions{Name: "a1", Source: "prod"})
	if err != nil {
		t.Fatal(err)
	}
	url := b.URL()
	if got := pgtest.Query(t, url, "SELECT count(*)::text FROM pg_subscription"); got != "0" {
		t.Errorf("the branch's role sees %s subscriptions (with their connection strings) from database postgres, want 0", got)
	}
	if got := pgtest.Query(t, url, "SELECT string_agg(datname, ',' ORDER BY datname) FROM pg_database WHERE NOT datallowconn"); got != "closed,template0" {
		t.Errorf("databases closed to connections in the branch: %s, want closed,template0 (as in the source)", got)
	}
	pgtest.Exec(t, url, "ALTER DATABASE closed ALLOW_CONNECTIONS true")
	closed := strings.Replace(url, "/postgres?", "/closed?", 1)
	if got := pgtest.Query(t, closed, `SELECT count(*)::text || ',' || count(*) FILTER (WHERE array_to_string(umoptions, ',') LIKE '%SECRET%')::text
		FROM pg_user_mapping`); got != "2,0" {
		t.Errorf("in the reopened database: user mappings, those with a password = %s, want 2,0", got)
	}
	s := src.ConnString("", "")
	if got := pgtest.Query(t, s, "SELECT count(*)::text FROM pg_subscription WHERE subconninfo LIKE '%SUBSECRET%'"); got != "1" {
		t.Errorf("the source has %s subscriptions with their password, want 1", got)
	}
	if got := pgtest.Query(t, s, "SELECT datallowconn::text FROM pg_database WHERE datname = 'closed'"); got != "false" {
		t.Errorf("the source's database closed: datallowconn %s, want false", got)
	}
}

// allowedPredefined are the predefined roles docs/branches.md lets a
// branch's role hold (grantedRoles, written out again here on purpose).
const allowedPredefined = "'pg_read_all_data', 'pg_write_all_data', 'pg_read_all_stats', 'pg_signal_backend', 'pg_checkpoint'"

// TestBranchRoleReachesNothingInherited (issue 57, G9): the roles of the
// source hand a branch's role no power beyond docs/branches.md's list. The
// source has repl (REPLICATION, a member of pg_read_all_settings) granted to
// app_owner, which the branch's role is a member of; keeper, which
// administers pg_monitor (on 16 and later by an ADMIN-only grant, neither
// INHERIT nor SET); and pg_read_all_stats, which docs/branches.md grants,
// made a member of pg_read_all_settings. In the branch the role reads no
// superuser-only setting and creates no replication slot, not after SET
// ROLE repl either (a logical slot asks for the same REPLICATION, after
// wal_level), and grants itself no predefined role through keeper;
// no role it reaches (member of, SET ROLE to, administers; a recursive
// walk of pg_auth_members and pg_has_role agree) has SUPERUSER or
// REPLICATION or is a predefined role outside the list. It still SETs ROLE
// repl and app_owner. The source keeps its roles as they were.
func TestBranchRoleReachesNothingInherited(t *testing.T) {
	t.Parallel() // see env
	pgtest.ForEachBuild(t, 0, func(t *testing.T, bld pgtest.Build) {
		ctx := context.Background()
		o, src := isolationEnv(t, bld)
		s := src.ConnString("", "")
		keeper := "GRANT pg_monitor TO keeper WITH INHERIT FALSE, SET FALSE, ADMIN TRUE"
		if bld.Inst.Major < 16 {
			keeper = "GRANT pg_monitor TO keeper WITH ADMIN OPTION"
		}
		pgtest.Exec(t, s, "CREATE ROLE repl LOGIN REPLICATION PASSWORD 'repl-secret' IN ROLE pg_read_all_settings",
			"GRANT repl TO app_owner", "CREATE ROLE keeper NOLOGIN", keeper, "GRANT pg_read_all_settings TO pg_read_all_stats")
		m := open(t, o)
		b, err := m.Create(ctx, Caller{Token: "alice"}, CreateOptions{Name: "a1", Source: "prod"})
		if err != nil {
			t.Fatal(err)
		}
		url := b.URL()
		for _, q := range []string{"SHOW data_directory", "SHOW config_file",
			"SET ROLE repl; SHOW data_directory", "SET ROLE keeper; SHOW config_file",
			"SELECT pg_create_physical_replication_slot('evil')",
			"SET ROLE repl; SELECT pg_create_physical_replication_slot('evil')",
			"GRANT pg_monitor TO " + b.Role, "SET ROLE keeper; GRANT pg_monitor TO " + b.Role,
			"SET ROLE repl; GRANT pg_read_all_settings TO " + b.Role} {
			refused(t, url, q)
		}
		if got := pgtest.Query(t, url, `WITH RECURSIVE up(oid) AS (
				SELECT oid FROM pg_roles WHERE rolname = current_user
				UNION SELECT m.roleid FROM pg_auth_members m JOIN up ON m.member = up.oid)
			SELECT coalesce(string_agg(rolname, ',' ORDER BY rolname), '') FROM pg_roles
			WHERE (oid IN (SELECT oid FROM up) OR pg_has_role(current_user, oid, 'MEMBER'))
				AND (rolsuper OR rolreplication OR (rolname LIKE 'pg\_%' AND rolname NOT IN (`+allowedPredefined+`)))`); got != "" {
			t.Errorf("the branch's role reaches %s (superuser, replication or a predefined role outside docs/branches.md's list)", got)
		}
		pgtest.Exec(t, url, "SET ROLE repl", "RESET ROLE", "SET ROLE app_owner")
		if got := pgtest.Query(t, s, "SELECT rolreplication::text || ',' || pg_has_role('repl', 'pg_read_all_settings', 'MEMBER')::text || ',' || "+
			"pg_has_role('keeper', 'pg_monitor', 'MEMBER')::text || ',' || pg_has_role('pg_read_all_stats', 'pg_read_all_settings', 'MEMBER')::text "+
			"FROM pg_roles WHERE rolname = 'repl'"); got != "true,true,true,true" {
			t.Errorf("the source's roles changed: %s, want true,true,true,true", got)
		}
	})
}

// TestBranchKeepsNoFunctionGrantsOfTheSource: functions PostgreSQL keeps
// from PUBLIC (pg_init_privs: pg_ls_dir, pg_read_binary_file, ...) that the
// source granted to an application role are not the branch's through it:
// with them it read its data directory's raw files (global/1260 is
// pg_authid, dead row versions and all: the source's password hashes). In
// every database, a closed one too; the source keeps its grants.
func TestBranchKeepsNoFunctionGrantsOfTheSource(t *testing.T) {
	t.Parallel() // see env
	ctx := context.Background()
	o, src := isolationEnv(t, pgtest.Builds(t, 0)[0])
	grants := []string{"GRANT EXECUTE ON FUNCTION pg_ls_dir(text) TO app_owner",
		"GRANT EXECUTE ON FUNCTION pg_read_binary_file(text) TO app_owner WITH GRANT OPTION",
		"SET ROLE app_owner", "GRANT EXECUTE ON FUNCTION pg_read_binary_file(text) TO app", "RESET ROLE"}
	pgtest.Exec(t, src.ConnString("", ""), grants...)
	pgtest.Exec(t, src.ConnString("", ""), "CREATE DATABASE closed OWNER app_owner")
	pgtest.Exec(t, src.ConnString("", "closed"), grants...)
	pgtest.Exec(t, src.ConnString("", ""), "ALTER DATABASE closed ALLOW_CONNECTIONS false")
	m := open(t, o)
	b, err := m.Create(ctx, Caller{Token: "alice"}, CreateOptions{Name: "a1", Source: "prod"})
	if err != nil {
		t.Fatal(err)
	}
	pgtest.Exec(t, b.URL(), "ALTER DATABASE closed ALLOW_CONNECTIONS true")
	for _, url := range []string{b.URL(), strings.Replace(b.URL(), "/postgres?", "/closed?", 1)} {
		for _, q := range []string{"SELECT count(*) FROM pg_ls_dir('global')", "SELECT pg_read_binary_file('global/1260')",
			"SET ROLE app_owner; SELECT pg_read_binary_file('global/1260')", "SET ROLE app; SELECT pg_read_binary_file('global/1260')"} {
			refused(t, url, q)
		}
	}
	if got := pgtest.Query(t, src.ConnString("", ""), "SELECT has_function_privilege('app', 'pg_read_binary_file(text)', 'EXECUTE')::text"); got != "true" {
		t.Error("the source's app lost its grant on pg_read_binary_file")
	}
}
