package pgdata

import (
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/pgfork/pgfork/clone"
	"github.com/pgfork/pgfork/internal/pgtest"
	"github.com/pgfork/pgfork/internal/testenv"
)

// TestResetForCloneStripsPrimaryCredentials (issue 32, F1): a copy of a
// standby whose primary_conninfo carries its primary's replication
// password (as pg_basebackup -R writes it into postgresql.auto.conf, and
// in a conf.d file postgresql.conf includes) keeps no trace of the
// password or of the primary after ResetForClone, in any file of the data
// directory, and still starts.
func TestResetForCloneStripsPrimaryCredentials(t *testing.T) {
	in := builds(t)[0]
	user := pgtest.User(t)
	src := initdb(t, in, false)
	const secret = "s3cr3t-repl-pw"
	conninfo := "user=repl password=" + secret + " host=primary.example port=5432 sslmode=prefer"
	appendTo := func(p, text string) {
		t.Helper()
		f, err := os.OpenFile(p, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o600)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := f.WriteString(text); err != nil {
			t.Fatal(err)
		}
		f.Close()
	}
	appendTo(filepath.Join(src, "postgresql.auto.conf"), "primary_conninfo = "+QuoteConf(conninfo)+"\nprimary_slot_name = 'slot1'\n")
	if err := os.Mkdir(filepath.Join(src, "conf.d"), 0o700); err != nil {
		t.Fatal(err)
	}
	appendTo(filepath.Join(src, "conf.d", "replica.conf"), "primary_conninfo = "+QuoteConf(conninfo)+"\nrestore_command = 'PGPASSWORD="+secret+" fetch %f %p'\n")
	appendTo(filepath.Join(src, "postgresql.conf"), "\ninclude_dir = 'conf.d'\n")
	dst := filepath.Join(testenv.Dir(t), "copy")
	copyTree(t, src, dst, func(string, fs.DirEntry) clone.Action { return clone.Include }, user)
	if err := ResetForClone(dst, ResetOptions{}); err != nil {
		t.Fatal(err)
	}
	err := filepath.WalkDir(dst, func(p string, d fs.DirEntry, err error) error {
		if err != nil || !d.Type().IsRegular() {
			return err
		}
		b, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		if strings.Contains(string(b), secret) || strings.Contains(string(b), "primary.example") || strings.Contains(string(b), "slot1") {
			t.Errorf("%s still names the primary or its password:\n%s", p, b)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	fi, err := os.Stat(filepath.Join(dst, "conf.d", "replica.conf"))
	if err != nil || fi.Mode().Perm() != 0o600 {
		t.Errorf("conf.d/replica.conf after the reset: %v %v, want mode 0600", fi, err)
	}
	srv := pgtest.Start(t, dst, pgtest.Server{BinDir: in.BinDir, Env: in.Env()})
	if got := pgtest.Query(t, srv.ConnString("", ""), "SELECT current_setting('primary_conninfo') || '|' || current_setting('restore_command')"); got != "|" {
		t.Errorf("the clone's primary_conninfo|restore_command: %q, want empty", got)
	}
}

// TestParseConninfo: libpq's keyword/value strings, quoted and bare, read
// back from FormatConninfo.
func TestParseConninfo(t *testing.T) {
	ps, err := ParseConninfo(`user=repl password='it''s \'q\' \\' host = h  port=5432 x=a\ b`)
	if err == nil {
		t.Fatalf("'' is not libpq quoting: %+v", ps)
	}
	ps, err = ParseConninfo(`user=repl password='it\'s \\ x' host = h  port=5432 x=a\ b`)
	if err != nil {
		t.Fatal(err)
	}
	want := []ConnParam{{"user", "repl"}, {"password", `it's \ x`}, {"host", "h"}, {"port", "5432"}, {"x", "a b"}}
	if len(ps) != len(want) {
		t.Fatalf("%+v, want %+v", ps, want)
	}
	for i := range want {
		if ps[i] != want[i] {
			t.Errorf("%d: %+v, want %+v", i, ps[i], want[i])
		}
	}
	back, err := ParseConninfo(FormatConninfo(ps))
	if err != nil || len(back) != len(ps) || back[1] != ps[1] {
		t.Errorf("round trip: %+v %v", back, err)
	}
	if _, err := ParseConninfo("user"); err == nil {
		t.Error("a keyword without a value was accepted")
	}
}

// TestWithoutPassword: primary_conninfo loses its password and names the
// passfile; other lines stay; without a passfile, one the conninfo named
// stays.
func TestWithoutPassword(t *testing.T) {
	in := "# x\n" + `primary_conninfo = 'user=repl password=''p\\\\w:d'' host=h passfile=''/old'''` + "\nport = 5\n"
	out, pw, err := WithoutPassword(in, "/state/s.pgpass")
	if err != nil {
		t.Fatal(err)
	}
	if pw != `p\w:d` {
		t.Errorf("password %q", pw)
	}
	want := "# x\nprimary_conninfo = 'user=''repl'' host=''h'' passfile=''/state/s.pgpass'''\nport = 5\n"
	if out != want {
		t.Errorf("got\n%s\nwant\n%s", out, want)
	}
	out, _, _ = WithoutPassword("primary_conninfo = 'user=repl passfile=/mine'", "")
	if out != "primary_conninfo = 'user=''repl'' passfile=''/mine'''" {
		t.Errorf("without a passfile of pgfork's: %s", out)
	}
	if got := PassfileLine(`a:b\c`); got != "*:*:*:*:a\\:b\\\\c\n" {
		t.Errorf("PassfileLine: %q", got)
	}
}
