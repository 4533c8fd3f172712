package main

import (
	"bufio"
	"fmt"
	"io"
	"runtime"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/pgfork/pgfork/instance"
	"github.com/pgfork/pgfork/internal/errs"
	"github.com/pgfork/pgfork/internal/units"
	"github.com/pgfork/pgfork/pgbin"
	"github.com/pgfork/pgfork/upgrade"
)

type upgradeFlags struct {
	to                   string
	mode                 string
	jobs                 int
	rehearse, noRehearse bool
	rehearseOnly, check  bool
	stopOld, yes         bool
	superuser            string
	oldBin, newBin       string
	noAnalyze            bool
	waitAnalyze          bool
	logical, rollback    bool
	window               time.Duration
}

func (cl *cli) newUpgradeCmd() *cobra.Command {
	var f upgradeFlags
	cmd := &cobra.Command{
		Use:   "upgrade OLD_DATADIR NEW_DATADIR --to MAJOR",
		Short: "Upgrade a cluster to a newer major with pg_upgrade, rehearsed on a clone first",
		Long: `Upgrade the cluster in OLD_DATADIR to PostgreSQL MAJOR in NEW_DATADIR,
which pgfork creates, with pg_upgrade in the fastest transfer mode the disks allow.

pgfork finds the old and new binaries (the old by OLD_DATADIR's PG_VERSION; a
missing major is installed with ` + "`pgfork pg install MAJOR`" + `), reads the old
cluster's settings (pg_controldata, and encoding, locale and bootstrap superuser
from its catalogs) and creates the new cluster to match them, data checksums
included. It refuses, saying what to do, when the old cluster runs without
--stop-old, NEW_DATADIR exists, space is short for the mode, or the version pair
is not supported.

Modes (--mode):
  auto             clone when both directories are on one filesystem that clones
                   files (XFS with reflink, btrfs), else copy-file-range (pg_upgrade
                   17+), else copy. The old cluster stays usable.
  clone, copy-file-range, copy
                   pg_upgrade's modes of the same names; the old cluster stays usable.
  link, swap       fastest without copy-on-write, but the old cluster can no longer
                   be started once the new one has run (swap: at all). Asked only
                   with --yes or an interactive confirmation.

Rehearsal: by default, when the old cluster's filesystem can clone, pgfork first
clones it (copy-on-write: seconds, little space), runs the whole upgrade on the
clone, starts the result, connects to every database and counts its relations,
then deletes the clone; the original is only read (verified). Only then does it
upgrade for real. When the old cluster runs (--stop-old), the rehearsal works on
an online clone while it keeps serving, and pgfork stops it (fast shutdown) only
once the rehearsal passed: the downtime is the real run alone. If its catalogs
changed in between (a new database, extension, table), pgfork says so and runs
pg_upgrade --check again first. A failed rehearsal leaves it running.
--rehearse-only stops after the rehearsal; --check only runs pg_upgrade --check.
pg_upgrade runs the same checks at the start of every run and changes nothing
when one fails: pgfork explains its findings in plain words.

After the upgrade pgfork starts the new cluster on a private socket and checks
every database. Then, as pg_upgrade's documentation recommends, it hands the new
cluster over: it starts it with the old cluster's authentication (pg_hba.conf,
pg_ident.conf), port, socket directories, listen addresses and SSL settings (read
from the running server, its command line included; never initdb's local trust)
and leaves it running, and vacuumdb --analyze-in-stages rebuilds
statistics while the application connects (PostgreSQL 18+ keeps most statistics:
--missing-stats-only gathers the rest). --wait-analyze rebuilds them first
(--analyze-only) and leaves the new cluster stopped, as --no-analyze does. The
summary shows the time until it accepted connections apart from the time until
statistics were rebuilt. On failure pg_upgrade's logs are kept
beside NEW_DATADIR and the error says where; the new cluster is built in a staging
directory, so NEW_DATADIR never half-exists, and an interrupted run is cleaned up
by the next one. Ctrl-C after the old cluster was stopped starts it again while it
is intact, or (--mode link/swap past pg_upgrade's transfer) finishes the hand-over
first; either way the message says which cluster serves.

--logical upgrades a running cluster with a write pause of about a second instead:
pg_upgrade runs on an online reflink clone while the old cluster serves, logical
replication carries what was written since, and writes are refused only while the
new cluster confirms the last of them (at most --window, else it rolls back). With
--stop-old the pause ends with the hand-over (the old cluster stopped, the new one on
its address); without, the old cluster is left read-only and the new one on a private
socket. --logical --rollback goes back to the old cluster while it is intact (writes
made on the new one since are not carried back). docs/upgrade.md says when to choose it
and what it cannot carry.`,
		Example: `  # rehearse on a clone, then upgrade in the fastest safe mode
  pgfork upgrade /var/lib/postgresql/15/main /var/lib/postgresql/18/main --to 18

  # the cluster still runs: rehearse while it serves, then shut it down cleanly
  pgfork upgrade /srv/pg15 /srv/pg18 --to 18 --stop-old

  # only find out whether it would work (nothing is written to the old cluster)
  pgfork upgrade /srv/pg15 /srv/pg18 --to 18 --rehearse-only

  # a running cluster, writes paused about a second (logical replication)
  pgfork upgrade /srv/pg15 /srv/pg18 --to 18 --logical --stop-old

  # hard links, no copy-on-write filesystem: the old cluster is gone afterwards
  pgfork upgrade /srv/pg15 /srv/pg18 --to 18 --mode link --yes --json`,
		Args: usageArgs(cobra.ExactArgs(2)),
		RunE: func(cmd *cobra.Command, args []string) error { return cl.runUpgrade(cmd, args, f) },
	}
	fl := cmd.Flags()
	fl.StringVar(&f.to, "to", "", "target PostgreSQL major version, e.g. 18 (required)")
	fl.StringVar(&f.mode, "mode", "auto", "transfer mode: auto, clone, copy-file-range, copy, link, swap")
	// Two jobs per core: pg_upgrade's per-database jobs (pg_dump, the
	// schema restore, the checks) each wait on a server round trip, so
	// jobs = cores leaves the cores idle much of the time (docs/upgrade.md
	// has the measurement).
	fl.IntVarP(&f.jobs, "jobs", "j", 2*runtime.NumCPU(), "parallel jobs for pg_upgrade and vacuumdb (default: twice the number of cores)")
	fl.BoolVar(&f.rehearse, "rehearse", false, "rehearse on a clone first even where the filesystem cannot clone (a full copy)")
	fl.BoolVar(&f.noRehearse, "no-rehearse", false, "skip the rehearsal")
	fl.BoolVar(&f.rehearseOnly, "rehearse-only", false, "rehearse on a clone and stop; the old cluster is not written")
	fl.BoolVar(&f.check, "check", false, "only run pg_upgrade --check against a matching new cluster, then remove it")
	fl.BoolVar(&f.stopOld, "stop-old", false, "shut a running old cluster down cleanly (fast), after the rehearsal on an online clone of it")
	fl.BoolVarP(&f.yes, "yes", "y", false, "confirm that --mode link/swap make the old cluster unusable")
	fl.StringVar(&f.superuser, "superuser", "", "the old cluster's bootstrap superuser (default: found by connecting as postgres or the data directory's owner)")
	fl.StringVar(&f.oldBin, "old-bindir", "", "bin directory of the old PostgreSQL (default: found by OLD_DATADIR's version)")
	fl.StringVar(&f.newBin, "new-bindir", "", "bin directory of the new PostgreSQL (default: found by --to)")
	fl.BoolVar(&f.noAnalyze, "no-analyze", false, "do not rebuild optimizer statistics after the upgrade (run vacuumdb yourself)")
	fl.BoolVar(&f.waitAnalyze, "wait-analyze", false, "rebuild statistics before anyone may connect, and leave the new cluster stopped")
	fl.BoolVar(&f.logical, "logical", false, "upgrade the running cluster on a clone and carry the rest by logical replication: writes pause about a second")
	fl.BoolVar(&f.rollback, "rollback", false, "with --logical: go back to the old cluster after the upgrade (stop the new one, start the old one, allow writes)")
	fl.DurationVar(&f.window, "window", 10*time.Second, "with --logical: the longest write pause; past it writes are given back and the run rolls back")
	return cmd
}

func (cl *cli) runUpgrade(cmd *cobra.Command, args []string, f upgradeFlags) error {
	ctx := cmd.Context()
	if f.to == "" {
		return errs.New(errs.Usage, "--to is required").WithHint("pass the target major, e.g. --to 18")
	}
	to, err := strconv.Atoi(f.to)
	if err != nil || to < 10 {
		return errs.New(errs.Usage, "bad --to %q: want a major version such as 18", f.to).WithHint("see `pgfork pg list`")
	}
	mode, err := upgrade.ParseMode(f.mode)
	if err != nil {
		return err
	}
	if f.logical {
		return cl.runUpgradeLogical(cmd, args, f, to)
	}
	if f.rollback || cmd.Flags().Changed("window") {
		return errs.New(errs.Usage, "--rollback and --window go with --logical").WithHint("add --logical")
	}
	n := 0
	for _, b := range []bool{f.rehearse, f.noRehearse, f.rehearseOnly, f.check} {
		if b {
			n++
		}
	}
	if n > 1 {
		return errs.New(errs.Usage, "--rehearse, --no-rehearse, --rehearse-only and --check exclude each other").WithHint("pass one of them")
	}
	if f.jobs < 1 {
		return errs.New(errs.Usage, "--jobs must be at least 1").WithHint("e.g. --jobs 4")
	}
	rh := upgrade.RehearseAuto
	switch {
	case f.rehearse:
		rh = upgrade.RehearseOn
	case f.noRehearse:
		rh = upgrade.RehearseOff
	case f.rehearseOnly:
		rh = upgrade.RehearseOnly
	}
	user, err := instance.ResolveUser(cl.g.runAs)
	if err != nil {
		return err
	}
	oldB, newB, err := upgrade.FindInstalls(pgbin.Options{StateDir: cl.layout().Root}, args[0], to, f.oldBin, f.newBin)
	if err != nil {
		return err
	}
	ep := &eventPrinter{cl: cl}
	opts := upgrade.Options{
		OldDir: args[0], NewDir: args[1], Old: oldB, New: newB,
		Mode: mode, Jobs: f.jobs, Rehearse: rh, CheckOnly: f.check,
		StopOld: f.stopOld, Confirmed: f.yes, Superuser: f.superuser, NoAnalyze: f.noAnalyze,
		WaitAnalyze: f.waitAnalyze,
		User:        user,
	}
	if !cl.g.quiet {
		opts.OnEvent = ep.event // progress costs a walk of the new files now and then
	}
	if !f.yes && isTerminal(cl.stdin) && !cl.g.json {
		opts.Confirm = func(warning string) bool { return confirm(cl.stdin, cl.stderr, warning) }
	}
	cl.infof("upgrading %s (PostgreSQL %s) to %s (PostgreSQL %s)", args[0], oldB.Version, args[1], newB.Version)
	res, err := upgrade.Run(ctx, opts)
	ep.done()
	if err != nil {
		return err
	}
	if cl.g.json {
		return printJSON(cmd.OutOrStdout(), res)
	}
	printUpgradeSummary(cmd.OutOrStdout(), res)
	return nil
}

// confirm asks the user to type "yes".
func confirm(in io.Reader, out io.Writer, warning string) bool {
	fmt.Fprintf(out, "WARNING: %s\nType yes to continue: ", warning)
	line, _ := bufio.NewReader(in).ReadString('\n')
	return strings.TrimSpace(strings.ToLower(line)) == "yes"
}

// eventPrinter shows an upgrade's progress on stderr: phases, pg_upgrade's
// steps as they happen, and a bar while data files are transferred.
type eventPrinter struct {
	cl    *cli
	bar   *byteProgress
	start map[string]time.Time
}

func (p *eventPrinter) event(e upgrade.Event) {
	if p.cl.g.quiet {
		return
	}
	if p.start == nil {
		p.start = map[string]time.Time{}
	}
	switch {
	case e.Message != "":
		p.cl.infof("  %s", e.Message)
	case e.TotalBytes > 0:
		if p.bar == nil {
			p.bar = p.cl.newByteProgress("  transferring")
		}
		p.bar.Update(e.Bytes, e.TotalBytes)
	case e.Step != "" && !e.Done:
		p.start[e.Step] = time.Now()
		p.cl.infof("  [%s] %s ...", e.Phase, e.Step)
	case e.Step != "" && e.Done:
		if p.bar != nil {
			p.bar.Done()
			p.bar = nil
		}
		el := ""
		if t, ok := p.start[e.Step]; ok {
			el = " (" + time.Since(t).Round(10*time.Millisecond).String() + ")"
		}
		p.cl.infof("  [%s] %s: %s%s", e.Phase, e.Step, e.Status, el)
	case !e.Done:
		p.start[e.Phase] = time.Now()
		p.cl.infof("%s ...", e.Phase)
	}
}

func (p *eventPrinter) done() {
	if p.bar != nil {
		p.bar.Done()
	}
}

func printUpgradeSummary(w io.Writer, r *upgrade.Result) {
	switch {
	case r.CheckOnly:
		fmt.Fprintf(w, "check passed: %s can be upgraded to PostgreSQL %s with --mode %s (nothing was changed)\n", r.OldDir, r.NewVersion, r.Mode)
	case r.RehearsalOnly:
		fmt.Fprintf(w, "rehearsal passed: %s upgrades to PostgreSQL %s on a clone (--mode %s would be used for real); the original was not written\n",
			r.OldDir, r.NewVersion, r.Mode)
	default:
		fmt.Fprintf(w, "upgraded %s (PostgreSQL %s) to %s (PostgreSQL %s)\n", r.OldDir, r.OldVersion, r.NewDir, r.NewVersion)
	}
	fmt.Fprintf(w, "  mode:       %s (%s)\n", r.Mode, r.ModeReason)
	if !r.CheckOnly && !r.RehearsalOnly {
		fmt.Fprintf(w, "  data:       %s transferred: %s shared with the old cluster, %s copied\n",
			units.Bytes(r.Bytes), units.Bytes(r.SharedBytes), units.Bytes(r.CopiedBytes))
	}
	if r.Rehearsal != nil {
		if r.Rehearsal.Online {
			fmt.Fprintf(w, "  rehearsal:  %s on an online %s clone while the old cluster served, %d databases checked\n",
				r.Rehearsal.Elapsed.Round(10*time.Millisecond), r.Rehearsal.Mode, len(r.Rehearsal.Relations))
		} else {
			fmt.Fprintf(w, "  rehearsal:  %s on a %s clone, %d databases checked, original unchanged: %v\n",
				r.Rehearsal.Elapsed.Round(10*time.Millisecond), r.Rehearsal.Mode, len(r.Rehearsal.Relations), r.Rehearsal.OriginalUnchanged)
		}
	}
	for _, c := range r.CatalogChanges {
		fmt.Fprintf(w, "  changed:    %s (after the rehearsal; pg_upgrade --check ran again)\n", c)
	}
	if r.Running {
		fmt.Fprintf(w, "  ready:      accepted connections after %s (pgfork started it), statistics rebuilt after %s\n",
			r.AcceptsAfter.Round(10*time.Millisecond), r.StatisticsAfter.Round(10*time.Millisecond))
	}
	if r.Downtime > 0 {
		until := "new cluster upgraded, checked and stopped, ready to start"
		if r.Running {
			until = "new cluster accepts connections"
		}
		fmt.Fprintf(w, "  downtime:   %s (old cluster stopped → %s)\n", r.Downtime.Round(10*time.Millisecond), until)
	}
	var ph []string
	for _, p := range r.Phases {
		ph = append(ph, fmt.Sprintf("%s %s", p.Name, p.Elapsed.Round(10*time.Millisecond)))
	}
	fmt.Fprintf(w, "  time:       %s (%s)\n", r.Elapsed.Round(10*time.Millisecond), strings.Join(ph, ", "))
	if r.Statistics != "" {
		fmt.Fprintf(w, "  statistics: %s\n", r.Statistics)
	}
	for _, f := range r.Findings {
		fmt.Fprintf(w, "  warning:    %s\n", f)
	}
	for _, n := range r.Notes {
		fmt.Fprintf(w, "  note:       %s\n", n)
	}
}
