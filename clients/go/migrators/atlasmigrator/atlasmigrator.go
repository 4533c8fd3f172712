// Package atlasmigrator builds pgforktest templates with Atlas's versioned
// migrations (`atlas migrate apply`), run through the atlas command line, and
// hands pgforktest the migration directory (atlas.sum included) to hash, so a
// changed or added migration builds a new template without a key bump.
//
//	url := pgforktest.New(t, pgforktest.Options{
//		Migrator: atlasmigrator.New("migrations"),
//	})
//
// It needs the atlas binary (on PATH, or set Command); it adds no Go
// dependency.
package atlasmigrator

import (
	"context"
	"io/fs"
	"path/filepath"

	"github.com/pgfork/pgfork/clients/go/internal/clirun"
)

// Migrator runs `atlas migrate apply` on one migration directory.
type Migrator struct {
	// Dir is the migration directory (with its atlas.sum).
	Dir string
	// Command is the atlas program and any leading arguments. Default: atlas.
	Command []string
	// RevisionsSchema, if set, is passed as --revisions-schema; it is part of
	// the template's key.
	RevisionsSchema string
}

// New returns a Migrator for the migration directory dir.
func New(dir string) *Migrator { return &Migrator{Dir: dir} }

// Files returns the migration directory, for the template hash.
func (m *Migrator) Files() (fs.FS, error) {
	return clirun.DirFS("atlas", m.Dir)
}

// Key names atlas and its revisions schema.
func (m *Migrator) Key() string { return "atlas revisions-schema=" + m.RevisionsSchema }

// Migrate applies every pending migration to the database at connString.
func (m *Migrator) Migrate(ctx context.Context, connString string) error {
	dir, err := filepath.Abs(m.Dir)
	if err != nil {
		return err
	}
	command := clirun.Command(m.Command, "atlas")
	args := []string{"migrate", "apply", "--url", connString, "--dir", "file://" + filepath.ToSlash(dir)}
	if m.RevisionsSchema != "" {
		args = append(args, "--revisions-schema", m.RevisionsSchema)
	}
	return clirun.Run(ctx, "atlas", command, args, nil, connString,
		"install the atlas CLI (see Atlas's documentation) or set Migrator.Command")
}
