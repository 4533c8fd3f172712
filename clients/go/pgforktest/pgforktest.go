// Package pgforktest gives each Go test its own fresh, migrated PostgreSQL
// database from a running `pgfork serve` (or IntegreSQL) server. It talks
// pgfork's v2 API, or IntegreSQL's v1 when the server URL ends in /api/v1 or
// comes from INTEGRESQL_CLIENT_BASE_URL (IntegreSQL's clients' variable).
//
//	func TestSomething(t *testing.T) {
//		t.Parallel()
//		url := pgforktest.New(t, pgforktest.Options{MigrationsDir: "../migrations"})
//		db, err := pgx.Connect(t.Context(), url)
//		...
//	}
//
// DB and Pool return the database opened as a *sql.DB or a pgx pool. A
// Migrator (SQLDir here; goose, golang-migrate, atlas and dbmate adapters
// under clients/go/migrators) builds the template.
//
// The template is keyed by a hash of the migration files and ExtraKey;
// it is built once, even across packages tested in parallel: the first
// process to initialize it migrates it, the others wait for it to be
// finalized. When a test passes its database goes back to the server to be
// recreated; when it fails the database is kept and its URL is logged.
package pgforktest

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"io/fs"
	neturl "net/url"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	_ "github.com/jackc/pgx/v5/stdlib" // database/sql driver "pgx", for DB

	"github.com/pgfork/pgfork/clients/go/client"
)

// A Migrator builds the template database. pgforktest hashes its Files and
// Key (with Options.ExtraKey) into the template hash, so that a change to a
// migration file builds a new template with no manual key bump. SQLDir is
// one; the modules under clients/go/migrators adapt goose, golang-migrate,
// atlas and dbmate.
type Migrator interface {
	// Files returns the files that shape the template (every file's path and
	// content is hashed), or nil.
	Files() (fs.FS, error)
	// Key names the tool and any setting beyond the files that changes the
	// result ("" for none); it is hashed too.
	Key() string
	// Migrate migrates the empty template database at connString (a
	// postgres:// URL).
	Migrate(ctx context.Context, connString string) error
}

// Options says which template to use and where the server is.
type Options struct {
	// Migrator builds the template; its files are hashed into the template's
	// key. Default: SQLDir(MigrationsDir).
	Migrator Migrator
	// MigrationsDir holds the files that shape the template when Migrator is
	// nil: all its files are hashed; its *.sql files (top level only) are run
	// in name order. With Migrate set, it only names the files to hash.
	MigrationsDir string
	// ExtraKey is hashed with the files: change it (e.g. a version of your
	// migration code) to build a new template when the files did not change.
	ExtraKey string
	// Migrate, if set (and Migrator is nil), migrates the template database at
	// connString (a postgres:// URL) instead of running the .sql files of
	// MigrationsDir.
	Migrate func(ctx context.Context, connString string) error
	// ServerURL is the server's base URL. Default: $PGFORK_URL, else
	// $INTEGRESQL_CLIENT_BASE_URL, else http://127.0.0.1:5000. When no server
	// answers, the test fails with a message saying how to start one.
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
// It waits under t.Context() and calls t.Fatal when it cannot get a database
// (including when no server answers). In t.Cleanup, a passing test's
// database is recreated (or unlocked with ReadOnly); a failing test's is kept
// and its URL logged. Close your connections in a t.Cleanup registered after
// New (cleanups run last-registered first); DB and Pool do that for you.
func New(t testing.TB, opts Options) string {
	t.Helper()
	db, c, err := acquire(t.Context(), opts)
	if err != nil {
		t.Fatalf("pgforktest: %v", err)
	}
	url := db.Config().URL()
	printKeptWarning(db)
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("pgforktest: test failed: keeping test database %s (template %s, id %d, hand-out %s) for inspection: %s",
				db.Config().Database, db.TemplateHash, db.ID, handOut(db), url)
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			// Out of the pool's count (IntegreSQL has no keep: there the
			// database just stays handed out).
			_ = c.Keep(ctx, db)
			return
		}
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		var err error
		if opts.ReadOnly {
			err = c.Unlock(ctx, db)
		} else {
			err = c.Recreate(ctx, db)
		}
		if err != nil {
			t.Errorf("pgforktest: returning test database %s: %v", db.Config().Database, err)
		}
	})
	return url
}

var keptWarned sync.Once

// printKeptWarning prints, once per test binary, the server's line saying
// that databases of failed tests pile up (on stderr: the test output shows
// it whether or not the test fails).
func printKeptWarning(db client.TestDatabase) {
	if db.Warning != "" {
		keptWarned.Do(func() { fmt.Fprintln(os.Stderr, db.Warning) })
	}
}

// DB is New opened as a *sql.DB (pgx's database/sql driver, "pgx"), closed
// in t.Cleanup before the database goes back.
func DB(t testing.TB, opts Options) *sql.DB {
	t.Helper()
	url := New(t, opts)
	db, err := sql.Open("pgx", url)
	if err != nil {
		t.Fatalf("pgforktest: opening %s: %v", redact(url), err)
	}
	t.Cleanup(func() { _ = db.Close() })
	if err := db.PingContext(t.Context()); err != nil {
		t.Fatalf("pgforktest: connecting to the test database: %v", err)
	}
	return db
}

// Pool is New opened as a pgx connection pool, closed in t.Cleanup before
// the database goes back.
func Pool(t testing.TB, opts Options) *pgxpool.Pool {
	t.Helper()
	url := New(t, opts)
	pool, err := pgxpool.New(t.Context(), url)
	if err != nil {
		t.Fatalf("pgforktest: opening a pool on %s: %v", redact(url), err)
	}
	t.Cleanup(pool.Close)
	if err := pool.Ping(t.Context()); err != nil {
		t.Fatalf("pgforktest: connecting to the test database: %v", err)
	}
	return pool
}

// redact returns url without its password, for messages.
func redact(raw string) string {
	u, err := neturl.Parse(raw)
	if err != nil || u.User == nil {
		return raw
	}
	if _, ok := u.User.Password(); ok {
		u.User = neturl.UserPassword(u.User.Username(), "xxxxx")
	}
	return u.String()
}

// Hash returns the template hash New uses for opts.
func Hash(opts Options) (string, error) {
	m := migrator(opts)
	files, err := m.Files()
	if err != nil {
		return "", fmt.Errorf("migration files: %w", err)
	}
	key := opts.ExtraKey
	if k := m.Key(); k != "" {
		key = k + "\n" + key
	}
	return client.TemplateHashFS(files, key)
}

// migrator returns the Migrator opts describe.
func migrator(opts Options) Migrator {
	if opts.Migrator != nil {
		return opts.Migrator
	}
	m := SQLDir(opts.MigrationsDir).(sqlDir)
	m.migrate = opts.Migrate
	return m
}

// SQLDir is the Migrator of a plain directory of SQL files: it hashes every
// file under dir and runs the *.sql files at its top in name order (see
// RunSQLFiles). Its hash equals the Python client's for the same directory.
func SQLDir(dir string) Migrator { return sqlDir{dir: dir} }

type sqlDir struct {
	dir     string
	migrate func(ctx context.Context, connString string) error
}

func (m sqlDir) Files() (fs.FS, error) {
	if m.dir == "" {
		return nil, nil
	}
	info, err := os.Stat(m.dir)
	if err != nil {
		return nil, err
	}
	if !info.IsDir() {
		return nil, fmt.Errorf("%s is not a directory", m.dir)
	}
	root, err := filepath.EvalSymlinks(m.dir) // os.DirFS does not enter a symlinked root
	if err != nil {
		return nil, err
	}
	return os.DirFS(root), nil
}

func (m sqlDir) Key() string { return "" }

func (m sqlDir) Migrate(ctx context.Context, connString string) error {
	if m.migrate != nil {
		return m.migrate(ctx, connString)
	}
	return RunSQLFiles(ctx, connString, m.dir)
}

// setup is one template's build in this process, shared by all its tests.
type setup struct {
	once sync.Once
	err  error
}

var setups sync.Map // serverURL + "\x00" + hash → *setup

// acquire builds the template if needed and gets a test database.
func acquire(ctx context.Context, opts Options) (client.TestDatabase, *client.Client, error) {
	serverURL, from := opts.ServerURL, "Options.ServerURL"
	for _, env := range []string{"PGFORK_URL", "INTEGRESQL_CLIENT_BASE_URL"} { // the latter: IntegreSQL's clients' variable
		if serverURL == "" {
			serverURL, from = os.Getenv(env), "$"+env
		}
	}
	if serverURL == "" {
		serverURL, from = client.DefaultURL, "the default URL; set PGFORK_URL to use another"
	}
	token := opts.Token
	if token == "" {
		token = os.Getenv("PGFORK_TOKEN")
	}
	copts := []client.Option{client.WithToken(token)}
	if from == "$INTEGRESQL_CLIENT_BASE_URL" && !strings.HasSuffix(strings.TrimRight(serverURL, "/"), "/api/v2") {
		copts = append(copts, client.WithAPIV1()) // IntegreSQL's variable: maybe IntegreSQL itself
	}
	c, err := client.New(serverURL, copts...)
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
		if errors.As(s.err, &unreachable) {
			s.err = fmt.Errorf("no pgfork server answers at %s (%s): start one with `pgfork serve` "+
				"(or IntegreSQL), or point PGFORK_URL at a running one: %w", client.MaskBaseURL(serverURL), from, s.err)
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
	if err := migrator(opts).Migrate(ctx, tpl.Config().URL()); err != nil {
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

// handOut names a hand-out for a log line: its v2 token, or "-" on v1.
func handOut(db client.TestDatabase) string {
	if db.Token == "" {
		return "-"
	}
	return db.Token
}
