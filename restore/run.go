package restore

import (
	"context"
	"strings"

	"github.com/pgfork/pgfork/cluster"
	"github.com/pgfork/pgfork/instance"
	"github.com/pgfork/pgfork/internal/errs"
	"github.com/pgfork/pgfork/internal/statedir"
	"github.com/pgfork/pgfork/pgbackup"
	"github.com/pgfork/pgfork/pgbin"
	"github.com/pgfork/pgfork/pgdata"
)

// RunOptions is everything `pgfork restore` does, as one call (Run).
type RunOptions struct {
	// Backups are the backup directories, full first; or one chain
	// directory (made by `pgfork backup`), restored up to Upto (a backup's
	// name; empty: the newest).
	Backups []string
	Upto    string
	// Dst is the data directory to create.
	Dst string
	// Restore shapes the rebuild (Options.Owner is set from User when nil).
	Restore Options

	// Start runs the result as a branch (Start) once it is rebuilt.
	Start bool
	// Layout is pgfork's state (the branch registry, managed installs).
	Layout statedir.Layout
	// User runs the server as root's stand-in (nil: the current user).
	User *instance.OSUser
	// PGBin names a PostgreSQL bin directory to use; else one of the
	// backups' major is looked for (pgbin.Find).
	PGBin string
	// Name and Recovery shape the started result (see StartOptions).
	Name     string
	Recovery Recovery
	// DryRun checks everything, plans the restore and returns the plan
	// (RunResult.DryRun), writing nothing.
	DryRun bool
}

// RunResult is what Run made.
type RunResult struct {
	*Summary
	// Branch is the started branch (RunOptions.Start), else nil.
	Branch *Started `json:"branch,omitempty"`
	// Installation is the PostgreSQL build that runs the branch.
	Installation pgbin.Installation `json:"-"`
	// DryRun is what the restore would do (RunOptions.DryRun); Summary
	// is then nil.
	DryRun *DryRun `json:"dry_run,omitempty"`
}

// Run is `pgfork restore`: it finds the chain (a chain directory is
// discovered up to Upto), checks what starting a branch needs before
// anything is written (recovery settings, the branch's name, a PostgreSQL
// build of the backups' major), rebuilds the data directory (Restore) and,
// with Start, runs it as a branch (Start).
func Run(ctx context.Context, o RunOptions) (*RunResult, error) {
	dirs := o.Backups
	if len(dirs) == 0 || o.Dst == "" {
		return nil, errs.New(errs.Usage, "a restore needs the backups and a destination directory")
	}
	var err error
	if len(dirs) == 1 && !pgbackup.IsBackupDir(dirs[0]) {
		if dirs, err = pgbackup.Discover(dirs[0], o.Upto); err != nil {
			return nil, err
		}
	} else if o.Upto != "" {
		return nil, errs.New(errs.Usage, "restoring up to a named backup needs a chain directory").
			WithHint("give the one directory the chain was kept in, or name the backups themselves").
			WithCLI("give one directory made by `pgfork backup`, or drop --upto")
	}
	if !o.Start && (o.Recovery.WALDir != "" || o.Recovery.Targeted() || o.Name != "") {
		return nil, errs.New(errs.Usage, "a name, a WAL archive and recovery targets are for starting the result").
			WithHint("ask for the result to be started as a branch").WithCLI("add --start")
	}
	if o.Start && o.Restore.Link {
		return nil, errs.New(errs.Usage, "a hard-linked result shares its files with the backups: starting it would change the backups").
			WithHint("restore by copy or clone to start the result")
	}
	if o.Restore.Owner == nil {
		o.Restore.Owner = o.User.Owner()
	}
	var inst pgbin.Installation
	if o.Start {
		if err := o.Recovery.Validate(); err != nil {
			return nil, err
		}
		if err := cluster.CheckBranchName(o.Layout, o.Dst, o.Name); err != nil {
			return nil, err
		}
		major, err := pgdata.Version(dirs[len(dirs)-1])
		if err != nil {
			return nil, err
		}
		if inst, err = pgbin.Find(pgbin.Options{Explicit: o.PGBin, StateDir: o.Layout.Root}, major); err != nil {
			return nil, pgbin.MissingMajor(err, major, "the backups are of PostgreSQL %d", major)
		}
	}
	if o.DryRun {
		d, err := PlanOnly(dirs, o.Dst, o.Restore)
		if err != nil {
			return nil, err
		}
		return &RunResult{DryRun: d, Installation: inst}, nil
	}
	sum, err := Restore(ctx, dirs, o.Dst, o.Restore)
	if err != nil {
		return nil, err
	}
	res := &RunResult{Summary: sum, Installation: inst}
	if !o.Start {
		return res, nil
	}
	res.Branch, err = Start(ctx, sum.Dst, StartOptions{Layout: o.Layout, Installation: inst, User: o.User, Name: o.Name,
		Recovery: o.Recovery, Source: strings.Join(dirs, " ")})
	if err != nil {
		return nil, err
	}
	return res, nil
}
