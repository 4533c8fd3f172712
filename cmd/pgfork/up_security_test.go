package main

import (
	"context"
	"encoding/json"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgfork/pgfork/internal/pgtest"
	"github.com/pgfork/pgfork/internal/testenv"
	"github.com/pgfork/pgfork/up"
)

// TestUpTCPNeedsPassword: a cluster of `pgfork up --tcp` does not trust TCP
// connections (any local user could reach 127.0.0.1): without the password
// the connection is refused, with the printed URL it works, and the record
// holding the URL is readable by its owner only.
func TestUpTCPNeedsPassword(t *testing.T) {
	t.Parallel() // see TestMain
	p := newTestPgfk(t)
	home := p.home
	res := p.up("--tcp", "--spares", "0")
	u, err := url.Parse(res.URL)
	if err != nil {
		t.Fatal(err)
	}
	pw, ok := u.User.Password()
	if !ok || len(pw) < 16 || !strings.HasPrefix(u.Host, "127.0.0.1:") {
		t.Fatalf("TCP URL without a password: %s", res.URL)
	}
	if got := pgtest.Query(t, res.URL, "select current_user"); got != "postgres" {
		t.Errorf("with the URL's password: current_user = %q", got)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for _, bad := range []*url.Userinfo{url.User("postgres"), url.UserPassword("postgres", "wrong")} {
		v := *u
		v.User = bad
		if c, err := pgx.Connect(ctx, v.String()); err == nil {
			c.Close(ctx)
			t.Errorf("TCP connection as %s without the right password was accepted", bad)
		} else if !strings.Contains(err.Error(), "password") {
			t.Errorf("TCP connection without password: want a password failure, got %v", err)
		}
	}
	fi, err := os.Stat(filepath.Join(home, "clusters", res.Name, "cluster.json"))
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode().Perm()&0o077 != 0 {
		t.Errorf("cluster.json (holds the password) has mode %v", fi.Mode().Perm())
	}
}

// TestNumericFlagsBounded: out-of-range numbers in up, down, copy, clone and
// the refill are refused with exit 2 and a hint, before any work.
func TestNumericFlagsBounded(t *testing.T) {
	p := newTestPgfk(t)
	home := p.home
	src, dst := testenv.Dir(t), filepath.Join(testenv.Dir(t), "dst")
	key := strings.Repeat("ab", 12)
	cases := []struct {
		env  string
		args []string
		want string
	}{
		{"", []string{"up", "--spares", "17"}, "--spares"},
		{"", []string{"up", "--spares", "1000000000"}, "--spares"},
		{"", []string{"up", "--spares", "-1"}, "--spares"},
		{"PGFORK_SPARES=abc", []string{"up"}, "PGFORK_SPARES"},
		{"PGFORK_SPARES=99999", []string{"up"}, "PGFORK_SPARES"},
		{"", []string{"up", "--parent-pid", "4294967297"}, "--parent-pid"},
		{"", []string{"up", "--parent-pid", "-1"}, "--parent-pid"},
		{"", []string{"up", "--ttl", "-1s"}, "--ttl"},
		{"", []string{"up", "--ttl", "2000000h"}, "--ttl"},
		{"", []string{"down", "--all", "--timeout", "-1s"}, "--timeout"},
		{"", []string{"copy", "-j", "100000", src, dst}, "--jobs"},
		{"", []string{"clone", "-j", "-3", src, dst}, "--jobs"},
		{"", []string{"template", "refill", key, "--spares", "9999"}, "--spares"},
	}
	for _, c := range cases {
		p.extraEnv = nil
		if c.env != "" {
			p.extraEnv = []string{c.env}
		}
		r := p.run(c.args...)
		if r.code != 2 || !strings.Contains(r.stderr, c.want) || !strings.Contains(r.stderr, "e.g.") {
			t.Errorf("%s pgfork %v: exit %d, want 2 naming %s with a hint\n%s", c.env, c.args, r.code, c.want, r.stderr)
		}
	}
	if ents, _ := os.ReadDir(filepath.Join(home, "clusters")); len(ents) != 0 {
		t.Errorf("refused commands left clusters: %v", ents)
	}
	if _, err := os.Stat(dst); !os.IsNotExist(err) {
		t.Errorf("refused copy made %s", dst)
	}
}

// TestUpInitdbNoSpace: a full disk while up builds its template (initdb)
// exits 7 (no space), not 1, and leaves no template or cluster behind.
func TestUpInitdbNoSpace(t *testing.T) {
	bin := pgforkBinary(t)
	pgBin := testenv.PGBinDirs(t)[0]
	dir := testenv.SmallFSDir(t)
	home := filepath.Join(dir, "home")
	p := newPgfk(t, bin, home, pgBin)
	// Leave 12 MiB: too little for initdb (a WAL segment alone is 16 MiB).
	var st syscall.Statfs_t
	if err := syscall.Statfs(dir, &st); err != nil {
		t.Fatal(err)
	}
	free := int64(st.Bavail) * int64(st.Bsize)
	if free < 12<<20 {
		t.Skipf("the small filesystem has only %d bytes free", free)
	}
	fill := filepath.Join(dir, "fill")
	if err := os.WriteFile(fill, make([]byte, free-12<<20), 0o600); err != nil {
		t.Fatal(err)
	}
	defer os.Remove(fill)
	r := p.run("up", "--spares", "0")
	if r.code != 7 {
		t.Fatalf("up on a full disk: exit %d, want 7\n%s", r.code, r.stderr)
	}
	if !strings.Contains(r.stderr, "space") {
		t.Errorf("error does not say the disk is full:\n%s", r.stderr)
	}
	for _, sub := range []string{"templates", "clusters"} {
		ents, _ := os.ReadDir(filepath.Join(home, sub))
		for _, e := range ents {
			t.Errorf("left behind in %s: %s", sub, e.Name())
		}
	}
}

// TestTemplateSetupTCPNeedsPassword: while a template's --setup-cmd runs,
// its server listens on 127.0.0.1 (for the command's DATABASE_URL); a local
// user without the password must not get in. The command itself does, with
// DATABASE_URL and with PG* variables.
func TestTemplateSetupTCPNeedsPassword(t *testing.T) {
	t.Parallel() // see TestMain
	p := newTestPgfk(t)
	pgBin := p.pgBin
	psql := filepath.Join(pgBin, "psql")
	setup := `if env -u PGPASSWORD PGPASSFILE=/nonexistent ` + psql + ` -X -w -h 127.0.0.1 -p "$PGPORT" -U "$PGUSER" -d postgres -c "select 1"; then echo TRUSTED; exit 1; fi; ` +
		psql + ` -X -q "$DATABASE_URL" -c "create table proof (i int)" && ` + psql + ` -X -q -c "insert into proof values (1)"`
	r := p.run("up", "--json", "--spares", "0", "--setup-cmd", setup)
	if r.code != 0 {
		t.Fatalf("up with a setup command: exit %d\n%s", r.code, r.stderr)
	}
	var res up.Result
	if err := json.Unmarshal([]byte(r.stdout), &res); err != nil {
		t.Fatal(err)
	}
	if got := pgtest.Query(t, res.URL, "select count(*)::text from proof"); got != "1" {
		t.Errorf("setup command's rows: %s", got)
	}
}
