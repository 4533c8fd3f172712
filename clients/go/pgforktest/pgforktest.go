// Package pgforktest gives each Go test its own fresh, migrated PostgreSQL
// database from a running `pgfork serve` (or IntegreSQL) server.
//
//	func TestSomething(t *testing.T) {
//		t.Parallel()
//		url := pgforktest.New(t, pgforktest.Options{MigrationsDir: "../migrations"})
//		db, err := pgx.Connect(t.Context(), url)
//		...
//	}
//
// The template is keyed by a hash of the migrations directory and ExtraKey;
// it is built once, even across packages tested in parallel: the first
// process to initialize it migrates it, the others wait for it to be
// finalized. When a test passes its database goes back to the server to be
// recreated; when it fails the database is kept and its URL is logged.
package pgforktest

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgfork/pgfork/clients/go/client"
)

// Options says which template to use and where the server is.
type Options struct {
	// MigrationsDir holds the files that shape the template. All its files are
	// hashed; by default its *.sql files (top level only) are run in name order.
	MigrationsDir string
	// ExtraKey is hashed with MigrationsDir: change it (e.g. a version of your
	// migration code) to build a new template when the files did not change.
	ExtraKey string
	// Migrate, if set, migrates the template database at connString (a
	// postgres:// URL) instead of running the .sql files of MigrationsDir.
	Migrate func(ctx context.Context, connString string) error
	// ServerURL is the server's base URL. Default: $PGFORK_URL, else
	// $INTEGRESQL_CLIENT_BASE_URL, else http://127.0.0.1:5000. When none of
	// them is set and no server answers, the test is skipped; otherwise it fails.
	ServerURL string
	// Token is sent as a Bearer token. Default: $PGFORK_TOKEN.
	Token string
	// ReadOnly returns the database unchanged to the pool after a passing test
	// (unlock) instead of having it recreated. Set it only for tests that do
	// not write.
	ReadOnly bool
}

// SetupTimeout bounds building a template (initialize, migrate, finalize).
var SetupTimeout = 10 * time.Minute

// New returns a postgres:// URL of a fresh test database cloned from the
// template described by opts, building the template first if no process has.
// It calls t.Skip or t.Fatal when it cannot. In t.Cleanup, a passing test's
// database is recreated (or unlocked with ReadOnly); a failing test's is kept
// and its URL logged. Close your connections in a t.Cleanup registered after
// New (cleanups run last-registered first).
func New(t testing.TB, opts Options) string {
	t.Helper()
	db, c, err := acquire(context.Background(), opts)
	if err != nil {
		var skip *skipError
		if errors.As(err, &skip) {
			t.Skip(skip.reason)
		}
		t.Fatalf("pgforktest: %v", err)
	}
	url := db.Config().URL()
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("pgforktest: test failed: keeping test database %s (template %s, id %d) for inspection: %s",
				db.Config().Database, db.TemplateHash, db.ID, url)
			return
		}
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		var err error
		if opts.ReadOnly {
			err = c.UnlockTestDatabase(ctx, db.TemplateHash, db.ID)
		} else {
			err = c.RecreateTestDatabase(ctx, db.TemplateHash, db.ID)
		}
		if err != nil {
			t.Errorf("pgforktest: returning test database %s: %v", db.Config().Database, err)
		}
	})
	return url
}

// Hash returns the template hash New uses for opts.
func Hash(opts Options) (string, error) {
	return client.TemplateHash(opts.MigrationsDir, opts.ExtraKey)
}

type skipError struct{ reason string }

func (e *skipError) Error() string { return e.reason }

// setup is one template's build in this process, shared by all its tests.
type setup struct {
	once sync.Once
	err  error
}

var setups sync.Map // serverURL + "\x00" + hash → *setup

// acquire builds the template if needed and gets a test database.
func acquire(ctx context.Context, opts Options) (client.TestDatabase, *client.Client, error) {
	serverURL, explicit := opts.ServerURL, opts.ServerURL != ""
	if serverURL == "" {
		serverURL = os.Getenv("PGFORK_URL")
		if serverURL == "" {
			serverURL = os.Getenv("INTEGRESQL_CLIENT_BASE_URL") // IntegreSQL's clients' variable
		}
		explicit = serverURL != ""
	}
	if serverURL == "" {
		serverURL = client.DefaultURL
	}
	token := opts.Token
	if token == "" {
		token = os.Getenv("PGFORK_TOKEN")
	}
	c, err := client.New(serverURL, client.WithToken(token))
	if err != nil {
		return client.TestDatabase{}, nil, err
	}
	hash, err := Hash(opts)
	if err != nil {
		return client.TestDatabase{}, nil, err
	}
	v, _ := setups.LoadOrStore(c.BaseURL()+"\x00"+hash, &setup{})
	s := v.(*setup)
	s.once.Do(func() {
		sctx, cancel := context.WithTimeout(ctx, SetupTimeout)
		defer cancel()
		s.err = buildTemplate(sctx, c, hash, opts)
		var unreachable *client.UnreachableError
		if errors.As(s.err, &unreachable) && !explicit {
			s.err = &skipError{fmt.Sprintf("pgforktest: no pgfork server answers at %s and PGFORK_URL is not set: "+
				"start `pgfork serve` or set PGFORK_URL (%v)", serverURL, unreachable.Err)}
		}
	})
	if s.err != nil {
		return client.TestDatabase{}, nil, s.err
	}
	db, err := c.GetTestDatabase(ctx, hash)
	if errors.Is(err, client.ErrTemplateDiscarded) {
		err = fmt.Errorf("%w (another process's migrations probably failed: see its output)", err)
	}
	if err != nil {
		return client.TestDatabase{}, nil, err
	}
	return db, c, nil
}

// buildTemplate initializes, migrates and finalizes the template, or returns
// nil at once if another process initialized it (GetTestDatabase then waits
// for it to be finalized).
func buildTemplate(ctx context.Context, c *client.Client, hash string, opts Options) error {
	tpl, err := c.InitializeTemplate(ctx, hash)
	if errors.Is(err, client.ErrTemplateAlreadyInitialized) {
		return nil
	}
	if err != nil {
		return err
	}
	migrate := opts.Migrate
	if migrate == nil {
		migrate = func(ctx context.Context, connString string) error {
			return RunSQLFiles(ctx, connString, opts.MigrationsDir)
		}
	}
	if err := migrate(ctx, tpl.Config().URL()); err != nil {
		// Discard so that waiting processes fail at once instead of timing out.
		dctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if derr := c.DiscardTemplate(dctx, hash); derr != nil {
			return fmt.Errorf("migrating template %s: %w (and discarding it: %v)", hash, err, derr)
		}
		return fmt.Errorf("migrating template %s: %w", hash, err)
	}
	return c.FinalizeTemplate(ctx, hash)
}

// RunSQLFiles runs the *.sql files directly in dir, in name order, against
// the database at connString, each file as one simple-protocol batch (so a
// file may hold many statements). An empty dir does nothing.
func RunSQLFiles(ctx context.Context, connString, dir string) error {
	if dir == "" {
		return nil
	}
	files, err := filepath.Glob(filepath.Join(dir, "*.sql"))
	if err != nil {
		return err
	}
	sort.Strings(files)
	conn, err := pgx.Connect(ctx, connString)
	if err != nil {
		return fmt.Errorf("connecting to the template database: %w", err)
	}
	defer conn.Close(context.WithoutCancel(ctx))
	for _, f := range files {
		sql, err := os.ReadFile(f)
		if err != nil {
			return err
		}
		if strings.TrimSpace(string(sql)) == "" {
			continue
		}
		if _, err := conn.Exec(ctx, string(sql)); err != nil {
			return fmt.Errorf("%s: %w", filepath.Base(f), err)
		}
	}
	return nil
}
