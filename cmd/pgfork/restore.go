package main

import (
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/pgfork/pgfork/branches"
	"github.com/pgfork/pgfork/clone"
	"github.com/pgfork/pgfork/instance"
	"github.com/pgfork/pgfork/internal/errs"
	"github.com/pgfork/pgfork/internal/units"
	"github.com/pgfork/pgfork/pgbackup"
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

--start makes a branch of the backups instead, the same as pgfork branch
create NAME --source backup:CHAIN (it says so), with DST as its data
directory (its name is the branch's unless --name): restored into a
snapshot beside DST (.DST.pgfork), DST a reflink copy of it, recovered,
started on its own TCP port with a role and password of its own. It is
listed by pgfork branch ls and pgfork ls; pgfork branch reset puts it back
to the restored point, pgfork branch snapshot keeps a point of it, pgfork
branch rm removes it, DST and the snapshot beside it. A branch never
archives WAL (archive_mode=off), so it cannot write into its source's
archive. DST should be on the backups' filesystem: elsewhere they are
copied, not cloned (a warning says so first, with the size). As root,
DST's parent must belong to root or the --run-as user and be writable by
no one else.
Tablespaces outside the data directory are restored as pg_combinebackup does:
each needs -T OLDDIR=NEWDIR, OLDDIR being where the newest backup's
pg_tblspc link points; the result links to NEWDIR (not with --start).
With --start --wal DIR (a WAL archive) it replays the archive's WAL, up to
--target-time, --target-lsn or --target-name if given, and then promotes.`,
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
	f.BoolVar(&fl.start, "start", false, "make a branch of the backups (pgfork branch create) whose data directory is DST")
	f.StringVar(&fl.port, "port", "", `with --start: the branch's TCP port N (default, or "auto": a free one)`)
	f.BoolVar(&fl.tcp, "tcp", false, "with --start: a branch listens on 127.0.0.1 always (kept for old scripts)")
	f.StringVar(&fl.name, "name", "", "with --start: name of the branch (default: DST's name)")
	f.StringVar(&fl.wal, "wal", "", "with --start: WAL archive directory to replay from (point-in-time recovery)")
	f.StringVar(&fl.targetTime, "target-time", "", "with --start --wal: recover up to this time (recovery_target_time)")
	f.StringVar(&fl.targetLSN, "target-lsn", "", "with --start --wal: recover up to this LSN (recovery_target_lsn)")
	f.StringVar(&fl.targetName, "target-name", "", "with --start --wal: recover up to this restore point (pg_create_restore_point)")
	f.StringVar(&fl.targetAction, "target-action", "promote", "with --start and a target: promote, the only action for a branch (kept for old scripts)")
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
	if fl.start {
		return cl.restoreAsBranch(cmd, args, fl)
	}
	for _, f := range []string{"port", "tcp", "name"} {
		if cmd.Flags().Changed(f) {
			return errs.New(errs.Usage, "--%s is for starting the result", f).WithCLI("add --start, or drop --%s", f)
		}
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
		DryRun: fl.dryRun, Layout: cl.layout(), User: user, PGBin: cl.g.pgBin,
		Recovery: restore.Recovery{WALDir: fl.wal, TargetTime: fl.targetTime, TargetLSN: fl.targetLSN, TargetName: fl.targetName},
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
	printRestoreSummary(w, res.Summary)
	return nil
}

// restoreFlagsNotForBranches are the flags of a restore into a directory
// that --start, which makes a branch, does not take.
var restoreFlagsNotForBranches = []string{"jobs", "prefetch", "sync", "manifest-checksums", "no-manifest",
	"no-manifest-checksums", "tablespace-mapping", "link", "dry-run", "no-merge", "whole-copy", "no-clone"}

// restoreAsBranch is restore --start, the older spelling of pgfork branch
// create from a backup source: the backups (a chain directory up to
// --upto, or the backups themselves) restored, recovered to the target,
// and started as a branch named after DST (or --name).
func (cl *cli) restoreAsBranch(cmd *cobra.Command, args []string, fl restoreFlags) error {
	if err := refuseWithStart(cmd, restoreFlagsNotForBranches); err != nil {
		return err
	}
	if fl.targetAction != "promote" {
		return errs.New(errs.Usage, "a branch is promoted at its recovery target: --target-action %s is not for it", fl.targetAction).
			WithCLI("restore into DST without --start, then recover it yourself with recovery_target_action = %s", fl.targetAction)
	}
	backups, dst := args[:len(args)-1], args[len(args)-1]
	src := branches.Source{Kind: branches.SourceBackup, Upto: fl.upto,
		WALDir: fl.wal, TargetTime: fl.targetTime, TargetLSN: fl.targetLSN, TargetName: fl.targetName}
	if len(backups) == 1 && !pgbackup.IsBackupDir(backups[0]) {
		src.Chain = backups[0]
	} else if fl.upto != "" {
		return errs.New(errs.Usage, "restoring up to a named backup needs a chain directory").
			WithCLI("give one directory made by `pgfork backup`, or drop --upto")
	} else {
		src.Backups = backups
	}
	return cl.branchAlias(cmd, "restore --start", src, dst, fl.name, fl.port)
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
