package main

import (
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/pgfork/pgfork/instance"
	"github.com/pgfork/pgfork/internal/errs"
	"github.com/pgfork/pgfork/pgbin"
	"github.com/pgfork/pgfork/upgrade"
	"github.com/pgfork/pgfork/upgrade/logical"
)

// runUpgradeLogical runs `pgfork upgrade --logical`.
func (cl *cli) runUpgradeLogical(cmd *cobra.Command, args []string, f upgradeFlags, to int) error {
	var bad []string
	for name, set := range map[string]bool{
		"--rehearse": f.rehearse, "--no-rehearse": f.noRehearse, "--rehearse-only": f.rehearseOnly, "--check": f.check,
		"--no-analyze": f.noAnalyze, "--wait-analyze": f.waitAnalyze,
		"--mode": cmd.Flags().Changed("mode") && f.mode != string(upgrade.Clone) && f.mode != string(upgrade.Auto),
	} {
		if set {
			bad = append(bad, name)
		}
	}
	if len(bad) > 0 {
		return errs.New(errs.Usage, "--logical does not take %s", strings.Join(bad, ", ")).
			WithHint("--logical always clones online and runs pg_upgrade --clone on the clone, and analyzes before the hand-over: drop those flags")
	}
	if f.window <= 0 {
		return errs.New(errs.Usage, "--window must be positive").WithHint("e.g. --window 5s")
	}
	user, err := instance.ResolveUser(cl.g.runAs)
	if err != nil {
		return err
	}
	oldB, newB, err := upgrade.FindInstalls(pgbin.Options{StateDir: cl.layout().Root}, args[0], to, f.oldBin, f.newBin)
	if err != nil {
		return err
	}
	if f.rollback {
		rb, err := logical.Rollback(cmd.Context(), logical.Options{OldDir: args[0], NewDir: args[1], Old: oldB, New: newB,
			Superuser: f.superuser, User: user})
		if err != nil {
			return err
		}
		if cl.g.json {
			return printJSON(cmd.OutOrStdout(), rb)
		}
		fmt.Fprintf(cmd.OutOrStdout(), "rolled back to %s: %s\n", rb.OldDir, strings.Join(rb.Did, "; "))
		return nil
	}
	ep := &eventPrinter{cl: cl}
	opts := logical.Options{OldDir: args[0], NewDir: args[1], Old: oldB, New: newB, Jobs: f.jobs,
		Superuser: f.superuser, User: user, Window: f.window, HandOver: f.stopOld}
	if !cl.g.quiet {
		opts.OnEvent = ep.event
	}
	cl.infof("upgrading %s (PostgreSQL %s) to %s (PostgreSQL %s) while it serves (--logical)", args[0], oldB.Version, args[1], newB.Version)
	res, err := logical.Run(cmd.Context(), opts)
	ep.done()
	if err != nil {
		return err
	}
	if cl.g.json {
		return printJSON(cmd.OutOrStdout(), res)
	}
	printLogicalSummary(cmd.OutOrStdout(), res)
	return nil
}

func printLogicalSummary(w io.Writer, r *logical.Result) {
	fmt.Fprintf(w, "upgraded %s (PostgreSQL %s) to %s (PostgreSQL %s) with logical replication from %s\n",
		r.OldDir, r.OldVersion, r.NewDir, r.NewVersion, r.R)
	fmt.Fprintf(w, "  window:     writes refused on the old cluster for %s (%d databases, %d sequences copied)\n",
		r.Window.Round(time.Millisecond), len(r.Databases), r.Sequences)
	switch {
	case !r.WALScan:
		fmt.Fprintf(w, "  subscribed: all %d databases (the WAL since R was not scanned: pg_walinspect missing on the old cluster, or its scan failed)\n", len(r.Subscribed))
	case len(r.SubscribedInWindow) > 0:
		fmt.Fprintf(w, "  subscribed: %d of %d databases, the ones the WAL since R shows written (%d of them found in the window)\n",
			len(r.Subscribed), len(r.Databases), len(r.SubscribedInWindow))
	default:
		fmt.Fprintf(w, "  subscribed: %d of %d databases, the ones the WAL since R shows written\n", len(r.Subscribed), len(r.Databases))
	}
	var ph []string
	for _, p := range r.Phases {
		ph = append(ph, fmt.Sprintf("%s %s", p.Name, p.Elapsed.Round(10*time.Millisecond)))
	}
	fmt.Fprintf(w, "  time:       %s (%s)\n", r.Elapsed.Round(10*time.Millisecond), strings.Join(ph, ", "))
	for _, n := range r.Notes {
		fmt.Fprintf(w, "  note:       %s\n", n)
	}
}
