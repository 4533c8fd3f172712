package main

import (
	"context"
	"fmt"
	"net"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/pgfork/pgfork/branches"
	"github.com/pgfork/pgfork/cluster"
	"github.com/pgfork/pgfork/internal/servelock"
	"github.com/pgfork/pgfork/internal/units"
)

func (cl *cli) newLsCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "ls",
		Short: "List what pgfork runs: up clusters, branches, serve's pools",
		Long: `List the clusters started by pgfork up, the branches of pgfork branch,
restore --start and clone --start (and of a serve on this state directory:
kind branch, named branch.NAME, their URL with the branch's role, stopped
ones too), and what an older pgfork's restore --start and clone --start
started: name, kind (up, branch, restore, clone),
state, URL, server pid, PostgreSQL version, disk use (SIZE; OWN is what is not
shared by reflink with the template, backups or source), age and TTL, and
where a branch came from (--json: source). A pgfork serve running on the
state directory adds a row per template it pools test databases for (kind
pool, named pool.HASH: its pid, its URL, its databases by state; asked over
HTTP with PGFORK_TOKEN if set, and only while the serve is proven to hold
the state directory: its lock held, its pid yours with the start time it
recorded); pgfork down leaves pools to serve.

States: running; starting (pgfork up is creating it); stopped (its server was
shut down cleanly by someone else; remove it with pgfork down); dead (server
crashed or killed: removed by the reaper).

` + reaperHelp,
		Example: `  pgfork ls
  pgfork ls --json | jq -r '.[] | select(.state == "running") | .url'`,
		Args: usageArgs(cobra.NoArgs),
		RunE: func(cmd *cobra.Command, _ []string) error {
			lay := cl.layout()
			cl.reap(cmd.Context(), lay)
			all, err := cluster.List(lay)
			if err != nil {
				return err
			}
			all = cl.withPools(cmd.Context(), cl.withBranches(all))
			out := cmd.OutOrStdout()
			if cl.g.json {
				if all == nil {
					all = []cluster.Entry{}
				}
				return printJSON(out, all)
			}
			if len(all) == 0 {
				cl.infof("no clusters; start one with `pgfork up`")
				return nil
			}
			tw := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "NAME\tKIND\tSTATE\tPG\tPID\tSIZE\tOWN\tAGE\tTTL\tURL")
			now := time.Now()
			for _, e := range all {
				pid, ttl, age := "-", "-", "-"
				if e.Pid != 0 && e.State == cluster.Running {
					pid = fmt.Sprint(e.Pid)
				}
				if !e.Expires().IsZero() {
					ttl = "in " + humanDuration(e.Expires().Sub(now))
				}
				if e.ParentPid != 0 {
					if ttl == "-" {
						ttl = ""
					} else {
						ttl += ", "
					}
					ttl += fmt.Sprintf("parent %d", e.ParentPid)
				}
				if !e.Created.IsZero() {
					age = humanDuration(now.Sub(e.Created))
				}
				kind := e.Kind
				if kind == "" {
					kind = "up"
				}
				fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", e.Name, kind, e.State, orDash(e.PGVersion), pid,
					units.Bytes(e.Size), units.Bytes(e.Size-e.Shared), age, ttl, orDash(e.URL)+poolCounts(e))
			}
			return tw.Flush()
		},
	}
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

// humanDuration prints d coarsely: 45s, 12m, 3h, 2d.
func humanDuration(d time.Duration) string {
	switch {
	case d < 0:
		return "0s"
	case d < time.Minute:
		return fmt.Sprintf("%ds", int(d.Seconds()))
	case d < time.Hour:
		return fmt.Sprintf("%dm", int(d.Minutes()))
	case d < 48*time.Hour:
		return fmt.Sprintf("%dh", int(d.Hours()))
	}
	return fmt.Sprintf("%dd", int(d.Hours()/24))
}

// withBranches shows the branches of the state directory in pgfork ls:
// a running one's registry entry gets kind "branch" and the branch's URL
// (its role, not the bootstrap superuser's), a stopped one a row of its
// own.
func (cl *cli) withBranches(all []cluster.Entry) []cluster.Entry {
	bs, err := branches.Peek(cl.layout())
	if err != nil {
		cl.infof("branches not listed: %v", err)
		return all
	}
	byName := map[string]branches.Branch{}
	for _, b := range bs {
		byName[b.Name] = b
	}
	for i := range all {
		if n, ok := branches.BranchOf(all[i].Name); ok {
			if b, ok := byName[n]; ok {
				all[i].Kind, all[i].URL = "branch", b.Conn
				delete(byName, n)
			}
		}
	}
	for _, b := range bs {
		if _, stopped := byName[b.Name]; stopped {
			all = append(all, cluster.Entry{State: cluster.Stopped, Info: cluster.Info{Name: "branch." + b.Name, Kind: "branch",
				URL: b.Conn, Host: b.Host, Port: b.Port, Source: b.From, Created: b.Created}})
		}
	}
	return all
}

// withPools shows the test-database pools of a pgfork serve running on
// the state directory in pgfork ls: a row per template (kind "pool", named
// pool.HASH, the serve's pid and URL; its databases by state as source),
// asked of the serve (GET /api/v2/templates, with PGFORK_TOKEN if set).
func (cl *cli) withPools(ctx context.Context, all []cluster.Entry) []cluster.Entry {
	// Only a serve proven to hold the state directory (its lock, its pid's
	// user and start time) is asked, with the token: a record a killed
	// serve left names a pid and a port another user may hold now.
	o, ok := servelock.Find(cl.layout())
	if !ok {
		return all
	}
	pid, addr := o.Pid, o.Listen
	if host, port, err := net.SplitHostPort(addr); err == nil {
		if ip := net.ParseIP(host); host == "" || ip != nil && ip.IsUnspecified() {
			addr = net.JoinHostPort("127.0.0.1", port)
		}
	}
	ctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	var list struct {
		Templates []struct {
			Hash      string         `json:"templateHash"`
			State     string         `json:"state"`
			Databases map[string]int `json:"databases"`
			Kept      int            `json:"kept"`
			Max       int            `json:"max"`
		} `json:"templates"`
	}
	c := &branchClient{server: "http://" + addr, token: cl.getenv("PGFORK_TOKEN")}
	if err := c.call(ctx, "GET", "/api/v2/templates", nil, &list); err != nil {
		cl.infof("pools of the pgfork serve at %s (pid %d) not listed: %v", addr, pid, err)
		return all
	}
	for _, t := range list.Templates {
		d := t.Databases
		all = append(all, cluster.Entry{State: cluster.Running, Info: cluster.Info{Name: "pool." + t.Hash, Kind: "pool",
			Pid: pid, URL: c.server, Source: fmt.Sprintf("template %s: %d ready, %d in use, %d being made, %d kept (at most %d)",
				t.State, d["ready"], d["in_use"], d["creating"]+d["recreating"]+d["dirty"], t.Kept, t.Max)}})
	}
	return all
}

// poolCounts is what pgfork ls prints after a pool's URL: its databases.
func poolCounts(e cluster.Entry) string {
	if e.Kind != "pool" {
		return ""
	}
	return " (" + e.Source + ")"
}
