package pgforktest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/pgfork/pgfork/clients/go/client"
)

// TestUnreachableServerFails: when no server answers, New fails the test
// with a message saying where it looked and how to start a server; it does
// not skip (a suite that silently skips everything looks green).
func TestUnreachableServerFails(t *testing.T) {
	for _, tc := range []struct {
		name, from string
		opts       Options
		env        string
	}{
		{"option", "Options.ServerURL", Options{ServerURL: "http://127.0.0.1:1", ExtraKey: "unreachable/1"}, ""},
		{"env", "$PGFORK_URL", Options{ExtraKey: "unreachable/2"}, "http://127.0.0.1:1"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Setenv("PGFORK_URL", tc.env)
			_, _, err := acquire(t.Context(), tc.opts)
			var unreachable *client.UnreachableError
			if !errors.As(err, &unreachable) {
				t.Fatalf("err = %v, want an UnreachableError", err)
			}
			for _, want := range []string{"127.0.0.1:1", tc.from, "pgfork serve", "PGFORK_URL"} {
				if !strings.Contains(err.Error(), want) {
					t.Errorf("error %q does not say %q", err, want)
				}
			}

			f := &recordTB{TB: t}
			done := make(chan struct{})
			go func() {
				defer close(done)
				New(f, tc.opts)
			}()
			<-done
			if f.skipped || !strings.Contains(f.fatal, "no pgfork server answers") {
				t.Fatalf("New: skipped=%v fatal=%q; want a failure and no skip", f.skipped, f.fatal)
			}
		})
	}
}

// recordTB records Fatalf and Skip instead of ending the test.
type recordTB struct {
	testing.TB
	fatal   string
	skipped bool
}

func (r *recordTB) Helper() {}
func (r *recordTB) Fatalf(format string, args ...any) {
	r.fatal = fmt.Sprintf(format, args...)
	runtime.Goexit()
}
func (r *recordTB) Skip(args ...any) {
	r.skipped = true
	runtime.Goexit()
}

// TestFailingMigrationDiscardsTemplate: when migrating fails the template is
// discarded, so that processes waiting for it fail at once, and later tests
// of this process get the same error without migrating again.
func TestFailingMigrationDiscardsTemplate(t *testing.T) {
	if os.Getenv("PGFORK_URL") == "" {
		t.Skip("PGFORK_URL unset; clients/test.sh sets it")
	}
	b := make([]byte, 8)
	_, _ = rand.Read(b)
	calls := 0
	opts := Options{
		ExtraKey: "failing/" + hex.EncodeToString(b),
		Migrate: func(ctx context.Context, connString string) error {
			calls++
			return RunSQLFiles(ctx, connString, "testdata/broken")
		},
	}
	_, _, err := acquire(t.Context(), opts)
	if err == nil || !strings.Contains(err.Error(), "migrating template") || !strings.Contains(err.Error(), "001_broken.sql") {
		t.Fatalf("err = %v, want a migration error naming the file", err)
	}
	_, _, err2 := acquire(t.Context(), opts)
	if err2 == nil || calls != 1 {
		t.Fatalf("second acquire: err = %v, migrations run %d times; want the cached error and 1 run", err2, calls)
	}

	hash, _ := Hash(opts)
	c, err := client.New(os.Getenv("PGFORK_URL"), client.WithToken(os.Getenv("PGFORK_TOKEN")))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	defer cancel()
	_, err = c.GetTestDatabase(ctx, hash)
	if !errors.Is(err, client.ErrTemplateDiscarded) {
		t.Fatalf("GetTestDatabase after failed migration: err = %v, want ErrTemplateDiscarded (410)", err)
	}
}

// TestServeArgsRefusesUnsplittable: a PGFORK_SERVE_ARGS a shell could not
// split is an error naming the variable, not a server started without it.
func TestServeArgsRefusesUnsplittable(t *testing.T) {
	t.Setenv("PGFORK_SERVE_ARGS", `--db-prefix 'unclosed`)
	if _, err := serveArgs(); err == nil || !strings.Contains(err.Error(), "PGFORK_SERVE_ARGS") {
		t.Fatalf("serveArgs() error = %v, want one naming PGFORK_SERVE_ARGS", err)
	}
	t.Setenv("PGFORK_SERVE_ARGS", `--pool-max 16 --db-prefix "a b"`)
	got, err := serveArgs()
	if want := []string{"--pool-max", "16", "--db-prefix", "a b"}; err != nil || strings.Join(got, "|") != strings.Join(want, "|") {
		t.Fatalf("serveArgs() = %q, %v; want %q", got, err, want)
	}
}

// TestStartServe: the server Main starts answers, hands out databases, and
// is gone promptly, with its state directory, after stop.
func TestStartServe(t *testing.T) {
	bin := os.Getenv("PGFORK_BIN")
	if bin == "" {
		t.Fatal("PGFORK_BIN is not set: clients/test.sh sets it to the pgfork it built")
	}
	// Arguments for the server from PGFORK_SERVE_ARGS, split as a shell splits
	// them: the databases it hands out are named with this prefix.
	t.Setenv("PGFORK_SERVE_ARGS", `--db-prefix 'gomain'`)
	s, err := startServe(t.Context(), bin)
	if err != nil {
		t.Fatal(err)
	}
	stopped := false
	t.Cleanup(func() {
		if !stopped {
			s.stop()
		}
	})
	t.Setenv("PGFORK_URL", s.url) // PGFORK_TOKEN, if set, reaches the server and the client alike
	// In a subtest, so that the database goes back before the server stops.
	t.Run("db", func(t *testing.T) {
		var name string
		if err := DB(t, Options{ExtraKey: "autostart"}).QueryRowContext(t.Context(), "SELECT current_database()").Scan(&name); err != nil {
			t.Fatalf("query on a database of the started server: %v", err)
		}
		if !strings.HasPrefix(name, "gomain") {
			t.Errorf("the started server handed out database %q; want the prefix gomain of PGFORK_SERVE_ARGS", name)
		}
	})
	state := s.state
	start := time.Now()
	s.stop()
	stopped = true
	// The server a test run started must go when the run ends (issue 34: it
	// took 20-40 s). About 2 s besides PostgreSQL's stop, which a loaded
	// machine stretches several times: that is serve's own test's to hold
	// it to (cmd/pgfork's checkStopTime); here, only the regression.
	took := time.Since(start)
	t.Logf("the started server stopped in %s", took)
	if took > 15*time.Second {
		t.Errorf("the started server took %s to stop, want about 2 s", took)
	}
	c, _ := client.New(s.url)
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Second)
	defer cancel()
	if err := c.Healthy(ctx); err == nil {
		t.Fatal("server still answers after stop")
	}
	if _, err := os.Stat(state); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("state directory %s left behind (%v)", state, err)
	}
}
