// Package goosemigrator builds pgforktest templates with goose
// (github.com/pressly/goose/v3): it runs goose's SQL migrations from a
// directory or an fs.FS, and hands pgforktest those files to hash, so a
// changed or added migration builds a new template without a key bump.
//
//	url := pgforktest.New(t, pgforktest.Options{
//		Migrator: goosemigrator.New(os.DirFS("migrations")),
//	})
//
// It is a module of its own so that pgfork's client does not pull goose.
// It implements pgforktest.Migrator without importing it.
package goosemigrator

import (
	"context"
	"database/sql"
	"fmt"
	"io/fs"

	_ "github.com/jackc/pgx/v5/stdlib" // database/sql driver "pgx"
	"github.com/pressly/goose/v3"
)

// Migrator runs goose's migrations of one folder. Build it with New.
type Migrator struct {
	fsys      fs.FS
	tableName string
	goMigs    []*goose.Migration
}

// Option configures a Migrator.
type Option func(*Migrator)

// WithTableName sets goose's version table (goose's default:
// goose_db_version). It is part of the template's key.
func WithTableName(name string) Option { return func(m *Migrator) { m.tableName = name } }

// WithGoMigrations adds migrations written in Go (goose.NewGoMigration).
// Their code is not hashed: pass pgforktest.Options.ExtraKey and change it
// when you change them.
func WithGoMigrations(migs ...*goose.Migration) Option {
	return func(m *Migrator) { m.goMigs = append(m.goMigs, migs...) }
}

// New returns a Migrator for the goose migrations at the top of fsys (for
// example os.DirFS("migrations"), or fs.Sub of an embed.FS).
func New(fsys fs.FS, opts ...Option) *Migrator {
	m := &Migrator{fsys: fsys}
	for _, o := range opts {
		o(m)
	}
	return m
}

// Files returns the migration files, for the template hash.
func (m *Migrator) Files() (fs.FS, error) { return m.fsys, nil }

// Key names goose and its version table.
func (m *Migrator) Key() string { return "goose/v3 table=" + m.tableName }

// Migrate runs every pending migration on the database at connString.
func (m *Migrator) Migrate(ctx context.Context, connString string) error {
	db, err := sql.Open("pgx", connString)
	if err != nil {
		return fmt.Errorf("goose: %w", err)
	}
	defer db.Close()
	opts := []goose.ProviderOption{goose.WithDisableGlobalRegistry(true)}
	if m.tableName != "" {
		opts = append(opts, goose.WithTableName(m.tableName))
	}
	if len(m.goMigs) > 0 {
		opts = append(opts, goose.WithGoMigrations(m.goMigs...))
	}
	p, err := goose.NewProvider(goose.DialectPostgres, db, m.fsys, opts...)
	if err != nil {
		return fmt.Errorf("goose: %w", err)
	}
	if _, err := p.Up(ctx); err != nil {
		return fmt.Errorf("goose: %w", err)
	}
	return nil
}
