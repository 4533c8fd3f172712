package restore

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"

	"github.com/pgfork/pgfork/clone"
	"github.com/pgfork/pgfork/cluster"
	"github.com/pgfork/pgfork/instance"
	"github.com/pgfork/pgfork/internal/errs"
	"github.com/pgfork/pgfork/internal/statedir"
	"github.com/pgfork/pgfork/pgbin"
	"github.com/pgfork/pgfork/pgdata"
)

// Recovery is a point-in-time recovery: replay WAL from an archive up to
// a target, then act (promote by default).
type Recovery struct {
	WALDir       string // WAL archive (files named as in pg_wal)
	TargetTime   string // recovery_target_time
	TargetLSN    string // recovery_target_lsn
	TargetName   string // recovery_target_name (a pg_create_restore_point name)
	TargetAction string // promote (default), pause or shutdown
}

// Targeted reports whether a target is set.
func (r Recovery) Targeted() bool {
	return r.TargetTime != "" || r.TargetLSN != "" || r.TargetName != ""
}

var safePath = regexp.MustCompile(`^[A-Za-z0-9_./+,:@=-]+$`)

// Validate checks the recovery options before anything is written.
func (r *Recovery) Validate() error {
	n := 0
	for _, s := range []string{r.TargetTime, r.TargetLSN, r.TargetName} {
		if s != "" {
			n++
		}
	}
	if n > 1 {
		return errs.New(errs.Usage, "more than one recovery target").WithHint("give one recovery target: a time, an LSN or a restore point's name").
			WithCLI("give one of --target-time, --target-lsn, --target-name")
	}
	if n == 1 && r.WALDir == "" {
		return errs.New(errs.Usage, "a recovery target needs a WAL archive").
			WithHint("give the directory archive_command copies WAL files to (the backups hold only the WAL of their own run)").
			WithCLI("pass --wal DIR")
	}
	if r.WALDir != "" {
		abs, err := filepath.Abs(r.WALDir)
		if err != nil {
			return errs.Wrap(errs.Usage, err, "bad WAL archive path").WithPath(r.WALDir)
		}
		if fi, err := os.Stat(abs); err != nil || !fi.IsDir() {
			return errs.New(errs.NotFound, "no WAL archive directory").WithPath(abs).WithHint("give the directory archive_command copies WAL files to")
		}
		if !safePath.MatchString(abs) {
			return errs.New(errs.Usage, "the WAL archive path has characters pgfork will not put in a shell command").WithPath(abs).
				WithHint("use a path of letters, digits and ./_-+,:@= only (a symlink to it will do)")
		}
		r.WALDir = abs
	}
	if r.TargetLSN != "" {
		if _, err := pgdata.ParseLSN(r.TargetLSN); err != nil {
			return errs.New(errs.Usage, "bad recovery target LSN %q", r.TargetLSN).WithHint("give an LSN such as 0/3000060")
		}
	}
	if r.TargetTime != "" {
		if strings.ContainsAny(r.TargetTime, "'\n") {
			return errs.New(errs.Usage, "bad recovery target time %q", r.TargetTime).WithHint("give a timestamp such as '2026-11-23 03:00:00+00'")
		}
	}
	if strings.ContainsAny(r.TargetName, "\n\x00") {
		return errs.New(errs.Usage, "bad recovery target name").WithHint("give the name passed to pg_create_restore_point")
	}
	switch r.TargetAction {
	case "":
		r.TargetAction = "promote"
	case "promote", "pause", "shutdown":
	default:
		return errs.New(errs.Usage, "bad recovery target action %q", r.TargetAction).WithHint("give promote, pause or shutdown")
	}
	return nil
}

// prepareRecovery appends the recovery target to postgresql.auto.conf
// and creates recovery.signal (pg_verifybackup ignores both files). The
// restore_command goes on the server's command line (restoreCommand):
// cluster.StartBranch resets every command a configuration file sets.
func prepareRecovery(dataDir string, r Recovery, user *instance.OSUser) error {
	var b strings.Builder
	b.WriteString("\n# point-in-time recovery set by pgfork restore\n")
	switch {
	case r.TargetTime != "":
		fmt.Fprintf(&b, "recovery_target_time = %s\n", pgdata.QuoteConf(r.TargetTime))
	case r.TargetLSN != "":
		fmt.Fprintf(&b, "recovery_target_lsn = %s\n", pgdata.QuoteConf(r.TargetLSN))
	case r.TargetName != "":
		fmt.Fprintf(&b, "recovery_target_name = %s\n", pgdata.QuoteConf(r.TargetName))
	}
	fmt.Fprintf(&b, "recovery_target_action = %s\n", pgdata.QuoteConf(r.TargetAction))
	// The data directory is the server user's by now: its files are
	// written with that user's rights (instance.OpenAppend), never by root
	// following a name the user could have replaced.
	p := filepath.Join(dataDir, "postgresql.auto.conf")
	f, err := instance.OpenAppend(p, user)
	if err != nil {
		return err
	}
	if _, err := f.WriteString(b.String()); err != nil {
		f.Close()
		return errs.FromOS(err, p, "cannot write the recovery settings")
	}
	if err := f.Close(); err != nil {
		return errs.FromOS(err, p, "cannot write the recovery settings")
	}
	sig := filepath.Join(dataDir, "recovery.signal")
	f, err = instance.OpenAppend(sig, user)
	if err != nil {
		return err
	}
	return f.Close()
}

// StartOptions shape Start.
type StartOptions struct {
	Layout       statedir.Layout
	Installation pgbin.Installation // of the data directory's major
	User         *instance.OSUser   // nil: the current user
	Name         string             // registry name; default from the data directory's name, else random
	Recovery     Recovery
	Source       string // what the branch was made from, for `pgfork ls`
}

// Started is a running branch.
type Started = cluster.Branch

// Start starts a restored data directory as a branch: recovery settings
// written (with a target), then cluster.StartBranch (the server run as
// opts.User on a private socket directory, recorded in the cluster
// registry so that `pgfork ls` lists it and `pgfork down NAME` stops and
// removes it). It returns once recovery is over and the server accepts
// connections (hot_standby is off while a target is replayed, so no one
// reads a state before the target).
func Start(ctx context.Context, dataDir string, o StartOptions) (*Started, error) {
	major, err := versionOf(dataDir)
	if err != nil {
		return nil, err
	}
	if o.Installation.Major != major {
		return nil, errs.New(errs.Usage, "the data directory is of PostgreSQL %d but the build given is %s", major, o.Installation.Version).
			WithHint("use a build of PostgreSQL %d", major).WithCLI("install it with `pgfork pg install %d`, or point --pg-bin at its bin directory", major)
	}
	if err := o.Recovery.Validate(); err != nil {
		return nil, err
	}
	if err := cluster.CheckBranchName(o.Layout, dataDir, o.Name); err != nil {
		return nil, err
	}
	// A data directory not shut down cleanly (a restored backup) is
	// fsynced file by file when the server starts, before recovery
	// (recovery_init_sync_method = fsync): 1.4 s for 1,000 files on an XFS
	// volume, for files the restore has just made durable. One syncfs does
	// the same (restores are of PostgreSQL 17+; syncfs exists since 14),
	// but for the whole filesystem: cheap on a data volume that clones
	// (XFS, btrfs: where pgfork's volumes are), slow on a root filesystem
	// others write to (ext4 under load: 3.5 s against 0.3 s of fsyncs), so
	// only there.
	settings := map[string]string{}
	if fs, err := clone.FSType(dataDir); err == nil && clone.MayClone(fs) {
		settings["recovery_init_sync_method"] = "syncfs"
	}
	if o.Recovery.Targeted() || o.Recovery.WALDir != "" {
		if err := prepareRecovery(dataDir, o.Recovery, o.User); err != nil {
			return nil, err
		}
		settings["restore_command"] = restoreCommand(o.Recovery)
		if o.Recovery.TargetAction != "pause" {
			settings["hot_standby"] = "off"
		}
	}
	return cluster.StartBranch(ctx, o.Layout, cluster.BranchOptions{Name: o.Name, DataDir: dataDir,
		Kind: cluster.KindRestore, Source: o.Source, BinDir: o.Installation.BinDir, Env: o.Installation.Env(),
		PGVersion: o.Installation.Version, PGMajor: major, User: o.User, Settings: settings})
}

func versionOf(dataDir string) (int, error) { return pgdata.Version(dataDir) }

// restoreCommand copies WAL files from r's archive (a path Validate
// checked to need no quoting beyond single quotes).
func restoreCommand(r Recovery) string { return "cp '" + r.WALDir + "/%f' '%p'" }
