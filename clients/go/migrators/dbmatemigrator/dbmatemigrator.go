// Package dbmatemigrator builds pgforktest templates with dbmate
// (`dbmate up`), run through the dbmate command line, and hands pgforktest
// the migration directory to hash, so a changed or added migration builds a
// new template without a key bump.
//
//	url := pgforktest.New(t, pgforktest.Options{
//		Migrator: dbmatemigrator.New("db/migrations"),
//	})
//
// It needs the dbmate binary (on PATH, or set Command); it adds no Go
// dependency.
package dbmatemigrator

import (
	"context"
	"io/fs"
	"path/filepath"

	"github.com/pgfork/pgfork/clients/go/internal/clirun"
)

// Migrator runs `dbmate up` on one migration directory.
type Migrator struct {
	// Dir is the migration directory (files with -- migrate:up sections).
	Dir string
	// Command is the dbmate program and any leading arguments. Default: dbmate.
	Command []string
	// MigrationsTable, if set, is passed as --migrations-table; it is part of
	// the template's key.
	MigrationsTable string
}

// New returns a Migrator for the migration directory dir.
func New(dir string) *Migrator { return &Migrator{Dir: dir} }

// Files returns the migration directory, for the template hash.
func (m *Migrator) Files() (fs.FS, error) {
	return clirun.DirFS("dbmate", m.Dir)
}

// Key names dbmate and its migrations table.
func (m *Migrator) Key() string { return "dbmate migrations-table=" + m.MigrationsTable }

// Migrate applies every pending migration to the database at connString,
// without dumping a schema file.
func (m *Migrator) Migrate(ctx context.Context, connString string) error {
	dir, err := filepath.Abs(m.Dir)
	if err != nil {
		return err
	}
	command := clirun.Command(m.Command, "dbmate")
	// The URL goes in the environment (dbmate reads DATABASE_URL), not on
	// the command line where other local users could read its password.
	args := []string{"--migrations-dir", dir, "--no-dump-schema"}
	if m.MigrationsTable != "" {
		args = append(args, "--migrations-table", m.MigrationsTable)
	}
	args = append(args, "up")
	return clirun.Run(ctx, "dbmate", command, args, []string{"DATABASE_URL=" + connString}, connString,
		"install the dbmate CLI (see dbmate's documentation) or set Migrator.Command")
}
