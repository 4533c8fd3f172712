// Package statedir locates pgfork's state directory, where it keeps managed
// PostgreSQL installations, template clusters, running clusters and locks.
//
// The directory is, in order: $PGFORK_HOME; /var/lib/pgfork when running as
// root (so that the unprivileged user PostgreSQL runs as can reach it);
// $XDG_STATE_HOME/pgfork; ~/.local/state/pgfork.
//
// statedir owns the layout of the state directory; it must not create
// anything in it except through Layout.Ensure. It imports nothing of pgfork's.
package statedir

import (
	"os"
	"path/filepath"
	"strconv"
)

// EnvHome is the environment variable that overrides the state directory.
const EnvHome = "PGFORK_HOME"

// Default returns the state directory pgfork uses when none is given.
func Default() string {
	if d := os.Getenv(EnvHome); d != "" {
		return d
	}
	if os.Geteuid() == 0 {
		return "/var/lib/pgfork"
	}
	if d := os.Getenv("XDG_STATE_HOME"); d != "" {
		return filepath.Join(d, "pgfork")
	}
	if h, err := os.UserHomeDir(); err == nil {
		return filepath.Join(h, ".local", "state", "pgfork")
	}
	return filepath.Join(os.TempDir(), "pgfork-"+strconv.Itoa(os.Getuid()))
}

// Layout names the subdirectories of a state directory.
type Layout struct {
	Root string
}

// Installs holds PostgreSQL builds installed by `pgfork pg install`.
func (l Layout) Installs() string { return filepath.Join(l.Root, "installs") }

// Templates holds cached template clusters, one directory per key.
func (l Layout) Templates() string { return filepath.Join(l.Root, "templates") }

// Clusters holds clusters started by `pgfork up`.
func (l Layout) Clusters() string { return filepath.Join(l.Root, "clusters") }

// Locks holds lock files.
func (l Layout) Locks() string { return filepath.Join(l.Root, "locks") }

// Run holds private Unix-socket directories.
func (l Layout) Run() string { return filepath.Join(l.Root, "run") }

// Ensure creates the state directory and its subdirectories, mode 0755 so the
// OS user PostgreSQL runs as can traverse them.
func (l Layout) Ensure() error {
	for _, d := range []string{l.Root, l.Installs(), l.Templates(), l.Clusters(), l.Locks(), l.Run()} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return err
		}
	}
	return nil
}
