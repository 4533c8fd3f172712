// Package golangmigrator builds pgforktest templates with golang-migrate
// (github.com/golang-migrate/migrate/v4): it runs the NNN_name.up.sql
// migrations of a directory or an fs.FS through golang-migrate's pgx v5
// driver, and hands pgforktest those files to hash, so a changed or added
// migration builds a new template without a key bump.
//
//	url := pgforktest.New(t, pgforktest.Options{
//		Migrator: golangmigrator.New(os.DirFS("migrations")),
//	})
//
// It is a module of its own so that pgfork's client does not pull
// golang-migrate. It implements pgforktest.Migrator without importing it.
package golangmigrator

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"net/url"

	"github.com/golang-migrate/migrate/v4"
	_ "github.com/golang-migrate/migrate/v4/database/pgx/v5" // scheme pgx5://
	"github.com/golang-migrate/migrate/v4/source/iofs"
)

// Migrator runs golang-migrate's migrations of one folder. Build it with New.
type Migrator struct {
	fsys            fs.FS
	migrationsTable string
}

// Option configures a Migrator.
type Option func(*Migrator)

// WithMigrationsTable sets golang-migrate's version table (its default:
// schema_migrations). It is part of the template's key.
func WithMigrationsTable(name string) Option {
	return func(m *Migrator) { m.migrationsTable = name }
}

// New returns a Migrator for the migrations at the top of fsys (for example
// os.DirFS("migrations"), or fs.Sub of an embed.FS).
func New(fsys fs.FS, opts ...Option) *Migrator {
	m := &Migrator{fsys: fsys}
	for _, o := range opts {
		o(m)
	}
	return m
}

// Files returns the migration files, for the template hash.
func (m *Migrator) Files() (fs.FS, error) { return m.fsys, nil }

// Key names golang-migrate and its version table.
func (m *Migrator) Key() string { return "golang-migrate/v4 table=" + m.migrationsTable }

// Migrate runs every up migration on the database at connString (a
// postgres:// URL). golang-migrate takes no context: a cancelled ctx stops
// it between migrations (GracefulStop).
func (m *Migrator) Migrate(ctx context.Context, connString string) error {
	u, err := url.Parse(connString)
	if err != nil {
		return fmt.Errorf("golang-migrate: database URL: %w", err)
	}
	u.Scheme = "pgx5"
	if m.migrationsTable != "" {
		q := u.Query()
		q.Set("x-migrations-table", m.migrationsTable)
		u.RawQuery = q.Encode()
	}
	src, err := iofs.New(m.fsys, ".")
	if err != nil {
		return fmt.Errorf("golang-migrate: migrations: %w", err)
	}
	mig, err := migrate.NewWithSourceInstance("iofs", src, u.String())
	if err != nil {
		return fmt.Errorf("golang-migrate: %w", err)
	}
	defer mig.Close()
	stop := context.AfterFunc(ctx, func() {
		select {
		case mig.GracefulStop <- true:
		default:
		}
	})
	defer stop()
	if err := mig.Up(); err != nil && !errors.Is(err, migrate.ErrNoChange) {
		return fmt.Errorf("golang-migrate: %w", err)
	}
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("golang-migrate: %w", err)
	}
	return nil
}
