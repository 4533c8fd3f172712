package main

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"syscall"
	"time"

	"github.com/spf13/cobra"

	"github.com/pgfork/pgfork/clone"
	"github.com/pgfork/pgfork/cluster"
	"github.com/pgfork/pgfork/instance"
	"github.com/pgfork/pgfork/internal/errs"
	"github.com/pgfork/pgfork/internal/proc"
	"github.com/pgfork/pgfork/internal/statedir"
	"github.com/pgfork/pgfork/template"
)

func init() { rootCmd.AddCommand(newUpCmd()) }

const reaperHelp = `Forgotten clusters: give a cluster --ttl DUR (it is removed once that long
has passed since it started) and/or --parent-pid PID (it is removed once that
process exits; "parent" means the process that ran pgfork). pgfork has no
daemon: every pgfork up, ls and down first runs a cheap reaper that stops and
removes expired and orphaned clusters, and removes dead ones (server crashed or
killed, machine rebooted, leftovers of an interrupted up).`

// upResult is what `pgfork up --json` prints.
type upResult struct {
	Name        string `json:"name"`
	URL         string `json:"url"`
	Host        string `json:"host,omitempty"`
	Port        int    `json:"port"`
	SocketDir   string `json:"socket_dir"`
	DataDir     string `json:"data_dir"`
	Pid         int    `json:"pid"`
	PGVersion   string `json:"pg_version"`
	TemplateKey string `json:"template_key"`
	Built       bool   `json:"template_built"`
	// FromSpare says the data directory was a spare copy made in the
	// background (no copy on this call); Spare is the spare's name.
	FromSpare bool             `json:"from_spare"`
	Spare     string           `json:"spare,omitempty"`
	Method    map[string]int64 `json:"copy_methods,omitempty"`
	Expires   *time.Time       `json:"expires,omitempty"`
	ParentPid int              `json:"parent_pid,omitempty"`
	Timings   map[string]int64 `json:"timings_us"`
}

func newUpCmd() *cobra.Command {
	var (
		setup     []string
		setupCmd  string
		name      string
		tcp       bool
		ttl       time.Duration
		parentPid string
		superuser string
		spares    int
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
tests run (up does not wait for it). When no spare is ready, up copies the
template itself. --spares 0 copies every time and keeps no spares. The
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
				if n, ok, err := sparesFromEnv(); err != nil {
					return err
				} else if ok {
					spares = n
				}
			}
			if err := checkIntRange("--spares (or "+envSpares+")", spares, 0, template.MaxSpares, "--spares 2, or 0 for none"); err != nil {
				return err
			}
			res, err := up(cmd.Context(), upOptions{
				setup: setup, setupCmd: setupCmd, name: name, tcp: tcp, ttl: ttl,
				parentPid: ppid, superuser: superuser, spares: spares,
			})
			if err != nil {
				return err
			}
			if g.json {
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

// upSettings are added to the test profile for clusters of pgfork up.
// shared_buffers 32MB (instead of 128MB) takes about 12% off the CPU time
// of a postmaster start (measured: 30 ms instead of 34 ms, minimum of 8)
// and reserves 96 MB less per throw-away cluster; test databases are small.
var upSettings = map[string]string{"shared_buffers": "32MB"}

type upOptions struct {
	setup     []string
	setupCmd  string
	name      string
	tcp       bool
	ttl       time.Duration
	parentPid int
	superuser string
	spares    int
}

// reap runs the cluster reaper and reports what it removed.
func reap(ctx context.Context, lay statedir.Layout) {
	done, err := cluster.Reap(ctx, lay)
	if err != nil {
		infof("pgfork: warning: %v", err)
	}
	template.CleanSpares(lay)
	instance.CleanSocketDirs(lay.Run())
	for _, r := range done {
		infof("removed cluster %s: %s", r.Name, r.Reason)
	}
}

func up(ctx context.Context, o upOptions) (*upResult, error) {
	t0 := time.Now()
	timings := map[string]int64{}
	lap := func(k string, since time.Time) { timings[k] = time.Since(since).Microseconds() }
	lay := layout()
	reap(ctx, lay)

	// Claim the name first: a taken name fails before any work.
	var (
		pending *cluster.Pending
		err     error
	)
	if o.name != "" {
		pending, err = cluster.Create(ctx, lay, o.name)
	} else {
		for i := 0; i < 5; i++ {
			pending, err = cluster.Create(ctx, lay, cluster.NewName())
			if errs.KindOf(err) != errs.Exists {
				break
			}
		}
	}
	if err != nil {
		return nil, err
	}
	socketDir := ""
	ok := false
	defer func() {
		if !ok {
			pending.Abort(socketDir)
		}
	}()

	t := time.Now()
	pg, err := findPGCached(lay)
	if err != nil {
		return nil, err
	}
	user, err := instance.ResolveUser(g.runAs)
	if err != nil {
		return nil, err
	}
	lap("find_pg", t)

	t = time.Now()
	tmpl, err := template.Get(ctx, lay, template.Options{
		PG: pg, Init: instance.InitOptions{Superuser: o.superuser}, User: user,
		Setup: o.setup, SetupCmd: o.setupCmd,
		OnProgress: func(s string) { infof("%s", s) },
	})
	if err != nil {
		return nil, err
	}
	lap("template", t)

	// A spare copy, if one is ready: one rename instead of a copy.
	var owner *clone.Owner
	if user != nil {
		owner = user.Owner()
	}
	spare := ""
	if o.spares > 0 {
		t = time.Now()
		spare, err = tmpl.ClaimSpare(lay, pending.DataDir())
		if err != nil {
			infof("pgfork: warning: %v; copying the template instead", err)
		}
		lap("claim_spare", t)
	}
	sum := &clone.Summary{}
	if spare == "" {
		t = time.Now()
		// A refill in progress pauses while we copy (a miss is never
		// slower than --spares 0).
		release := tmpl.Foreground(ctx, lay)
		sum, err = clone.Copy(ctx, tmpl.DataDir(), pending.DataDir(), clone.Options{Sync: clone.SyncNone, Owner: owner})
		release()
		if err != nil {
			tmpl.Release()
			return nil, err
		}
		lap("copy", t)
	}
	tmpl.Release()

	if o.tcp {
		// TCP is open to every local user: password only (scram);
		// trust stays on the private socket.
		if err := instance.WritePasswordHBA(pending.DataDir(), user); err != nil {
			return nil, err
		}
	}

	t = time.Now()
	socketDir, err = cluster.SocketDirFor(lay, pending.Name)
	if err != nil {
		return nil, errs.Wrap(errs.OSKind(err), err, "cannot create a socket directory")
	}
	inst, err := instance.Start(ctx, instance.Config{
		BinDir: pg.BinDir, Env: pg.Env(), DataDir: pending.DataDir(), User: user,
		SocketDir: socketDir, TCP: o.tcp, Profile: instance.Test, Settings: upSettings,
	})
	if err != nil {
		return nil, err
	}
	if o.tcp {
		if err := inst.SetPassword(ctx, o.superuser, instance.NewPassword()); err != nil {
			return nil, err
		}
	}
	lap("start", t)

	url := inst.ConnString(o.superuser, "postgres")
	info := cluster.Info{
		URL: url, Host: inst.Host, Port: inst.Port, SocketDir: inst.SocketDir, DataDir: pending.DataDir(),
		Pid: inst.Pid, PGVersion: pg.Version, PGMajor: pg.Major, BinDir: pg.BinDir, Template: tmpl.Key,
		Created: t0, TTL: o.ttl, ParentPid: o.parentPid,
	}
	if user != nil {
		info.RunAs = user.Name
	}
	if err := pending.Commit(info); err != nil {
		return nil, err
	}
	ok = true
	if o.spares > 0 {
		// Replace the spare (or make the first one) in the background.
		t = time.Now()
		if err := spawnRefill(lay, tmpl.Key, o.spares, user); err != nil {
			infof("pgfork: warning: cannot start the spare refill: %v", err)
		}
		lap("spawn_refill", t)
	}
	lap("total", t0)
	res := &upResult{
		Name: pending.Name, URL: url, Host: inst.Host, Port: inst.Port, SocketDir: inst.SocketDir,
		DataDir: pending.DataDir(), Pid: inst.Pid, PGVersion: pg.Version, TemplateKey: tmpl.Key,
		Built: tmpl.Built, FromSpare: spare != "", Spare: spare, ParentPid: o.parentPid, Timings: timings, Method: map[string]int64{},
	}
	for m, n := range sum.Methods {
		res.Method[string(m)] = n
	}
	if o.ttl > 0 {
		e := info.Expires()
		res.Expires = &e
	}
	if !g.json {
		infof("cluster %s (PostgreSQL %s) ready in %s; remove it with `pgfork down %s`", res.Name, pg.Version,
			time.Since(t0).Round(time.Millisecond), res.Name)
	}
	return res, nil
}

func syscallKill0(pid int) error {
	if !proc.Alive(pid) {
		return syscall.ESRCH
	}
	return nil
}
