package main

import (
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/pgfork/pgfork/clone"
	"github.com/pgfork/pgfork/instance"
	"github.com/pgfork/pgfork/internal/errs"
	"github.com/pgfork/pgfork/internal/units"
	"github.com/pgfork/pgfork/pgbackup"
	"github.com/pgfork/pgfork/pgbin"
	"github.com/pgfork/pgfork/pgdata"
	"github.com/pgfork/pgfork/restore"
)

func init() { rootCmd.AddCommand(newRestoreCmd()) }

type restoreFlags struct {
	start, tcp                                           bool
	port, name, upto                                     string
	wal, targetTime, targetLSN, targetName, targetAction string
	jobs                                                 int
	prefetch, noChecksums                                bool
	syncMode                                             string
	noMerge, wholeCopy, noClone                          bool
}

func newRestoreCmd() *cobra.Command {
	var fl restoreFlags
	cmd := &cobra.Command{
		Use:   "restore BACKUP... DST | restore CHAINDIR DST",
		Short: "Rebuild a data directory from a chain of base backups (full + incrementals)",
		Long: `Rebuild the data directory that a chain of plain-format pg_basebackup backups
describes: the full backup first, then the incremental backups (PostgreSQL 17+,
pg_basebackup --incremental) oldest first, as pg_combinebackup takes them. A
single full backup works too.

The chain is checked before anything is written: one cluster (system
identifier), one major version, each incremental taken from the backup before
it. Tar-format backups and backups without a backup_manifest are refused.

Files that are whole in the newest backup holding them are cloned (reflink on
XFS/btrfs, else copy_file_range); INCREMENTAL.* files are rebuilt with
pg_combinebackup's rules, moving each run of consecutive blocks from one
source file with one call, so the result shares its blocks with the backups.
It gets a backup_manifest (CRC32C checksums) that pg_verifybackup accepts and
is built in a staging directory beside DST, renamed into place when complete.
The backups are only read.

With one directory that is not itself a backup but holds backups (as
pgfork backup makes), the chain ending with the newest backup there is
restored, or the one ending with --upto NAME.

--start recovers and starts the result as a branch (as the postgres OS user
when pgfork runs as root) on a private socket directory, and records it:
pgfork ls lists it, pgfork down NAME stops it and forgets it (the restored
directory is kept; pgfork down NAME --delete-data removes it). A branch never
archives WAL (archive_mode=off), so it cannot write into its source's archive.
With --wal DIR (a WAL archive) and --target-time,
--target-lsn or --target-name it recovers to that point (recovery settings
in postgresql.auto.conf, recovery.signal) and then promotes.`,
		Example: `  pgfork restore /backups/full /backups/incr1 /backups/incr2 /srv/pg/restored
  pgfork restore /backups/full /srv/pg/restored --sync none --json
  pgfork restore /backups/chain /srv/pg/yesterday --upto 20261122T020000Z-incr \
      --start --port auto
  pgfork restore /backups/chain /srv/pg/before-bug --start \
      --wal /backups/wal --target-name before_migration`,
		Args: usageArgs(cobra.MinimumNArgs(2)),
		RunE: func(cmd *cobra.Command, args []string) error { return runRestore(cmd, args, fl) },
	}
	f := cmd.Flags()
	f.IntVarP(&fl.jobs, "jobs", "j", 0, "files worked on in parallel (default: one per core)")
	f.BoolVar(&fl.prefetch, "prefetch", false, "ask the kernel to read source ranges ahead (posix_fadvise WILLNEED); helps where the filesystem does no readahead (ZFS)")
	f.StringVar(&fl.syncMode, "sync", "fsync", "durability before DST appears: none, fsync (each file and dir), syncfs (whole filesystem once)")
	f.BoolVar(&fl.noChecksums, "no-manifest-checksums", false, "write backup_manifest with sizes only (no CRC32C of every file)")
	f.BoolVar(&fl.noMerge, "no-merge", false, "measurement: one copy call per block instead of per run")
	f.BoolVar(&fl.wholeCopy, "whole-copy", false, "measurement: copy whole files with read/write instead of cloning them")
	f.BoolVar(&fl.noClone, "no-clone", false, "measurement: never reflink")
	f.StringVar(&fl.upto, "upto", "", "with a chain directory (made by pgfork backup): restore up to this backup (default: the newest)")
	f.BoolVar(&fl.start, "start", false, "start the result as a branch (recovery first), listed by pgfork ls, stopped by pgfork down")
	f.StringVar(&fl.port, "port", "", `with --start: port N, or "auto" for a free one (default 5432 on a private socket)`)
	f.BoolVar(&fl.tcp, "tcp", false, "with --start: listen on 127.0.0.1 as well as the private socket")
	f.StringVar(&fl.name, "name", "", "with --start: name of the branch in pgfork ls (default: DST's name)")
	f.StringVar(&fl.wal, "wal", "", "with --start: WAL archive directory to replay from (point-in-time recovery)")
	f.StringVar(&fl.targetTime, "target-time", "", "with --start --wal: recover up to this time (recovery_target_time)")
	f.StringVar(&fl.targetLSN, "target-lsn", "", "with --start --wal: recover up to this LSN (recovery_target_lsn)")
	f.StringVar(&fl.targetName, "target-name", "", "with --start --wal: recover up to this restore point (pg_create_restore_point)")
	f.StringVar(&fl.targetAction, "target-action", "promote", "with a target: promote, pause or shutdown once it is reached")
	for _, h := range []string{"no-merge", "whole-copy", "no-clone"} {
		_ = f.MarkHidden(h)
	}
	return cmd
}

// restoreOutput is what `pgfork restore --json` prints.
type restoreOutput struct {
	*restore.Summary
	Branch *restore.Started `json:"branch,omitempty"`
}

func runRestore(cmd *cobra.Command, args []string, fl restoreFlags) error {
	ctx := cmd.Context()
	sm, err := clone.ParseSyncMode(fl.syncMode)
	if err != nil {
		return err
	}
	dirs, dst := args[:len(args)-1], args[len(args)-1]
	if len(dirs) == 1 && !pgbackup.IsBackupDir(dirs[0]) {
		if dirs, err = pgbackup.Discover(dirs[0], fl.upto); err != nil {
			return err
		}
	} else if fl.upto != "" {
		return errs.New(errs.Usage, "--upto is for a chain directory").WithHint("give one directory made by `pgfork backup`, or drop --upto")
	}
	rec := restore.Recovery{WALDir: fl.wal, TargetTime: fl.targetTime, TargetLSN: fl.targetLSN, TargetName: fl.targetName, TargetAction: fl.targetAction}
	if !fl.start && (rec.WALDir != "" || rec.Targeted() || fl.port != "" || fl.tcp || fl.name != "") {
		return errs.New(errs.Usage, "--port, --tcp, --name, --wal and --target-* are for starting the result").WithHint("add --start")
	}
	user, err := instance.ResolveUser(g.runAs)
	if err != nil {
		return err
	}
	var owner *clone.Owner
	if user != nil {
		owner = &clone.Owner{UID: user.UID, GID: user.GID}
	}
	var inst pgbin.Installation
	var port int
	if fl.start {
		if err := rec.Validate(); err != nil {
			return err
		}
		if err := restore.CheckBranchName(layout(), dst, fl.name); err != nil {
			return err
		}
		if port, err = parseClonePort(fl.port); err != nil {
			return err
		}
		major, err := pgdata.Version(dirs[len(dirs)-1])
		if err != nil {
			return err
		}
		if inst, err = pgbin.Find(pgbin.Options{Explicit: g.pgBin, StateDir: layout().Root}, major); err != nil {
			return errs.Wrap(errs.KindOf(err), err, "the backups are of PostgreSQL %d", major).
				WithHint("install PostgreSQL %d (`pgfork pg install %d`) or point --pg-bin at its bin directory", major, major)
		}
	}
	bar := newByteProgress("restoring")
	defer bar.Done()
	sum, err := restore.Restore(ctx, dirs, dst, restore.Options{
		Jobs: fl.jobs, Prefetch: fl.prefetch, Sync: sm, NoChecksums: fl.noChecksums, Owner: owner,
		NoMerge: fl.noMerge, WholeCopy: fl.wholeCopy, NoClone: fl.noClone,
		OnProgress: func(p clone.Progress) { bar.Update(p.Bytes, p.TotalBytes) },
	})
	bar.Done()
	if err != nil {
		return err
	}
	out := restoreOutput{Summary: sum}
	if fl.start {
		if !g.json {
			printRestoreSummary(cmd.OutOrStdout(), sum)
		}
		infof("starting the branch (recovery may take a moment)...")
		st, err := restore.Start(ctx, sum.Dst, restore.StartOptions{Layout: layout(), Installation: inst, User: user, Name: fl.name,
			Port: port, TCP: fl.tcp, Recovery: rec, Source: strings.Join(dirs, " ")})
		if err != nil {
			return err
		}
		out.Branch = st
	}
	w := cmd.OutOrStdout()
	if g.json {
		return printJSON(w, out)
	}
	if out.Branch == nil {
		printRestoreSummary(w, sum)
		return nil
	}
	b := out.Branch
	fmt.Fprintf(w, "branch %s started (pid %d): %s\n", b.Name, b.Pid, b.URL)
	psql := cloneShellQuote(inst.Tool("psql")) + " " + cloneShellQuote(b.URL)
	if user != nil { // as root: connect as the cluster's OS user (peer authentication works too)
		psql = "runuser -u " + cloneShellQuote(user.Name) + " -- " + psql
	}
	fmt.Fprintf(w, "  connect   %s\n", psql)
	fmt.Fprintf(w, "  stop      pgfork down %s   (the data directory %s is kept; --delete-data removes it)\n", b.Name, b.DataDir)
	fmt.Fprintf(w, "  log       %s\n", b.LogFile)
	return nil
}

func printRestoreSummary(w io.Writer, s *restore.Summary) {
	fmt.Fprintf(w, "restored %d backup(s) of PostgreSQL %d -> %s\n", len(s.Backups), s.Major, s.Dst)
	fmt.Fprintf(w, "  files     %d: %d whole (%d unchanged since an older backup), %d rebuilt; %d directories\n",
		s.Files, s.FilesWhole, s.FilesOlder, s.FilesRebuilt, s.Dirs)
	if s.FilesRebuilt > 0 {
		var parts []string
		for i, n := range s.BlocksBySource {
			parts = append(parts, fmt.Sprintf("#%d %d", i+1, n))
		}
		if s.ZeroBlocks > 0 {
			parts = append(parts, fmt.Sprintf("zero %d", s.ZeroBlocks))
		}
		fmt.Fprintf(w, "  blocks    of rebuilt files by backup: %s (%d copy calls)\n", strings.Join(parts, ", "), s.Calls)
	}
	fmt.Fprintf(w, "  bytes     %s: %s shared with the backups (reflink), %s by copy_file_range, %s written\n",
		units.Bytes(s.Bytes), units.Bytes(s.SharedBytes), units.Bytes(s.RangeBytes), units.Bytes(s.CopiedBytes))
	ph := make([]string, 0, len(s.Phases))
	for _, p := range s.Phases {
		ph = append(ph, fmt.Sprintf("%s %s", p.Name, p.Elapsed.Round(time.Millisecond)))
	}
	fmt.Fprintf(w, "  time      %s (%s)\n", s.Elapsed.Round(time.Millisecond), strings.Join(ph, ", "))
	fmt.Fprintf(w, "  manifest  backup_manifest with %s checksums; sync %s\n", s.Checksums, s.Sync)
}
