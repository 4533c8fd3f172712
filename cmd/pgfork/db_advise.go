package main

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"text/tabwriter"

	"github.com/spf13/cobra"

	"github.com/pgfork/pgfork/dbclone"
	"github.com/pgfork/pgfork/internal/errs"
	"github.com/pgfork/pgfork/internal/fsutil"
)

func (cl *cli) newDBAdviseCmd() *cobra.Command {
	var from string
	cmd := &cobra.Command{
		Use:   "advise --from TEMPLATE",
		Short: "Show which CREATE DATABASE strategy is fastest for a template, and why",
		Long: `Estimate how long copying TEMPLATE would take by each strategy on this server,
from the template's size (pg_database_size), shared_buffers, how much of it is
dirty (counted by pg_buffercache when installed in the connected database, else
estimated from the WAL written since the last checkpoint), fsync, the version and
whether the data directory can share blocks; and print the choice --strategy auto
would make, with its reasons.

The constants of the cost model were measured on pgfork's benchmark machine;
` + "`pgfork db calibrate`" + ` measures them on your server and stores them, and later
advice uses them.`,
		Example: `  pgfork db advise --from app_template
  pgfork db advise --from app_template --cluster dev --json`,
		Args: usageArgs(cobra.NoArgs),
		RunE: func(cmd *cobra.Command, _ []string) error {
			if from == "" {
				return errs.New(errs.Usage, "which template? --from TEMPLATE is required").WithHint("e.g. pgfork db advise --from template1")
			}
			if err := dbclone.ValidateName(from); err != nil {
				return err
			}
			ctx := cmd.Context()
			srv, err := cl.connectDB(ctx, from)
			if err != nil {
				return err
			}
			defer srv.close()
			adv, err := dbclone.AdviseLearned(ctx, srv.conn, from, srv.target, srv.cal, srv.learn)
			if err != nil {
				return err
			}
			if cl.g.json {
				return printJSON(cmd.OutOrStdout(), adv)
			}
			w := cmd.OutOrStdout()
			fmt.Fprintf(w, "choice: %s\n\n", adv.Choice)
			tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "STRATEGY\tESTIMATE\tNOTES")
			for _, e := range adv.Estimates {
				est := fmtDur(e.Time)
				if !e.Available {
					est = "unavailable"
				}
				fmt.Fprintf(tw, "%s\t%s\t%s\n", e.Strategy, est, e.Why)
			}
			_ = tw.Flush()
			fmt.Fprintln(w, "\nreasons:")
			for _, r := range adv.Reasons {
				fmt.Fprintf(w, "  - %s\n", r)
			}
			return nil
		},
	}
	cmd.Flags().StringVar(&from, "from", "", "template database (required)")
	return cmd
}

func (cl *cli) newDBCalibrateCmd() *cobra.Command {
	var (
		size, runs int
		save       string
	)
	cmd := &cobra.Command{
		Use:   "calibrate",
		Short: "Measure the strategy advisor's constants on this server and store them",
		Long: `Measure what each CREATE DATABASE strategy costs on this server: create scratch
databases pgfork_calib_* (an empty one and one with --size MB of data), copy each
by every strategy the server offers (--runs times, after a warm-up; the median
counts), time CHECKPOINT with no, few and many dirty buffers, and drop everything
it made. Needs CREATEDB and the right to run CHECKPOINT (superuser or pg_checkpoint).

The cost of FILE_COPY's checkpoints grows with shared_buffers even when nothing
is dirty. One calibration sees one shared_buffers size and takes that per-GB cost
from the built-in constants; calibrating again after changing shared_buffers
(and restarting) keeps the earlier measurement and measures the per-GB costs
from the two sizes.

The constants are stored so that later advice on this server uses them: for a
managed cluster (--cluster) in <state-dir>/calibration/cluster-NAME.json, else in
<state-dir>/calibration/system-<system identifier>.json (superusers can read the
identifier), or wherever --save says (then pass --calibration PATH later).`,
		Example: `  pgfork db calibrate --cluster dev
  pgfork db calibrate --url postgres://localhost/postgres --size 256 \
      --save ./pg-calibration.json`,
		Args: usageArgs(cobra.NoArgs),
		RunE: func(cmd *cobra.Command, _ []string) error {
			if size < 1 || runs < 1 {
				return errs.New(errs.Usage, "--size and --runs must be at least 1")
			}
			ctx := cmd.Context()
			srv, err := cl.connectDB(ctx)
			if err != nil {
				return err
			}
			defer srv.close()
			path := save
			if path == "" {
				path = srv.defaultCalFile()
			}
			if path == "" {
				return errs.New(errs.Usage, "cannot tell which server this is (its system identifier needs superuser to read)").
					WithHint("say where to store the result with --save PATH, and pass --calibration PATH later")
			}
			// An earlier calibration of this server at another shared_buffers
			// size lets this one measure the per-GB costs.
			var prev *dbclone.Calibration
			if srv.cal != nil && !srv.cal.Measured.IsZero() {
				prev = srv.cal
			}
			cl.infof("calibrating (scratch template of %d MB, %d runs per strategy)…", size, runs)
			c, err := dbclone.Calibrate(ctx, srv.conn, dbclone.CalibrateOptions{SizeMB: size, Runs: runs, Target: srv.target,
				Previous: prev, Progress: func(m string) { cl.infof("  %s", m) }})
			if err != nil {
				return err
			}
			if err := writeJSONFile(path, c); err != nil {
				return err
			}
			cl.infof("saved to %s", path)
			if cl.g.json {
				return printJSON(cmd.OutOrStdout(), c)
			}
			w := cmd.OutOrStdout()
			fmt.Fprintf(w, "%s\n", c.Source)
			tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
			perGB := "built-in; calibrate again at another shared_buffers to measure"
			if c.PerGBMeasured {
				perGB = fmt.Sprintf("measured at %d shared_buffers sizes", len(c.Points))
			}
			for _, kv := range []struct {
				k string
				v float64
			}{{"wal_log fixed (ms)", c.WalLogFixed}, {"wal_log per MB (ms)", c.WalLogPerMB}, {"wal_log per GB shared_buffers (ms, " + perGB + ")", c.WalLogPerGB},
				{"checkpoints fixed (ms)", c.CheckpointFixed}, {"checkpoints per GB shared_buffers (ms, " + perGB + ")", c.CheckpointPerGB},
				{"dirty buffers per MB (ms)", c.DirtyPerMB}, {"file_copy fixed (ms)", c.CopyFixed}, {"file_copy per MB (ms)", c.CopyPerMB},
				{"clone fixed (ms)", c.CloneFixed}, {"clone per MB (ms)", c.ClonePerMB}} {
				fmt.Fprintf(tw, "%s\t%.3f\n", kv.k, kv.v)
			}
			_ = tw.Flush()
			fmt.Fprintf(w, "saved to %s\n", path)
			return nil
		},
	}
	f := cmd.Flags()
	f.IntVar(&size, "size", 64, "MB of data in the scratch template")
	f.IntVar(&runs, "runs", 3, "runs per measurement (the median counts)")
	f.StringVar(&save, "save", "", "file to store the constants in (default: keyed by cluster or server in the state directory)")
	return cmd
}

// writeJSONFile writes v to path atomically and durably (fsutil.WriteFileAtomic).
func writeJSONFile(path string, v any) error {
	b, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return errs.Wrap(errs.Internal, err, "cannot encode")
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return errs.FromOS(err, filepath.Dir(path), "cannot create directory")
	}
	if err := fsutil.WriteFileAtomic(path, append(b, '\n'), 0o644); err != nil {
		return errs.FromOS(err, path, "cannot write")
	}
	return nil
}
