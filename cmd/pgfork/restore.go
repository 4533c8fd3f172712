package main

import (
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/pgfork/pgfork/clone"
	"github.com/pgfork/pgfork/internal/units"
	"github.com/pgfork/pgfork/restore"
)

func init() { rootCmd.AddCommand(newRestoreCmd()) }

type restoreFlags struct {
	jobs                        int
	prefetch, noChecksums       bool
	syncMode                    string
	noMerge, wholeCopy, noClone bool
}

func newRestoreCmd() *cobra.Command {
	var fl restoreFlags
	cmd := &cobra.Command{
		Use:   "restore BACKUP... DST",
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
The backups are only read.`,
		Example: `  pgfork restore /backups/full /backups/incr1 /backups/incr2 /srv/pg/restored
  pgfork restore /backups/full /srv/pg/restored --sync none --json`,
		Args: usageArgs(cobra.MinimumNArgs(2)),
		RunE: func(cmd *cobra.Command, args []string) error {
			sm, err := clone.ParseSyncMode(fl.syncMode)
			if err != nil {
				return err
			}
			dirs, dst := args[:len(args)-1], args[len(args)-1]
			bar := newByteProgress("restoring")
			defer bar.Done()
			sum, err := restore.Restore(cmd.Context(), dirs, dst, restore.Options{
				Jobs: fl.jobs, Prefetch: fl.prefetch, Sync: sm, NoChecksums: fl.noChecksums,
				NoMerge: fl.noMerge, WholeCopy: fl.wholeCopy, NoClone: fl.noClone,
				OnProgress: func(p clone.Progress) { bar.Update(p.Bytes, p.TotalBytes) },
			})
			bar.Done()
			if err != nil {
				return err
			}
			if g.json {
				return printJSON(cmd.OutOrStdout(), sum)
			}
			printRestoreSummary(cmd.OutOrStdout(), sum)
			return nil
		},
	}
	f := cmd.Flags()
	f.IntVarP(&fl.jobs, "jobs", "j", 0, "files worked on in parallel (default: one per core)")
	f.BoolVar(&fl.prefetch, "prefetch", false, "ask the kernel to read source ranges ahead (posix_fadvise WILLNEED); helps where the filesystem does no readahead (ZFS)")
	f.StringVar(&fl.syncMode, "sync", "fsync", "durability before DST appears: none, fsync (each file and dir), syncfs (whole filesystem once)")
	f.BoolVar(&fl.noChecksums, "no-manifest-checksums", false, "write backup_manifest with sizes only (no CRC32C of every file)")
	f.BoolVar(&fl.noMerge, "no-merge", false, "measurement: one copy call per block instead of per run")
	f.BoolVar(&fl.wholeCopy, "whole-copy", false, "measurement: copy whole files with read/write instead of cloning them")
	f.BoolVar(&fl.noClone, "no-clone", false, "measurement: never reflink")
	for _, h := range []string{"no-merge", "whole-copy", "no-clone"} {
		_ = f.MarkHidden(h)
	}
	return cmd
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
