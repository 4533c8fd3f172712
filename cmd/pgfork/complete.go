package main

import (
	"context"
	"slices"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/pgfork/pgfork/cluster"
	"github.com/pgfork/pgfork/dbclone"
	"github.com/pgfork/pgfork/template"
)

// Shell completion of the names pgfork knows: `pgfork completion bash|zsh|
// fish|powershell` (cobra's) prints the script; these functions give it the
// cluster, template and snapshot names. They never fail loudly: a completion
// that cannot look something up offers nothing.

// completeClusters offers the names `pgfork ls` lists.
func (cl *cli) completeClusters(_ *cobra.Command, args []string, prefix string) ([]string, cobra.ShellCompDirective) {
	list, err := cluster.List(cl.layout())
	if err != nil {
		return nil, cobra.ShellCompDirectiveNoFileComp
	}
	var out []string
	for _, e := range list {
		if strings.HasPrefix(e.Name, prefix) && !slices.Contains(args, e.Name) {
			out = append(out, e.Name+"\t"+string(e.State))
		}
	}
	return out, cobra.ShellCompDirectiveNoFileComp
}

// completeTemplates offers the keys `pgfork template ls` lists.
func (cl *cli) completeTemplates(_ *cobra.Command, args []string, prefix string) ([]string, cobra.ShellCompDirective) {
	list, err := template.List(cl.layout())
	if err != nil {
		return nil, cobra.ShellCompDirectiveNoFileComp
	}
	var out []string
	for _, m := range list {
		if strings.HasPrefix(m.Key, prefix) && !slices.Contains(args, m.Key) {
			out = append(out, m.Key+"\tPostgreSQL "+m.PGVersion)
		}
	}
	return out, cobra.ShellCompDirectiveNoFileComp
}

// completeSnapshots offers snapshot names on the server the db flags name
// (the database's own when it is the first argument), within 2 s.
func (cl *cli) completeSnapshots(first bool) cobra.CompletionFunc {
	return func(cmd *cobra.Command, args []string, prefix string) ([]string, cobra.ShellCompDirective) {
		if !first && len(args) != 1 || first && len(args) != 0 {
			return nil, cobra.ShellCompDirectiveNoFileComp
		}
		ctx, cancel := context.WithTimeout(cmd.Context(), 2*time.Second)
		defer cancel()
		srv, err := cl.connectDB(ctx)
		if err != nil {
			return nil, cobra.ShellCompDirectiveNoFileComp
		}
		defer srv.close()
		db := ""
		if !first {
			db = args[0]
		}
		list, err := dbclone.Snapshots(ctx, srv.conn, db)
		if err != nil {
			return nil, cobra.ShellCompDirectiveNoFileComp
		}
		var out []string
		for _, s := range list {
			if strings.HasPrefix(s.Name, prefix) {
				out = append(out, s.Name+"\tof "+s.Source)
			}
		}
		return out, cobra.ShellCompDirectiveNoFileComp
	}
}
