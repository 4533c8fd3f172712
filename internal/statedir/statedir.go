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
	"errors"
	"os"
	"path/filepath"
	"strconv"
)

// EnvHome is the environment variable that overrides the state directory.
const EnvHome = "PGFORK_HOME"

// Default returns the state directory pgfork uses when none is given: Base,
// moved onto its reflink volume when one is recorded there (Resolve).
func Default() string { return Resolve(Base()) }

// VolumeRecord is the file, in a base state directory, that records the
// reflink volume `pgfork volume create` made for it (package volume).
const VolumeRecord = "volume.json"

// VolumeMount is the directory, in a base state directory, where the
// recorded volume is mounted; VolumeState is the state directory on it.
const (
	VolumeMount = "volume"
	VolumeState = "state"
)

// Resolve returns the state directory to use for base: the state directory on
// base's recorded volume when base has one, else base itself.
func Resolve(base string) string {
	if fi, err := os.Lstat(filepath.Join(base, VolumeRecord)); err == nil && fi.Mode().IsRegular() {
		return filepath.Join(base, VolumeMount, VolumeState)
	}
	return base
}

// ErrVolumeDetached is returned by Layout.Ensure when the state directory is
// on a recorded volume that is not mounted: nothing is created on the
// directory under the mount point.
var ErrVolumeDetached = errors.New("the reflink volume recorded for this state directory is not attached")

// Base returns the state directory chosen by the environment, before a
// recorded volume moves it (Resolve).
func Base() string { return BaseFrom(os.Getenv) }

// BaseFrom is Base with the environment read through getenv (a front end
// that runs with an environment of its own, as the CLI under test does).
func BaseFrom(getenv func(string) string) string {
	if d := getenv(EnvHome); d != "" {
		return d
	}
	if os.Geteuid() == 0 {
		return "/var/lib/pgfork"
	}
	if d := getenv("XDG_STATE_HOME"); d != "" {
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
	if base := filepath.Dir(filepath.Dir(l.Root)); Resolve(base) == l.Root {
		if _, err := os.Lstat(l.Root); err != nil {
			return &os.PathError{Op: "use state directory", Path: l.Root, Err: ErrVolumeDetached}
		}
	}
	for _, d := range []string{l.Root, l.Installs(), l.Templates(), l.Clusters(), l.Locks(), l.Run()} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return err
		}
	}
	return nil
}
