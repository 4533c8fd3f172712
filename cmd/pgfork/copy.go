package main

import (
	"fmt"
	"io"
	"sort"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/pgfork/pgfork/clone"
	"github.com/pgfork/pgfork/internal/units"
)

// copyResult is what `pgfork copy --json` prints.
type copyResult struct {
	Src string `json:"src"`
	Dst string `json:"dst"`
	*clone.Summary
	BytesPerSecond float64 `json:"bytes_per_second"`
}

func (cl *cli) newCopyCmd() *cobra.Command {
	var (
		method, syncMode string
		jobs             int
		prefetch, force  bool
	)
	cmd := &cobra.Command{
		Use:   "copy SRC DST",
		Short: "Copy a directory tree by the fastest method the filesystems allow",
		Long: `Copy the directory tree SRC to DST (which must not exist) by the fastest method
the filesystems allow, keeping modes, ownership (as root), mtimes, symlinks,
empty directories and holes in sparse files.

Methods:
  auto             probe once per (source, destination) filesystem pair and use the
                   best that works, falling back per file (default)
  clone            reflink (FICLONE): blocks are shared, copy-on-write (XFS, btrfs)
  copy-file-range  copy_file_range(2): in-kernel copy, shares blocks where it can
  copy             read/write with a large buffer, keeping holes
  link             hard links: only for files that will never be written

The copy is built in a hidden staging directory beside DST and renamed into
place when complete: after a crash, kill or Ctrl-C, DST does not exist and the
next run removes the leftovers. The source is never written.`,
		Example: `  pgfork copy /srv/pg/15/main /srv/pg/15/branch
  pgfork copy --method clone /mnt/xfs/data /mnt/xfs/data-copy
  pgfork copy src dst --force --sync syncfs --json`,
		Args: usageArgs(cobra.ExactArgs(2)),
		RunE: func(cmd *cobra.Command, args []string) error {
			m, err := clone.ParseMethod(method)
			if err != nil {
				return err
			}
			s, err := clone.ParseSyncMode(syncMode)
			if err != nil {
				return err
			}
			if err := checkJobs(jobs); err != nil {
				return err
			}
			bar := cl.newByteProgress("copying")
			defer bar.Done()
			sum, err := clone.Copy(cmd.Context(), args[0], args[1], clone.Options{
				Method:     m,
				Jobs:       jobs,
				Prefetch:   prefetch,
				Sync:       s,
				Force:      force,
				OnProgress: func(p clone.Progress) { bar.Update(p.Bytes, p.TotalBytes) },
			})
			bar.Done()
			if err != nil {
				return err
			}
			res := copyResult{Src: args[0], Dst: args[1], Summary: sum}
			if sum.Elapsed > 0 {
				res.BytesPerSecond = float64(sum.Bytes) / sum.Elapsed.Seconds()
			}
			if cl.g.json {
				return printJSON(cmd.OutOrStdout(), res)
			}
			printCopySummary(cmd.OutOrStdout(), res)
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVarP(&method, "method", "m", "auto", "copy method: auto, clone, copy-file-range, copy, link")
	f.IntVarP(&jobs, "jobs", "j", 0, "files copied in parallel (default: one per core)")
	f.BoolVar(&prefetch, "prefetch", false, "ask the kernel to read source files ahead (posix_fadvise WILLNEED)")
	f.StringVar(&syncMode, "sync", "fsync", "durability before DST appears: none, fsync (each file and dir), syncfs (whole filesystem once)")
	f.BoolVar(&force, "force", false, "replace DST if it exists (atomically)")
	return cmd
}

func printCopySummary(w io.Writer, r copyResult) {
	s := r.Summary
	fmt.Fprintf(w, "copied %s -> %s\n", r.Src, r.Dst)
	fmt.Fprintf(w, "  files     %d (%d directories, %d symlinks)\n", s.Files, s.Dirs, s.Symlinks)
	fmt.Fprintf(w, "  bytes     %s", units.Bytes(s.Bytes))
	if s.SharedBytes > 0 {
		fmt.Fprintf(w, " (%s shared with the source by copy-on-write)", units.Bytes(s.SharedBytes))
	}
	fmt.Fprintln(w)
	var ms []string
	for m, n := range s.Methods {
		ms = append(ms, fmt.Sprintf("%s %d", m, n))
	}
	sort.Strings(ms)
	if len(ms) == 0 {
		ms = []string{"none (no files)"}
	}
	fmt.Fprintf(w, "  methods   %s\n", strings.Join(ms, ", "))
	if s.Vanished > 0 {
		fmt.Fprintf(w, "  vanished  %d (disappeared during the copy)\n", s.Vanished)
	}
	fmt.Fprintf(w, "  elapsed   %s (%s/s), sync %s\n", s.Elapsed.Round(time.Millisecond), units.Bytes(int64(r.BytesPerSecond)), s.Sync)
}
