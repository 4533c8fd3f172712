package pgtest

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgfork/pgfork/instance"
)

// timeout bounds each of the helpers below: generous, the test machines are
// shared and slow.
const timeout = 2 * time.Minute

// Query runs sql on a new connection to url and returns the first column of
// the first row as text ("<null>" for NULL); any error fails the test.
func Query(t testing.TB, url, sql string) string {
	t.Helper()
	var s *string
	withConn(t, url, func(ctx context.Context, conn *pgx.Conn) {
		if err := conn.QueryRow(ctx, sql).Scan(&s); err != nil {
			t.Fatalf("%s: %v", sql, err)
		}
	})
	if s == nil {
		return "<null>"
	}
	return *s
}

// Exec runs each statement in turn on one new connection to url; any error
// fails the test.
func Exec(t testing.TB, url string, sqls ...string) {
	t.Helper()
	withConn(t, url, func(ctx context.Context, conn *pgx.Conn) {
		for _, s := range sqls {
			if _, err := conn.Exec(ctx, s); err != nil {
				t.Fatalf("%s: %v", s, err)
			}
		}
	})
}

// withConn calls f with a new connection to url, closed after it, and a
// context that ends after timeout.
func withConn(t testing.TB, url string, f func(ctx context.Context, conn *pgx.Conn)) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatalf("connect %s: %v", url, err)
	}
	defer conn.Close(ctx)
	f(ctx, conn)
}

// Stop stops in now (fast shutdown: a clean checkpoint), failing the test
// if it does not stop. Servers from Start are also stopped when the test
// ends; Stop is for a test that needs the data directory at rest.
func Stop(t testing.TB, in *instance.Instance) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	if err := in.Stop(ctx, instance.Fast); err != nil {
		t.Fatal(err)
	}
}

// CheckPgbenchInvariant checks the database at url after pgbench's
// tpcb-like runs: each balance sum (accounts, tellers, branches) equals the
// sum of pgbench_history's deltas, true of every consistent state. It also
// fails when the history is empty, with emptyWhy saying what that means in
// the caller's test (for example "the copy was not taken under load").
func CheckPgbenchInvariant(t testing.TB, url, emptyWhy string) {
	t.Helper()
	h := Query(t, url, "SELECT coalesce(sum(delta), 0)::text FROM pgbench_history")
	n := Query(t, url, "SELECT count(*)::text FROM pgbench_history")
	ok := n != "0"
	for _, tbl := range []string{"accounts:abalance", "tellers:tbalance", "branches:bbalance"} {
		name, col, _ := strings.Cut(tbl, ":")
		got := Query(t, url, "SELECT coalesce(sum("+col+"), 0)::text FROM pgbench_"+name)
		if got != h {
			ok = false
			t.Errorf("pgbench invariant broken: sum(%s) of pgbench_%s = %s, sum(delta) of pgbench_history = %s (%s history rows)", col, name, got, h, n)
		}
	}
	if n == "0" {
		t.Errorf("no pgbench history: %s", emptyWhy)
	}
	if ok {
		t.Logf("pgbench invariant holds: %s history rows, sum(delta) = %s", n, h)
	}
}
