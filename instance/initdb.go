package instance

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/pgfork/pgfork/internal/errs"
	"github.com/pgfork/pgfork/internal/pgversion"
)

// InitOptions shape a new cluster made by initdb.
type InitOptions struct {
	BinDir  string   // PostgreSQL bin directory
	Env     []string // extra environment for its binaries (pgbin.Installation.Env)
	DataDir string   // must not exist or be empty
	User    *OSUser  // OS user to own and run the cluster (nil: current user)

	Superuser string // database superuser name (default "postgres")
	Encoding  string // default UTF8
	Locale    string // default C (fast, stable sorting for tests)
	// Checksums: nil keeps initdb's default (off before 18, on from 18).
	Checksums *bool
	// Major is the PostgreSQL major of BinDir; 0 lets InitDB ask initdb.
	// It decides how Checksums is spelled (--no-data-checksums exists from 18).
	Major int
	// NoSync skips initdb's fsync (throw-away and template clusters; pgfork
	// syncs what it keeps itself).
	NoSync bool
	// Extra are additional initdb arguments.
	Extra []string
}

// Args returns initdb's arguments for these options (without -D). Template
// keys hash them, so they must be deterministic.
func (o InitOptions) Args() []string {
	su := o.Superuser
	if su == "" {
		su = "postgres"
	}
	enc := o.Encoding
	if enc == "" {
		enc = "UTF8"
	}
	loc := o.Locale
	if loc == "" {
		loc = "C"
	}
	args := []string{"-U", su, "-E", enc, "--locale=" + loc, "--auth=trust"}
	if o.Checksums != nil {
		if *o.Checksums {
			args = append(args, "--data-checksums")
		} else if o.Major >= 18 {
			args = append(args, "--no-data-checksums")
		}
	}
	if o.NoSync {
		args = append(args, "--no-sync")
	}
	return append(args, o.Extra...)
}

// InitDB creates a new cluster in o.DataDir with initdb, owned by o.User.
// On failure it removes what it created and returns initdb's output.
func InitDB(ctx context.Context, o InitOptions) error {
	if o.BinDir == "" || o.DataDir == "" {
		return errs.New(errs.Usage, "InitDB needs a bin directory and a data directory")
	}
	if entries, err := os.ReadDir(o.DataDir); err == nil && len(entries) > 0 {
		return errs.New(errs.Exists, "data directory is not empty").WithPath(o.DataDir).
			WithHint("choose a new directory or remove this one")
	}
	if err := os.MkdirAll(filepath.Dir(o.DataDir), 0o755); err != nil {
		return errs.Wrap(errs.Internal, err, "cannot create parent of data directory")
	}
	if err := o.User.MkdirOwned(o.DataDir, 0o700); err != nil {
		return errs.FromOS(err, o.DataDir, "cannot create data directory")
	}
	if o.Major == 0 {
		o.Major = majorOf(ctx, o.User, o.Env, filepath.Join(o.BinDir, "initdb"))
	}
	args := append([]string{"-D", o.DataDir}, o.Args()...)
	cmd := o.User.Command(ctx, o.Env, filepath.Join(o.BinDir, "initdb"), args...)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		_ = os.RemoveAll(o.DataDir)
		if ctx.Err() != nil {
			return errs.Wrap(errs.Interrupted, ctx.Err(), "initdb interrupted")
		}
		// initdb reports a full disk in its output only (its exit status
		// is 1 for every failure).
		if strings.Contains(out.String(), "No space left on device") {
			return errs.Wrap(errs.NoSpace, err, "initdb ran out of disk space: %s", tail(out.String(), 5)).WithPath(o.DataDir).
				WithHint("free space on the filesystem of %s (a new cluster needs about 40 MB), or use another state directory", filepath.Dir(o.DataDir)).WithCLI("--state-dir DIR")
		}
		return errs.Wrap(errs.Internal, err, "initdb failed: %s", tail(out.String(), 15)).WithPath(o.DataDir)
	}
	return nil
}

// tail returns the last n lines of s, indented for inclusion in an error.
func tail(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return fmt.Sprintf("\n    %s", strings.Join(lines, "\n    "))
}

// majorOf runs `tool --version` and returns the major version, 0 if unknown.
func majorOf(ctx context.Context, u *OSUser, env []string, tool string) int {
	out, err := u.Command(ctx, env, tool, "--version").Output()
	if err != nil {
		return 0
	}
	n, _ := pgversion.MajorFromToolOutput(out)
	return n
}
