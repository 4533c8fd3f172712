package main

import (
	"fmt"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/pgfork/pgfork/internal/errs"
	"github.com/pgfork/pgfork/internal/units"
	"github.com/pgfork/pgfork/template"
)

func (cl *cli) newTemplateCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "template",
		Short: "List, remove and prune cached template clusters",
		Long: `pgfork up clones clusters from cached templates: clusters made by initdb,
set up by --setup/--setup-cmd and shut down cleanly, kept under
<state-dir>/templates/<key>. The key is a hash of the PostgreSQL version,
initdb options, setup file names and contents and the setup command, so a
changed schema file makes a new template; old ones stay until removed or
pruned. Removing a template removes its spare copies (see pgfork up
--spares) and does not affect clusters cloned from it.`,
		Example: `  pgfork template ls
  pgfork template rm 3fa2c1
  pgfork template prune --older-than 168h`,
		Args: usageArgs(cobra.NoArgs),
		RunE: func(cmd *cobra.Command, _ []string) error { return cmd.Help() },
	}
	cmd.AddCommand(cl.newTemplateLsCmd(), cl.newTemplateRmCmd(), cl.newTemplatePruneCmd(), cl.newTemplateRefillCmd())
	return cmd
}

func (cl *cli) newTemplateLsCmd() *cobra.Command {
	return &cobra.Command{
		Use:     "ls",
		Aliases: []string{"list"},
		Short:   "List cached templates",
		Long: `List cached templates, most recently used first: key, PostgreSQL version,
spare copies ready for pgfork up, setup (files and command), disk size, age
and last use.`,
		Example: `  pgfork template ls
  pgfork template ls --json | jq -r '.[].key'`,
		Args: usageArgs(cobra.NoArgs),
		RunE: func(cmd *cobra.Command, _ []string) error {
			all, err := template.List(cl.layout())
			if err != nil {
				return err
			}
			out := cmd.OutOrStdout()
			if cl.g.json {
				if all == nil {
					all = []template.Meta{}
				}
				return printJSON(out, all)
			}
			if len(all) == 0 {
				cl.infof("no templates; pgfork up builds one on first use")
				return nil
			}
			tw := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "KEY\tPG\tSPARES\tSIZE\tAGE\tLAST USED\tSETUP")
			now := time.Now()
			for _, m := range all {
				fmt.Fprintf(tw, "%s\t%s\t%d\t%s\t%s\t%s ago\t%s\n", m.Key, m.PGVersion, m.Spares, units.Bytes(m.Size),
					humanDuration(now.Sub(m.Created)), humanDuration(now.Sub(m.LastUsed)), setupSummary(m))
			}
			return tw.Flush()
		},
	}
}

func setupSummary(m template.Meta) string {
	parts := append([]string{}, m.Setup...)
	if m.SetupCmd != "" {
		parts = append(parts, "cmd: "+m.SetupCmd)
	}
	if len(parts) == 0 {
		return "(none)"
	}
	s := strings.Join(parts, ", ")
	if len(s) > 60 {
		s = s[:57] + "..."
	}
	return s
}

func (cl *cli) newTemplateRmCmd() *cobra.Command {
	var all bool
	cmd := &cobra.Command{
		Use:               "rm KEY... | --all",
		ValidArgsFunction: cl.completeTemplates,
		Short:             "Remove cached templates",
		Long: `Remove cached templates by key (or a unique prefix of one). A template that
another pgfork is building or copying right now is not removed (exit code 6).
Clusters cloned from a template are independent and keep running.`,
		Example: `  pgfork template rm 3fa2c1
  pgfork template rm --all`,
		RunE: func(cmd *cobra.Command, args []string) error {
			if all == (len(args) > 0) {
				return errs.New(errs.Usage, "give template keys or --all, not both or neither").
					WithHint("see `pgfork template ls` for the keys")
			}
			lay := cl.layout()
			var keys []string
			if all {
				list, err := template.List(lay)
				if err != nil {
					return err
				}
				for _, m := range list {
					keys = append(keys, m.Key)
				}
			} else {
				for _, a := range args {
					k, err := template.Resolve(lay, a)
					if err != nil {
						return err
					}
					keys = append(keys, k)
				}
			}
			removed := []string{}
			var firstErr error
			for _, k := range keys {
				if err := template.Remove(cmd.Context(), lay, k); err != nil {
					if len(keys) == 1 {
						return err
					}
					cl.reportError(err)
					if firstErr == nil {
						firstErr = err
					}
					continue
				}
				removed = append(removed, k)
				if !cl.g.json {
					fmt.Fprintln(cmd.OutOrStdout(), k)
				}
			}
			if cl.g.json {
				if err := printJSON(cmd.OutOrStdout(), map[string]any{"removed": removed}); err != nil {
					return err
				}
			}
			if firstErr != nil {
				return errs.New(errs.KindOf(firstErr), "%d of %d templates not removed (see above)", len(keys)-len(removed), len(keys)).
					WithHint("try again once the other pgfork is done")
			}
			return nil
		},
	}
	cmd.Flags().BoolVar(&all, "all", false, "remove every template")
	return cmd
}

func (cl *cli) newTemplatePruneCmd() *cobra.Command {
	var olderThan time.Duration
	cmd := &cobra.Command{
		Use:   "prune",
		Short: "Remove templates not used for a while",
		Long: `Remove templates that no pgfork up has used for longer than --older-than
(default 7 days; 0 removes all that are not in use). Templates being built or
copied are skipped.`,
		Example: `  pgfork template prune
  pgfork template prune --older-than 24h
  pgfork template prune --older-than 0 --json`,
		Args: usageArgs(cobra.NoArgs),
		RunE: func(cmd *cobra.Command, _ []string) error {
			if olderThan < 0 {
				return errs.New(errs.Usage, "--older-than must not be negative").WithHint("e.g. --older-than 24h")
			}
			res, err := template.Prune(cmd.Context(), cl.layout(), olderThan)
			if err != nil {
				return err
			}
			if cl.g.json {
				return printJSON(cmd.OutOrStdout(), res)
			}
			var freed int64
			for _, m := range res.Removed {
				fmt.Fprintln(cmd.OutOrStdout(), m.Key)
				freed += m.Size
			}
			for _, m := range res.Busy {
				cl.infof("kept %s: in use", m.Key)
			}
			cl.infof("removed %d template(s), %s", len(res.Removed), units.Bytes(freed))
			return nil
		},
	}
	cmd.Flags().DurationVar(&olderThan, "older-than", 7*24*time.Hour, "remove templates last used longer ago than this")
	return cmd
}
