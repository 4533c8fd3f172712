package main

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"syscall"
	"time"

	"github.com/spf13/cobra"

	"github.com/pgfork/pgfork/internal/errs"
	"github.com/pgfork/pgfork/internal/proc"
	"github.com/pgfork/pgfork/internal/statedir"
	"github.com/pgfork/pgfork/pgbin"
	"github.com/pgfork/pgfork/template"
	"github.com/pgfork/pgfork/up"
)

const reaperHelp = `Forgotten clusters: give a cluster --ttl DUR (it is removed once that long
has passed since it started) and/or --parent-pid PID (it is removed once that
process exits; "parent" means the process that ran pgfork). pgfork has no
daemon: every pgfork up, ls and down first runs a cheap reaper that stops and
removes expired and orphaned clusters, and removes dead ones (server crashed or
killed, machine rebooted, leftovers of an interrupted up).`

func (cl *cli) newUpCmd() *cobra.Command {
	var (
		setup      []string
		setupCmd   string
		name       string
		tcp        bool
		ttl        time.Duration
		parentPid  string
		superuser  string
		spares     int
		volumeMode string
	)
	cmd := &cobra.Command{
		Use:   "up",
		Short: "Start a fresh throw-away PostgreSQL cluster from a cached template",
		Long: `Start a fresh, independent PostgreSQL cluster and print its connection URL.

The cluster is a copy of a template: a cleanly shut down cluster made by
initdb and set up by --setup SQL files (or directories of *.sql files,
applied in name order; in a directory with *.up.sql files the *.down.sql
files are skipped) and/or --setup-cmd (run with sh -c as you, with
DATABASE_URL and PGHOST/PGPORT/PGUSER/PGDATABASE pointing at the template's
server). The template is built on first use, once even when many pgfork up
run at the same moment, and cached under <state-dir>/templates keyed by a
hash of the PostgreSQL version, initdb options, setup files and command.
Later calls copy it (reflink where the filesystem can) and start postgres on
it: a new cluster in about the time of a postmaster start.

Spare copies: pgfork keeps --spares copies of each template ready (default
1, env PGFORK_SPARES, at most 16), so up claims one with a rename and only starts
postgres; a detached background pgfork then makes a new spare while your
tests run (up does not wait for it), at the lowest CPU and I/O priority.
When no spare is ready, up copies the template itself; refills pause while
any up runs, so a miss costs what --spares 0 does. --spares 0 copies every
time and keeps no spares. The
refill stops at the first error (a full disk among them) and does not start
a copy that would leave less than max(1 GiB, 10% of the filesystem) free. Spares
live in <state-dir>/clusters/.spare-*, are counted by pgfork template ls and
removed with their template.

Clusters listen on a Unix socket in a private directory; --tcp adds
127.0.0.1 on a free port, where the superuser needs a generated password
(scram-sha-256; it is in the printed URL, and in pgfork ls, readable by the
user who ran pgfork only). They run with the test profile (fsync off,
synchronous_commit off, full_page_writes off): fast, and not crash-safe.
As root, postgres runs as --run-as (default postgres).

` + reaperHelp,
		Example: `  pgfork up
  export DATABASE_URL=$(pgfork up --setup schema.sql --ttl 1h)
  pgfork up --name ci-$$ --setup db/migrations --parent-pid $$ --tcp
  pgfork up --pg 18 --setup-cmd 'migrate -path db -database "$DATABASE_URL" up' --json
  pgfork down ci-$$`,
		Args: usageArgs(cobra.NoArgs),
		RunE: func(cmd *cobra.Command, _ []string) error {
			ppid, err := parseParentPid(parentPid)
			if err != nil {
				return err
			}
			if err := checkDuration("--ttl", ttl, maxTTL, "--ttl 30m"); err != nil {
				return err
			}
			if !cmd.Flags().Changed("spares") {
				if n, ok, err := cl.sparesFromEnv(); err != nil {
					return err
				} else if ok {
					spares = n
				}
			}
			if err := checkIntRange("--spares (or "+envSpares+")", spares, 0, template.MaxSpares, "--spares 2, or 0 for none"); err != nil {
				return err
			}
			if err := cl.useVolume(cmd.Context(), volumeMode); err != nil {
				return err
			}
			lay := cl.layout()
			res, err := up.Up(cmd.Context(), up.Options{
				Layout: lay, FindPG: func() (pgbin.Installation, error) { return cl.findPGCached(lay) }, RunAs: cl.g.runAs,
				Setup: setup, SetupCmd: setupCmd, Name: name, TCP: tcp, TTL: ttl,
				ParentPid: ppid, Superuser: superuser, Spares: spares,
				Refill: spawnRefill, OnInfo: func(msg string) { cl.infof("%s", msg) },
			})
			if err != nil {
				return err
			}
			if !cl.g.json {
				cl.infof("cluster %s (PostgreSQL %s) ready in %s; remove it with `pgfork down %s`", res.Name, res.PGVersion,
					(time.Duration(res.Timings["total"]) * time.Microsecond).Round(time.Millisecond), res.Name)
			}
			if cl.g.json {
				return printJSON(cmd.OutOrStdout(), res)
			}
			fmt.Fprintln(cmd.OutOrStdout(), res.URL)
			return nil
		},
	}
	f := cmd.Flags()
	f.StringArrayVar(&setup, "setup", nil, "SQL file or directory of *.sql files to apply to the template (repeatable, applied in order)")
	f.StringVar(&setupCmd, "setup-cmd", "", "shell command run against the template (DATABASE_URL set), e.g. a migration tool")
	f.StringVar(&name, "name", "", "cluster name (default: generated, pg-XXXXXXXX)")
	f.BoolVar(&tcp, "tcp", false, "also listen on 127.0.0.1 on a free port (URL uses TCP, with a generated password)")
	f.DurationVar(&ttl, "ttl", 0, "remove the cluster this long after it starts (e.g. 30m; default: never)")
	f.StringVar(&parentPid, "parent-pid", "", `remove the cluster once process PID exits ("parent": pgfork's parent process)`)
	f.StringVar(&superuser, "superuser", "postgres", "database superuser name")
	cl.addVolumeFlag(f, &volumeMode)
	f.IntVar(&spares, "spares", defaultSpares, fmt.Sprintf("spare copies of the template to keep ready, 0 to %d (0: copy on every up; env PGFORK_SPARES)", template.MaxSpares))
	return cmd
}

func parseParentPid(s string) (int, error) {
	switch s {
	case "":
		return 0, nil
	case "parent":
		return os.Getppid(), nil
	}
	pid, err := strconv.Atoi(s)
	if err != nil || !proc.Valid(pid) {
		return 0, errs.New(errs.Usage, "bad --parent-pid %q: want a process id or \"parent\"", s).
			WithHint("e.g. --parent-pid $$ in a shell script")
	}
	if err := syscallKill0(pid); err != nil {
		return 0, errs.New(errs.NotFound, "--parent-pid %d: no such process", pid).
			WithHint("give the pid of a running process the cluster should not outlive")
	}
	return pid, nil
}

// reap runs the cluster reaper and reports what it removed.
func (cl *cli) reap(ctx context.Context, lay statedir.Layout) {
	up.Reap(ctx, lay, func(msg string) { cl.infof("%s", msg) })
}

func syscallKill0(pid int) error {
	if !proc.Alive(pid) {
		return syscall.ESRCH
	}
	return nil
}
