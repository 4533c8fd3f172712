package main

import (
	"fmt"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/pgfork/pgfork/dbclone"
	"github.com/pgfork/pgfork/internal/units"
)

func (cl *cli) newDBSnapshotCmd() *cobra.Command {
	var (
		strategy string
		force    bool
		wait     time.Duration
		noSpare  bool
	)
	cmd := &cobra.Command{
		Use:   "snapshot DB [NAME]",
		Short: "Take a snapshot of a database inside the server",
		Long: `Take a snapshot called NAME (default: the current UTC time, e.g. 20250101-120000.000)
of database DB. The snapshot is a database pgfork_snap_<hash> closed to
connections, made by the advisor's strategy (or --strategy); its metadata
(source, name, time, size) is kept in the server as the database's comment, so
every pgfork sees it and it survives restarts. Then a spare copy is prepared so
that ` + "`pgfork db restore`" + ` is a rename (skip with --no-spare).

A snapshot here is one database inside a running server; a branch snapshot
(pgfork branch snapshot) is a whole stopped cluster that branches are made
from (docs/branches.md).

Nobody else may be connected to DB while it is copied: pgfork waits up to --wait,
then fails naming the sessions, or terminates them with --force.

The copy is made under a work-in-progress name (pgfork_wip_…) and renamed into
place with its metadata at the end: an interrupted snapshot (Ctrl-C, SIGTERM)
removes its copy, and one whose process was killed leaves a pgfork_wip_
database that the next db create, snapshot, snapshots or rm-snapshot removes.`,
		Example: `  pgfork db snapshot app
  pgfork db snapshot app before-migration --force`,
		Args: usageArgs(cobra.RangeArgs(1, 2)),
		RunE: func(cmd *cobra.Command, args []string) error {
			db, name, err := dbAndSnapshot(args)
			if err != nil {
				return err
			}
			st, err := dbclone.ParseStrategy(strategy)
			if err != nil {
				return err
			}
			ctx := cmd.Context()
			srv, err := cl.connectDB(ctx, db)
			if err != nil {
				return err
			}
			defer srv.close()
			opts := dbclone.CreateOptions{Strategy: st, Force: force, WaitTimeout: wait, Target: srv.target, Calibration: srv.cal, Learning: srv.learn}
			info, res, err := dbclone.Snapshot(ctx, srv.conn, db, name, opts)
			if err != nil {
				return err
			}
			for _, s := range res.Terminated {
				cl.infof("terminated session %s on %q", s, db)
			}
			cl.infof("snapshot %q of %q taken in %s (%s)", info.Name, db, fmtDur(res.Elapsed), res.Strategy)
			if !noSpare {
				cl.infof("preparing the spare copy for a fast restore…")
				opts.Strategy = res.Strategy
				sp, err := dbclone.Refill(ctx, srv.conn, info, opts)
				if err != nil {
					return err
				}
				if sp != nil {
					cl.infof("spare ready in %s", fmtDur(sp.Elapsed))
				}
			}
			if cl.g.json {
				return printJSON(cmd.OutOrStdout(), info)
			}
			fmt.Fprintf(cmd.OutOrStdout(), "snapshot %s of %s (%s, in database %s)\n", info.Name, db, units.Bytes(info.Size), info.Database)
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVar(&strategy, "strategy", "auto", "auto, wal_log, file_copy or clone")
	f.BoolVar(&force, "force", false, "terminate other sessions on DB (after --wait)")
	f.DurationVar(&wait, "wait", 5*time.Second, "how long to wait for other sessions on DB to leave")
	f.BoolVar(&noSpare, "no-spare", false, "do not prepare the spare copy now (the first restore then copies)")
	return cmd
}

func (cl *cli) newDBRestoreCmd() *cobra.Command {
	var (
		force, noRefill bool
		wait            time.Duration
	)
	cmd := &cobra.Command{
		Use:               "restore DB [NAME]",
		ValidArgsFunction: cl.completeSnapshots(false),
		Short:             "Replace a database by one of its snapshots (the latest by default)",
		Long: `Replace database DB by the content of its snapshot NAME (default: the latest).
The snapshot's prepared spare copy is renamed into place and the old DB dropped,
so DB is unavailable only for the two renames; then the spare is refilled before
pgfork exits ("refilling spare"), unless --no-refill. The database's owner is
restored; database-level settings (ALTER DATABASE … SET) and GRANTs on it are not.

Sessions connected to DB make the restore fail, naming them, unless --force
terminates them (after --wait).`,
		Example: `  pgfork db restore app
  pgfork db restore app before-migration --force
  pgfork db restore app --no-refill`,
		Args: usageArgs(cobra.RangeArgs(1, 2)),
		RunE: func(cmd *cobra.Command, args []string) error {
			db, name, err := dbAndSnapshot(args)
			if err != nil {
				return err
			}
			ctx := cmd.Context()
			srv, err := cl.connectDB(ctx, db)
			if err != nil {
				return err
			}
			defer srv.close()
			copts := dbclone.CreateOptions{Strategy: dbclone.Auto, Force: force, WaitTimeout: wait, Target: srv.target, Calibration: srv.cal, Learning: srv.learn}
			res, err := dbclone.Restore(ctx, srv.conn, db, name, dbclone.RestoreOptions{Create: copts})
			if err != nil {
				return err
			}
			for _, s := range res.Terminated {
				cl.infof("terminated session %s on %q", s, db)
			}
			for _, n := range res.Notes {
				cl.infof("note: %s", n)
			}
			if res.CopiedFirst {
				cl.infof("the snapshot had no spare: copied it first")
			}
			cl.infof("restored %q from snapshot %q in %s (swap %s)", db, res.Snapshot.Name, fmtDur(res.Elapsed), fmtDur(res.Swap))
			if cl.g.json {
				if err := printJSON(cmd.OutOrStdout(), res); err != nil {
					return err
				}
			} else {
				fmt.Fprintf(cmd.OutOrStdout(), "restored %s from snapshot %s\n", db, res.Snapshot.Name)
			}
			if !noRefill {
				cl.infof("refilling spare…")
				copts.Force = false
				sp, err := dbclone.Refill(ctx, srv.conn, &res.Snapshot, copts)
				if err != nil {
					return err
				}
				if sp != nil {
					cl.infof("spare ready in %s", fmtDur(sp.Elapsed))
				}
			}
			return nil
		},
	}
	f := cmd.Flags()
	f.BoolVar(&force, "force", false, "terminate sessions connected to DB (after --wait)")
	f.DurationVar(&wait, "wait", 0, "how long to wait for sessions on DB to leave")
	f.BoolVar(&noRefill, "no-refill", false, "do not refill the spare copy (the next restore then copies first)")
	return cmd
}

func (cl *cli) newDBSnapshotsCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "snapshots [DB]",
		Short: "List snapshots (of one database, or all)",
		Example: `  pgfork db snapshots
  pgfork db snapshots app --json`,
		Args: usageArgs(cobra.MaximumNArgs(1)),
		RunE: func(cmd *cobra.Command, args []string) error {
			db := ""
			if len(args) == 1 {
				db = args[0]
				if err := dbclone.ValidateName(db); err != nil {
					return err
				}
			}
			ctx := cmd.Context()
			srv, err := cl.connectDB(ctx)
			if err != nil {
				return err
			}
			defer srv.close()
			list, err := dbclone.Snapshots(ctx, srv.conn, db)
			if err != nil {
				return err
			}
			if cl.g.json {
				if list == nil {
					list = []dbclone.SnapshotInfo{}
				}
				return printJSON(cmd.OutOrStdout(), list)
			}
			tw := tabwriter.NewWriter(cmd.OutOrStdout(), 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "DB\tSNAPSHOT\tCREATED\tSIZE\tSTRATEGY\tSPARE")
			for _, s := range list {
				spare := "no"
				if s.HasSpare {
					spare = "ready"
				}
				fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\n", s.Source, s.Name, s.Created.Local().Format("2006-01-02 15:04:05"),
					units.Bytes(s.Size), s.Strategy, spare)
			}
			return tw.Flush()
		},
	}
}

func (cl *cli) newDBRmSnapshotCmd() *cobra.Command {
	var db string
	cmd := &cobra.Command{
		Use:               "rm-snapshot NAME",
		ValidArgsFunction: cl.completeSnapshots(true),
		Short:             "Remove a snapshot and its spare copy",
		Example: `  pgfork db rm-snapshot before-migration
  pgfork db rm-snapshot --db app 20250101-120000.000`,
		Args: usageArgs(cobra.ExactArgs(1)),
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := dbclone.ValidateName(args[0]); err != nil {
				return err
			}
			ctx := cmd.Context()
			srv, err := cl.connectDB(ctx)
			if err != nil {
				return err
			}
			defer srv.close()
			s, err := dbclone.RemoveSnapshot(ctx, srv.conn, db, args[0])
			if err != nil {
				return err
			}
			if cl.g.json {
				return printJSON(cmd.OutOrStdout(), s)
			}
			fmt.Fprintf(cmd.OutOrStdout(), "removed snapshot %s of %s\n", s.Name, s.Source)
			return nil
		},
	}
	cmd.Flags().StringVar(&db, "db", "", "the database whose snapshot it is (needed when several have one of that name)")
	return cmd
}

// dbAndSnapshot reads the DB [NAME] arguments of snapshot and restore and
// validates both names before any SQL runs.
func dbAndSnapshot(args []string) (db, name string, err error) {
	db = args[0]
	if len(args) > 1 {
		name = args[1]
	}
	if err := dbclone.ValidateName(db); err != nil {
		return "", "", err
	}
	if name != "" {
		if err := dbclone.ValidateName(name); err != nil {
			return "", "", err
		}
	}
	return db, name, nil
}
