package main

import (
	"fmt"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/pgfork/pgfork/branches"
	"github.com/pgfork/pgfork/cluster"
	"github.com/pgfork/pgfork/internal/errs"
)

func (cl *cli) newDownCmd() *cobra.Command {
	var (
		all        bool
		timeout    time.Duration
		keepData   bool
		deleteData bool
	)
	cmd := &cobra.Command{
		Use:               "down NAME... | --all",
		ValidArgsFunction: cl.completeClusters,
		Short:             "Stop and remove clusters started by pgfork up, and branches",
		Long: `Stop clusters listed by pgfork ls and remove them: data directory, socket
directory and record. The server gets a fast shutdown (sessions are rolled
back); if it has not exited after --timeout, an immediate one.

A branch of pgfork branch (branch.NAME in pgfork ls) is removed as pgfork
branch rm NAME removes it (refused while protected; its snapshots stay);
--all leaves branches alone.

restore --start and clone --start make branches of pgfork branch now. What
an older pgfork's restore --start and clone --start started (kinds restore
and clone) keeps its data directory where it was made: down stops a restore
and keeps its data directory unless --delete-data is given, and removes a
clone's unless --keep-data is given; either way only if it is still the
directory the server was started on.

` + reaperHelp,
		Example: `  pgfork down pg-3f9a1c2b
  pgfork down --all
  pgfork down ci-1 ci-2 --timeout 2s`,
		RunE: func(cmd *cobra.Command, args []string) error {
			if all == (len(args) > 0) {
				return errs.New(errs.Usage, "give cluster names or --all, not both or neither").
					WithHint("see `pgfork ls` for the names")
			}
			if err := checkDuration("--timeout", timeout, maxStopTimeout, "--timeout 10s"); err != nil {
				return err
			}
			lay := cl.layout()
			ctx := cmd.Context()
			cl.reap(ctx, lay)
			names := args
			for _, n := range names {
				if err := cluster.ValidateName(n); err != nil {
					return err
				}
			}
			if all {
				list, err := cluster.List(lay)
				if err != nil {
					return err
				}
				for _, e := range list {
					names = append(names, e.Name)
				}
			}
			removed := []string{}
			var firstErr error
			var local branchService
			keptBranches := 0
			for _, n := range names {
				var err error
				if strings.HasPrefix(n, "pool.") {
					err = errs.New(errs.Usage, "%s is a test-database pool of pgfork serve, not a cluster", n).
						WithHint("its databases go when the tests give them back, when the template is discarded or when pgfork serve stops")
				} else if b, ok := branches.BranchOf(n); ok && all {
					// Every cluster, but a branch is removed by its name alone.
					keptBranches++
					continue
				} else if ok {
					// A branch: removed as pgfork branch rm removes it
					// (protection holds; its snapshot stays).
					if local == nil {
						if local, err = (&branchClient{}).open(ctx, cl); err != nil {
							return err
						}
						defer local.Close()
					}
					err = local.Delete(ctx, b)
				} else {
					err = cluster.Down(ctx, lay, n, cluster.DownOptions{Timeout: timeout, KeepData: keepData, DeleteData: deleteData})
				}
				if err != nil {
					// With --all, a cluster another pgfork is creating
					// or removing is skipped, not an error.
					if all && errs.KindOf(err) == errs.Busy || all && errs.KindOf(err) == errs.NotFound {
						continue
					}
					if len(names) == 1 {
						return err
					}
					cl.reportError(err)
					if firstErr == nil {
						firstErr = err
					}
					continue
				}
				removed = append(removed, n)
				if !cl.g.json {
					fmt.Fprintln(cmd.OutOrStdout(), n)
				}
			}
			if keptBranches > 0 {
				cl.infof("--all leaves branches (%d running kept): pgfork down branch.NAME or pgfork branch rm NAME removes one", keptBranches)
			}
			if cl.g.json {
				if err := printJSON(cmd.OutOrStdout(), map[string]any{"removed": removed}); err != nil {
					return err
				}
			}
			if firstErr != nil {
				return errs.New(errs.KindOf(firstErr), "%d of %d clusters not removed (see above)", len(names)-len(removed), len(names)).
					WithHint("see `pgfork ls`")
			}
			return nil
		},
	}
	cmd.Flags().BoolVar(&all, "all", false, "stop and remove every cluster")
	cmd.Flags().BoolVar(&keepData, "keep-data", false, "keep the data directory of a cluster an older clone --start started; only stop it and forget it")
	cmd.Flags().BoolVar(&deleteData, "delete-data", false, "also remove the data directory of a cluster an older restore --start started (kept by default)")
	cmd.Flags().DurationVar(&timeout, "timeout", cluster.DefaultStopTimeout, "wait this long for a fast shutdown before an immediate one")
	return cmd
}
