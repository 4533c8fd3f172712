package pgdata

import (
	"strings"
	"testing"
)

// TestSplitPassword: the password leaves a URL (user information or
// parameter) and a key=value string; a passfile too; nothing else does.
func TestSplitPassword(t *testing.T) {
	for _, c := range []struct{ in, out, pw string }{
		{"postgresql://repl:s3cr%3At@db:5432/postgres?sslmode=verify-full", "postgresql://repl@db:5432/postgres?sslmode=verify-full", "s3cr:t"},
		{"postgres://repl@db/postgres?password=pw&passfile=%2Froot%2F.pgpass", "postgres://repl@db/postgres", "pw"},
		{"postgresql://repl@/postgres?host=%2Ftmp", "postgresql://repl@/postgres?host=%2Ftmp", ""},
		{"host=db user=repl password='a b' passfile=/x", "host='db' user='repl'", "a b"},
		{"host=db user=repl", "host='db' user='repl'", ""},
	} {
		out, pw, err := SplitPassword(c.in)
		if err != nil || out != c.out || pw != c.pw {
			t.Errorf("SplitPassword(%q) = %q, %q, %v; want %q, %q", c.in, out, pw, err, c.out, c.pw)
		}
	}
	if _, _, err := SplitPassword("postgresql://u:p@h:bad/"); err == nil || strings.Contains(err.Error(), "p@h") {
		t.Errorf("a bad URL: %v, want an error that does not quote it", err)
	}
}
