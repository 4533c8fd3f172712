package pgforktest_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgfork/pgfork/clients/go/client"
	"github.com/pgfork/pgfork/clients/go/internal/sharedsuite"
	"github.com/pgfork/pgfork/clients/go/pgforktest"
)

// TestIsolation runs several parallel tests, each writing to its own
// database, and checks that none sees another's writes or an earlier test's,
// that no database is held by two tests at once, and (with the package
// internal/sharedsuite, tested in a parallel process) that the shared
// template was built exactly once.
func TestIsolation(t *testing.T) {
	var mu sync.Mutex
	held := map[string]string{} // database name → test holding it
	for i := range 8 {
		name := fmt.Sprintf("worker%d", i)
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			url := pgforktest.New(t, sharedsuite.Options())
			conn, err := pgx.Connect(t.Context(), url)
			if err != nil {
				t.Fatal(err)
			}
			var db string
			if err := conn.QueryRow(t.Context(), "SELECT current_database()").Scan(&db); err != nil {
				t.Fatal(err)
			}
			mu.Lock()
			if other, ok := held[db]; ok {
				mu.Unlock()
				t.Fatalf("database %s handed to %s while %s holds it", db, name, other)
			}
			held[db] = name
			mu.Unlock()
			t.Cleanup(func() {
				conn.Close(context.Background())
				mu.Lock()
				delete(held, db)
				mu.Unlock()
			})
			sharedsuite.CheckIsolated(t, conn, name)
		})
	}
}

// fakeFailed is a testing.TB whose test has failed, and that records its
// cleanups and logs instead of running them.
type fakeFailed struct {
	testing.TB
	cleanups []func()
	logs     []string
}

func (f *fakeFailed) Failed() bool      { return true }
func (f *fakeFailed) Cleanup(fn func()) { f.cleanups = append(f.cleanups, fn) }
func (f *fakeFailed) Logf(format string, args ...any) {
	f.logs = append(f.logs, fmt.Sprintf(format, args...))
}

// TestFailedTestKeepsDatabase checks that a failed test's database is not
// given back, that its URL is logged, and that the server keeps it outside
// the pool's count (POST …/keep).
func TestFailedTestKeepsDatabase(t *testing.T) {
	opts := sharedsuite.Options()
	f := &fakeFailed{TB: t}
	url := pgforktest.New(f, opts)
	conn, err := pgx.Connect(t.Context(), url)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := conn.Exec(t.Context(), "INSERT INTO notes VALUES ('failed', 'evidence')"); err != nil {
		t.Fatal(err)
	}
	conn.Close(t.Context())
	for i := len(f.cleanups) - 1; i >= 0; i-- {
		f.cleanups[i]()
	}
	log := strings.Join(f.logs, "\n")
	if !strings.Contains(log, url) || !strings.Contains(log, "keeping") {
		t.Fatalf("log does not name the kept database %s:\n%s", url, log)
	}

	// Had it been recreated, the evidence would be gone (or the database dropped).
	time.Sleep(1500 * time.Millisecond)
	conn, err = pgx.Connect(t.Context(), url)
	if err != nil {
		t.Fatalf("kept database is gone: %v", err)
	}
	var n int
	err = conn.QueryRow(t.Context(), "SELECT count(*) FROM notes WHERE owner = 'failed'").Scan(&n)
	conn.Close(context.Background())
	if err != nil || n != 1 {
		t.Fatalf("kept database lost its data: n=%d err=%v", n, err)
	}

	// Give it back ourselves, by the hand-out token in the log line.
	m := regexp.MustCompile(`id (\d+), hand-out ([0-9a-f]{16,})`).FindStringSubmatch(log)
	if m == nil {
		t.Fatalf("no id and hand-out token in log line: %s", log)
	}
	id, _ := strconv.Atoi(m[1])
	hash, err := pgforktest.Hash(opts)
	if err != nil {
		t.Fatal(err)
	}
	c, err := client.New(os.Getenv("PGFORK_URL"), client.WithToken(os.Getenv("PGFORK_TOKEN")))
	if err != nil {
		t.Fatal(err)
	}
	// The server was told: it counts the database as kept, outside the pool.
	l, err := c.ListTemplates(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	for _, ti := range l.Templates {
		if ti.TemplateHash == hash && ti.Kept < 1 {
			t.Fatalf("the server does not count the failed test's database as kept: %+v", ti)
		}
	}
	kept := client.TestDatabase{TemplateHash: hash, ID: id, Token: m[2]}
	if err := c.Recreate(t.Context(), kept); err != nil {
		t.Fatalf("Recreate(id %d, hand-out %s): %v", id, m[2], err)
	}
	if err := c.Recreate(t.Context(), kept); !errors.Is(err, client.ErrTestNotFound) {
		t.Fatalf("second Recreate of the kept database: err = %v, want ErrTestNotFound", err)
	}
}
