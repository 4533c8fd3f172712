package main

import (
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/pgfork/pgfork/branches"
	"github.com/pgfork/pgfork/clone"
	"github.com/pgfork/pgfork/cluster"
	"github.com/pgfork/pgfork/instance"
	"github.com/pgfork/pgfork/internal/errs"
	"github.com/pgfork/pgfork/internal/secret"
	"github.com/pgfork/pgfork/internal/shell"
	"github.com/pgfork/pgfork/internal/units"
	"github.com/pgfork/pgfork/pgbin"
	"github.com/pgfork/pgfork/pgclone"
	"github.com/pgfork/pgfork/pgdata"
)

// cloneOutput is what `pgfork clone --json` prints.
type cloneOutput struct {
	*pgclone.Result
	PGVersion    string `json:"pg_version"`
	BinDir       string `json:"bin_dir"`
	StartCommand string `json:"start_command"`
	StopCommand  string `json:"stop_command"`
}

func (cl *cli) newCloneCmd() *cobra.Command {
	var (
		online  bool
		connURL string
		port    string
		start   bool
		tcp     bool
		method  string
		jobs    int
		sync    string
		confDir string
		name    string
	)
	cmd := &cobra.Command{
		Use:   "clone SRC DST",
		Short: "Copy a PostgreSQL data directory into an independent cluster, offline or online",
		Long: `Copy the PostgreSQL data directory SRC to DST, a new directory that then runs
as a cluster of its own.

Offline (the default), SRC must be cleanly shut down (pg_controldata says "shut
down" or "shut down in recovery") and not running. With --online, SRC runs:
pgfork connects to it (--url, default: the socket directory and port in
SRC/postmaster.pid, as user postgres; as root without --url, through one
psql session run as SRC's owner, so that "local ... peer" authentication,
Debian's default, lets it in), calls pg_backup_start on one session,
copies the files, calls pg_backup_stop on the same session, writes
backup_label and tablespace_map, and puts the WAL from the backup's start to
its stop into DST/pg_wal; the clone recovers to a consistent state on its
first start. A temporary replication slot on that session keeps the WAL
meanwhile (without a free slot, raise wal_keep_size for long copies).

Files are shared by copy-on-write where the filesystem can (XFS with
reflink, btrfs), else copied with copy_file_range. pgfork leaves out what
belongs to the running source (postmaster.pid, backup_label, temporary files,
replication slots, statistics temp files, server logs...), turns off
archiving, recovery and replication settings in DST/postgresql.auto.conf,
copies tablespaces to DST.tblspc/<oid> and points DST's links there. SRC is
never written. DST is built in a hidden staging directory beside it and
renamed into place only when complete; leftovers of a killed clone are
removed by the next run.

When SRC has no postgresql.conf of its own (Debian and Ubuntu keep it in
/etc/postgresql/MAJOR/CLUSTER), pgfork finds the configuration: --config-dir
DIR; else, online, where the server says (SHOW config_file, hba_file,
ident_file); else, offline, the Debian layout (/var/lib/postgresql/M/C uses
/etc/postgresql/M/C). It copies postgresql.conf with the files it includes
from its directory (conf.d), pg_hba.conf and pg_ident.conf into DST, and
comments out (with a "# pgfork clone:" note) data_directory, config_file,
hba_file, ident_file, external_pid_file and stats_temp_directory, which would
point the clone at SRC's files: the clone then starts with "-D DST" alone.
If the configuration is not found, the summary says the clone has none.

The clone keeps SRC's port unless you give --port (N, or "auto" for a free
one): give one to run both at once (with a copied Debian configuration the
clone also keeps its unix_socket_directories, /var/run/postgresql, shared by
all clusters there and told apart by port). The clone shares SRC's system identifier:
to replication and backup tools it looks like the same cluster, so do not
attach it to SRC's replicas or backup repository.

The PostgreSQL binaries must be of SRC's major version: without --pg/--pg-bin
pgfork picks the installation matching SRC's PG_VERSION.

--start makes a branch of SRC instead, the same as pgfork branch create NAME
--source cluster:SRC --data-dir DST (it says so): DST is the branch's data
directory (its name is the branch's unless --name), SRC copied (online
while it runs, else offline) into a snapshot beside it (.DST.pgfork) and
DST a reflink copy of that, so on SRC's filesystem both share their blocks
with SRC wherever the state directory is (elsewhere a warning says, before
the copy, how much is copied); started on its own TCP port with a role and
password of its own; reset, snapshotted and removed (DST and the snapshot
with it) with pgfork branch. As root, DST's parent must belong to root or
the --run-as user and be writable by no one else. --method, --jobs and
--sync are not for it.`,
		Example: `  # a stopped cluster
  pgfork clone /var/lib/postgresql/15/main /srv/pg/branch --port 5433
  # a running one, under load
  pgfork clone --online /var/lib/postgresql/15/main /srv/pg/branch --port auto
  # a branch of it to reset and snapshot, its data directory /srv/pg/dev
  # (pgfork branch create dev --source cluster:... --data-dir /srv/pg/dev)
  pgfork clone /var/lib/postgresql/15/main /srv/pg/dev --start
  # Debian/Ubuntu, configuration in /etc/postgresql/15/main (found by itself when online)
  pgfork clone --config-dir /etc/postgresql/15/main /var/lib/postgresql/15/main \
      /srv/pg/branch --port 5433
  pgfork clone --online --url 'postgresql://backup:secret@localhost:5432/postgres' \
      SRC DST --json`,
		Args: usageArgs(cobra.ExactArgs(2)),
		RunE: func(cmd *cobra.Command, args []string) error {
			ctx := cmd.Context()
			src, dst := args[0], args[1]
			m, err := clone.ParseMethod(method)
			if err != nil {
				return err
			}
			sm, err := clone.ParseSyncMode(sync)
			if err != nil {
				return err
			}
			if err := checkJobs(jobs); err != nil {
				return err
			}
			if (name != "" || tcp) && !start {
				return errs.New(errs.Usage, "--name and --tcp are for --start").WithHint("add --start, or drop them")
			}
			if connURL != "" && !online {
				return errs.New(errs.Usage, "--url is for online clones").WithHint("add --online, or drop --url")
			}
			if start {
				if err := refuseWithStart(cmd, []string{"method", "jobs", "sync"}); err != nil {
					return err
				}
				abs, err := filepath.Abs(src)
				if err != nil {
					return errs.FromOS(err, src, "bad source path")
				}
				return cl.branchAlias(cmd, "clone --start", branches.Source{Kind: branches.SourceCluster, DataDir: abs,
					ConnString: connURL, ConfigDir: confDir}, dst, name, port)
			}
			p, err := cluster.ParsePort(port)
			if err != nil {
				return err
			}
			inst, err := cl.cloneInstallation(src)
			if err != nil {
				return err
			}
			user, err := instance.ResolveUser(cl.g.runAs)
			if err != nil {
				return err
			}
			prog, stopProg := cl.cloneProgress()
			res, err := pgclone.Clone(ctx, pgclone.Options{
				Src: src, Dst: dst, Installation: inst, Online: online, ConnString: connURL, ConfigDir: confDir,
				Method: m, Jobs: jobs, Sync: sm, Port: p, User: user, OnProgress: prog,
			})
			stopProg()
			if err != nil {
				return err
			}
			out := cloneOutput{Result: res, PGVersion: inst.Version, BinDir: inst.BinDir,
				StartCommand: cloneStartCommand(inst, user, res.Dst), StopCommand: cloneStopCommand(inst, user, res.Dst)}
			w := cmd.OutOrStdout()
			if cl.g.json {
				return printJSON(w, out)
			}
			printCloneSummary(w, out)
			return nil
		},
	}
	f := cmd.Flags()
	f.BoolVar(&online, "online", false, "clone a running source with the backup API (pg_backup_start/pg_backup_stop)")
	f.StringVar(&connURL, "url", "", "connection URL of the running source (default: from SRC/postmaster.pid, user postgres), without its password: it is read from PGPASSFILE, ~/.pgpass or PGPASSWORD")
	secret.MarkConn(f, "url")
	f.StringVar(&port, "port", "", `port of the clone: N, or "auto" for a free one (default: the source's; with --start, a free one)`)
	f.BoolVar(&start, "start", false, "make a branch of SRC instead (pgfork branch create) whose data directory is DST")
	f.BoolVar(&tcp, "tcp", false, "with --start: a branch listens on 127.0.0.1 always (kept for old scripts)")
	f.StringVar(&name, "name", "", "with --start: the branch's name (default: DST's base name)")
	f.StringVar(&method, "method", "auto", "copy method: auto, clone, copy-file-range, copy")
	f.IntVarP(&jobs, "jobs", "j", 0, "files copied in parallel (default: number of CPUs)")
	f.StringVar(&confDir, "config-dir", "", "where SRC's postgresql.conf, pg_hba.conf and pg_ident.conf live when not in SRC (e.g. /etc/postgresql/15/main)")
	f.StringVar(&sync, "sync", "fsync", "make the clone durable before it is renamed into place: fsync, syncfs or none")
	return cmd
}

// cloneInstallation picks the PostgreSQL build: --pg/--pg-bin when given
// (pgclone refuses one of another major than SRC), else the one matching
// SRC's PG_VERSION.
func (cl *cli) cloneInstallation(src string) (pgbin.Installation, error) {
	if cl.g.pgBin != "" || strings.TrimSpace(cl.g.pgMajor) != "" {
		return cl.findPG()
	}
	if err := pgdata.Check(src); err != nil {
		return pgbin.Installation{}, err
	}
	major, err := pgdata.Version(src)
	if err != nil {
		return pgbin.Installation{}, err
	}
	in, err := pgbin.Find(pgbin.Options{StateDir: cl.layout().Root}, major)
	if err != nil {
		return pgbin.Installation{}, pgbin.MissingMajor(err, major, "the source is a PostgreSQL %d data directory", major)
	}
	return in, nil
}

// cloneStartCommand is the command that starts the clone, working as
// printed: as root it runs pg_ctl as the clone's owner (runuser), and the
// server log goes inside the data directory (the clone's owner can write
// there; next to it, in a root-owned directory, it could not).
func cloneStartCommand(inst pgbin.Installation, user *instance.OSUser, dst string) string {
	c := fmt.Sprintf("%s -D %s -l %s start", shell.Quote(inst.Tool("pg_ctl")), shell.Quote(dst),
		shell.Quote(filepath.Join(dst, instance.LogFileName)))
	return shell.AsUser(user.NameOrEmpty(), inst.Env(), c)
}

// cloneStopCommand is the command that stops the clone, working as printed.
func cloneStopCommand(inst pgbin.Installation, user *instance.OSUser, dst string) string {
	return shell.AsUser(user.NameOrEmpty(), inst.Env(), fmt.Sprintf("%s -D %s stop", shell.Quote(inst.Tool("pg_ctl")), shell.Quote(dst)))
}

func printCloneSummary(w io.Writer, o cloneOutput) {
	r := o.Result
	mode := "offline"
	if r.Online {
		mode = "online"
	}
	fmt.Fprintf(w, "cloned %s to %s (%s, PostgreSQL %s) in %s\n", r.Src, r.Dst, mode, o.PGVersion, r.Elapsed.Round(time.Millisecond))
	var ms []string
	for m, n := range r.Methods {
		ms = append(ms, fmt.Sprintf("%s %d", m, n))
	}
	sort.Strings(ms)
	fmt.Fprintf(w, "  files:        %d, %s, %s shared with the source by copy-on-write\n", r.Files, units.Bytes(r.Bytes), units.Bytes(r.SharedBytes))
	fmt.Fprintf(w, "  method:       %s (files per method), sync %s\n", strings.Join(ms, ", "), r.Sync)
	if r.Online {
		fmt.Fprintf(w, "  backup:       WAL %s to %s, %d WAL files (%s); the clone recovers to that point on its first start\n",
			r.StartLSN, r.StopLSN, r.WALFiles, units.Bytes(r.WALBytes))
	}
	var ph []string
	for _, name := range []string{"backup start", "copy", "tablespaces", "backup stop", "wal", "finish"} {
		if d, ok := r.Phases[name]; ok {
			ph = append(ph, fmt.Sprintf("%s %s", name, d.Round(time.Millisecond)))
		}
	}
	fmt.Fprintf(w, "  time:         %s\n", strings.Join(ph, ", "))
	for _, ts := range r.Tablespaces {
		fmt.Fprintf(w, "  tablespace:   %s: %s copied to %s\n", ts.OID, ts.Source, ts.Target)
	}
	if r.BackupUser != "" {
		fmt.Fprintf(w, "  session:      psql as OS user %s (pgfork runs as root; peer authentication lets the cluster's owner in)\n", r.BackupUser)
	}
	switch {
	case r.Config != nil:
		fmt.Fprintf(w, "  config:       %s (found by %s) copied into the clone: %s\n", r.Config.ConfigFile, r.Config.FoundBy, strings.Join(r.Config.Files, ", "))
		if len(r.Config.CommentedOut) > 0 {
			var names []string
			for _, c := range r.Config.CommentedOut {
				names = append(names, c[strings.LastIndex(c, " ")+1:])
			}
			fmt.Fprintf(w, "                commented out (they named the source's files): %s\n", strings.Join(names, ", "))
		}
	case r.NoConfig:
		hba := ""
		if _, err := os.Stat(filepath.Join(r.Dst, "pg_hba.conf")); err != nil {
			hba = ", and no pg_hba.conf (it will not start until it has one)"
		}
		fmt.Fprintf(w, "  config:       NONE: the source keeps its postgresql.conf elsewhere and pgfork did not find it, so the clone has no postgresql.conf (it starts with PostgreSQL's defaults)%s; clone again with --config-dir DIR\n", hba)
	}
	if r.Port != 0 {
		fmt.Fprintf(w, "  port:         %d\n", r.Port)
	} else {
		fmt.Fprintf(w, "  port:         the source's (give --port N or --port auto to run both at once)\n")
	}
	fmt.Fprintf(w, "  system id:    %s, the same as the source's: do not attach the clone to the source's replicas or backups\n", r.SystemIdentifier)
	for _, wn := range r.Warnings {
		fmt.Fprintf(w, "  warning:      %s\n", wn)
	}
	fmt.Fprintf(w, "start it with: %s\n", o.StartCommand)
}

// cloneProgress returns a progress callback drawing one line on stderr when
// it is a terminal (and not --quiet/--json), and a func that ends the line.
func (cl *cli) cloneProgress() (func(pgclone.Progress), func()) {
	if cl.g.quiet || cl.g.json || !isTerminal(cl.stderr) {
		return nil, func() {}
	}
	drawn := false
	return func(p pgclone.Progress) {
			pct := 0.0
			if p.TotalBytes > 0 {
				pct = 100 * float64(p.Bytes) / float64(p.TotalBytes)
			}
			fmt.Fprintf(cl.stderr, "\r\033[Kcopying %s: %d/%d files, %s/%s (%.0f%%)", p.Phase, p.Files, p.TotalFiles,
				units.Bytes(p.Bytes), units.Bytes(p.TotalBytes), pct)
			drawn = true
		}, func() {
			if drawn {
				fmt.Fprintln(cl.stderr)
			}
		}
}
