package main

import (
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/pgfork/pgfork/clone"
	"github.com/pgfork/pgfork/cluster"
	"github.com/pgfork/pgfork/instance"
	"github.com/pgfork/pgfork/internal/errs"
	"github.com/pgfork/pgfork/internal/shell"
	"github.com/pgfork/pgfork/internal/units"
	"github.com/pgfork/pgfork/restore"
)

type restoreFlags struct {
	start, tcp                                           bool
	port, name, upto                                     string
	wal, targetTime, targetLSN, targetName, targetAction string
	jobs                                                 int
	prefetch, noChecksums, dryRun, noManifest, link      bool
	checksums                                            string
	tablespaces                                          []string
	syncMode                                             string
	noMerge, wholeCopy, noClone                          bool
}

func (cl *cli) newRestoreCmd() *cobra.Command {
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
It gets a backup_manifest (CRC32C checksums, or --manifest-checksums) that
pg_verifybackup accepts and is built in a staging directory beside DST,
renamed into place when complete. The backups are only read. --dry-run checks
the chain and prints what would be done, writing nothing.

With one directory that is not itself a backup but holds backups (as
pgfork backup makes), the chain ending with the newest backup there is
restored, or the one ending with --upto NAME.

--start recovers and starts the result as a branch (as the postgres OS user
when pgfork runs as root) on a private socket directory, and records it:
pgfork ls lists it, pgfork down NAME stops it and forgets it (the restored
directory is kept; pgfork down NAME --delete-data removes it). A branch never
archives WAL (archive_mode=off), so it cannot write into its source's archive.
Tablespaces outside the data directory are restored as pg_combinebackup does:
each needs -T OLDDIR=NEWDIR, OLDDIR being where the newest backup's
pg_tblspc link points; the result links to NEWDIR.
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
		RunE: func(cmd *cobra.Command, args []string) error { return cl.runRestore(cmd, args, fl) },
	}
	f := cmd.Flags()
	f.IntVarP(&fl.jobs, "jobs", "j", 0, "files worked on in parallel (default: one per core)")
	f.BoolVar(&fl.prefetch, "prefetch", false, "ask the kernel to read source ranges ahead (posix_fadvise WILLNEED); helps where the filesystem does no readahead (ZFS)")
	f.StringVar(&fl.syncMode, "sync", "fsync", "durability before DST appears: none, fsync (each file and dir), syncfs (whole filesystem once)")
	f.StringVar(&fl.checksums, "manifest-checksums", "CRC32C", "checksum algorithm of backup_manifest: "+strings.Join(restore.ChecksumAlgorithms, ", "))
	f.BoolVar(&fl.noManifest, "no-manifest", false, "write no backup_manifest")
	f.StringArrayVarP(&fl.tablespaces, "tablespace-mapping", "T", nil, "OLDDIR=NEWDIR: restore the tablespace the newest backup has in OLDDIR (its pg_tblspc link) to NEWDIR (repeat for each; required for every tablespace outside the data directory)")
	f.BoolVar(&fl.link, "link", false, "hard-link the files that are whole in a backup instead of cloning them (as pg_combinebackup --link): changing the result then changes the backups; not with --start")
	f.BoolVar(&fl.noChecksums, "no-manifest-checksums", false, "same as --manifest-checksums NONE")
	f.BoolVar(&fl.noMerge, "no-merge", false, "measurement: one copy call per block instead of per run")
	f.BoolVar(&fl.wholeCopy, "whole-copy", false, "measurement: copy whole files with read/write instead of cloning them")
	f.BoolVar(&fl.noClone, "no-clone", false, "measurement: never reflink")
	f.BoolVar(&fl.dryRun, "dry-run", false, "check the chain and print what would be done (files cloned whole or rebuilt, blocks by backup, space needed); write nothing")
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
	for _, h := range []string{"no-merge", "whole-copy", "no-clone", "no-manifest-checksums"} {
		_ = f.MarkHidden(h)
	}
	return cmd
}

func (cl *cli) runRestore(cmd *cobra.Command, args []string, fl restoreFlags) error {
	sm, err := clone.ParseSyncMode(fl.syncMode)
	if err != nil {
		return err
	}
	if fl.noChecksums {
		if cmd.Flags().Changed("manifest-checksums") && !strings.EqualFold(fl.checksums, "NONE") {
			return errs.New(errs.Usage, "--no-manifest-checksums and --manifest-checksums %s contradict each other", fl.checksums).
				WithHint("give one of them")
		}
		fl.checksums = "NONE"
	}
	var mapping map[string]string
	for _, m := range fl.tablespaces {
		old, new, err := restore.ParseTablespaceMapping(m)
		if err != nil {
			return err
		}
		if mapping == nil {
			mapping = map[string]string{}
		}
		if _, dup := mapping[old]; dup {
			return errs.New(errs.Usage, "--tablespace-mapping names %s twice", old).WithHint("give one mapping per tablespace")
		}
		mapping[old] = new
	}
	port, err := cluster.ParsePort(fl.port)
	if err != nil {
		return err
	}
	user, err := instance.ResolveUser(cl.g.runAs)
	if err != nil {
		return err
	}
	bar := cl.newByteProgress("restoring")
	defer bar.Done()
	res, err := restore.Run(cmd.Context(), restore.RunOptions{
		Backups: args[:len(args)-1], Upto: fl.upto, Dst: args[len(args)-1],
		Restore: restore.Options{Jobs: fl.jobs, Prefetch: fl.prefetch, Sync: sm, Checksums: fl.checksums, NoManifest: fl.noManifest, Link: fl.link, Tablespaces: mapping,
			NoMerge: fl.noMerge, WholeCopy: fl.wholeCopy, NoClone: fl.noClone,
			OnProgress: func(p clone.Progress) { bar.Update(p.Bytes, p.TotalBytes) }},
		Start: fl.start, DryRun: fl.dryRun, Layout: cl.layout(), User: user, PGBin: cl.g.pgBin,
		Name: fl.name, Port: port, TCP: fl.tcp,
		Recovery: restore.Recovery{WALDir: fl.wal, TargetTime: fl.targetTime, TargetLSN: fl.targetLSN, TargetName: fl.targetName, TargetAction: fl.targetAction},
		OnStarting: func(sum *restore.Summary) {
			bar.Done()
			if !cl.g.json {
				printRestoreSummary(cmd.OutOrStdout(), sum)
			}
			cl.infof("starting the branch (recovery may take a moment)...")
		},
	})
	bar.Done()
	if err != nil {
		return err
	}
	if fl.link && res.DryRun == nil {
		// pg_combinebackup's warning, in the same case.
		fmt.Fprintln(cmd.ErrOrStderr(), "warning: --link was used: the result's files copied whole are hard links to the backups' own; any change to them (starting the result included) changes the backups")
	}
	w := cmd.OutOrStdout()
	if cl.g.json {
		return printJSON(w, res)
	}
	if res.DryRun != nil {
		printDryRun(w, res.DryRun)
		return nil
	}
	if res.Branch == nil {
		printRestoreSummary(w, res.Summary)
		return nil
	}
	b := res.Branch
	fmt.Fprintf(w, "branch %s started (pid %d): %s\n", b.Name, b.Pid, b.URL)
	// As root: connect as the cluster's OS user (peer authentication works too).
	psql := shell.AsUser(user.NameOrEmpty(), nil, shell.Quote(res.Installation.Tool("psql"))+" "+shell.Quote(b.URL))
	fmt.Fprintf(w, "  connect   %s\n", psql)
	fmt.Fprintf(w, "  stop      pgfork down %s   (the data directory %s is kept; --delete-data removes it)\n", b.Name, b.DataDir)
	fmt.Fprintf(w, "  log       %s\n", b.LogFile)
	return nil
}

func printDryRun(w io.Writer, d *restore.DryRun) {
	s := &d.Summary
	fmt.Fprintf(w, "would restore %d backup(s) of PostgreSQL %d -> %s (dry run: nothing written)\n", len(s.Backups), s.Major, s.Dst)
	printRestoreCounts(w, s)
	where := "written to the destination"
	if d.SharesBlocks {
		where = "shared with the backups (same filesystem, it clones)"
	}
	fmt.Fprintf(w, "  bytes     %s, %s\n", units.Bytes(s.Bytes), where)
	fmt.Fprintf(w, "  space     about %s needed, %s free\n", units.Bytes(d.NeedBytes), units.Bytes(d.FreeBytes))
	if d.FreeBytes < d.NeedBytes {
		fmt.Fprintf(w, "  warning   not enough free space: restore onto a filesystem with reflinks, on the backups' own, or free %s\n",
			units.Bytes(d.NeedBytes-d.FreeBytes))
	}
	fmt.Fprintf(w, "  (--json lists every file: copied whole from which backup, or rebuilt from how many blocks of each)\n")
}

func printRestoreSummary(w io.Writer, s *restore.Summary) {
	fmt.Fprintf(w, "restored %d backup(s) of PostgreSQL %d -> %s\n", len(s.Backups), s.Major, s.Dst)
	printRestoreCounts(w, s)
	fmt.Fprintf(w, "  bytes     %s: %s shared with the backups (reflink), %s by copy_file_range, %s written",
		units.Bytes(s.Bytes), units.Bytes(s.SharedBytes), units.Bytes(s.RangeBytes), units.Bytes(s.CopiedBytes))
	if s.LinkedBytes > 0 {
		fmt.Fprintf(w, ", %s hard-linked", units.Bytes(s.LinkedBytes))
	}
	fmt.Fprintln(w)
	ph := make([]string, 0, len(s.Phases))
	for _, p := range s.Phases {
		ph = append(ph, fmt.Sprintf("%s %s", p.Name, p.Elapsed.Round(time.Millisecond)))
	}
	fmt.Fprintf(w, "  time      %s (%s)\n", s.Elapsed.Round(time.Millisecond), strings.Join(ph, ", "))
	fmt.Fprintf(w, "  manifest  backup_manifest with %s checksums; sync %s\n", s.Checksums, s.Sync)
}

// printRestoreCounts prints the files and blocks lines of a restore's
// summary, done or planned.
func printRestoreCounts(w io.Writer, s *restore.Summary) {
	for _, t := range s.Tablespaces {
		fmt.Fprintf(w, "  tablespace %s: %s -> %s\n", t.OID, t.From, t.Dir)
	}
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
}
