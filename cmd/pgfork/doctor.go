package main

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"

	"github.com/spf13/cobra"

	"github.com/pgfork/pgfork/clone"
	"github.com/pgfork/pgfork/internal/errs"
	"github.com/pgfork/pgfork/pgbin"
)

// doctorReport is what `pgfork doctor --json` prints.
type doctorReport struct {
	PostgreSQL []pgbin.Installation `json:"postgresql"`
	PGError    string               `json:"postgresql_error,omitempty"`
	Dir        string               `json:"dir"`
	Probe      *clone.ProbeResult   `json:"probe"`
	WillUse    clone.Method         `json:"will_use"`
	Volume     *volumeAdvice        `json:"volume,omitempty"`
}

func (cl *cli) newDoctorCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "doctor [DIR]",
		Short: "Check what pgfork can do here: PostgreSQL builds, filesystem, copy methods",
		Long: `Report what you need to know before trusting pgfork with your data: the
PostgreSQL installations found (every major, bin directory, version), and for
DIR (default: pgfork's state directory, created if needed) the filesystem type,
which copy methods actually work there (probed by copying a real test file with
clone, copy_file_range and a plain copy), whether copies share blocks with
their source (copy-on-write), and the method pgfork will use.`,
		Example: `  pgfork doctor
  pgfork doctor /mnt/xfs/pgdata
  pgfork doctor --json | jq .will_use`,
		Args: usageArgs(cobra.MaximumNArgs(1)),
		RunE: func(cmd *cobra.Command, args []string) error {
			dir := cl.layout().Root
			if len(args) == 1 {
				dir = args[0]
				fi, err := os.Stat(dir)
				if err != nil {
					if errors.Is(err, fs.ErrNotExist) {
						return errs.New(errs.NotFound, "directory does not exist").WithPath(dir).
							WithHint("give an existing directory on the filesystem you want to check")
					}
					return errs.FromOS(err, dir, "cannot use the directory")
				}
				if !fi.IsDir() {
					return errs.New(errs.Usage, "not a directory").WithPath(dir).
						WithHint("give a directory on the filesystem you want to check")
				}
			} else if err := cl.layout().Ensure(); err != nil {
				return errs.Wrap(errs.OSKind(err), err, "cannot create the state directory").WithPath(dir).
					WithHint("pass a directory you can write, or --state-dir")
			}
			if abs, err := filepath.Abs(dir); err == nil {
				dir = abs
			}
			rep := doctorReport{Dir: dir, PostgreSQL: []pgbin.Installation{}}
			pgs, err := pgbin.Discover(pgbin.Options{Explicit: cl.g.pgBin, StateDir: cl.layout().Root})
			if err != nil {
				rep.PGError = err.Error()
			}
			rep.PostgreSQL = append(rep.PostgreSQL, pgs...)
			probe, err := clone.Probe(cmd.Context(), dir, dir)
			if err != nil {
				return err
			}
			rep.Probe, rep.WillUse = probe, probe.Best
			rep.Volume = cl.adviseVolume(cmd.Context(), dir, probe)
			if cl.g.json {
				return printJSON(cmd.OutOrStdout(), rep)
			}
			printDoctor(cmd.OutOrStdout(), rep)
			return nil
		},
	}
}

func printDoctor(w io.Writer, r doctorReport) {
	fmt.Fprintln(w, "PostgreSQL installations:")
	if len(r.PostgreSQL) == 0 {
		fmt.Fprintln(w, "  none found; install one with `pgfork pg install 18` or pass --pg-bin DIR")
	}
	for _, in := range r.PostgreSQL {
		fmt.Fprintf(w, "  %-3d %-10s %s (%s)\n", in.Major, in.Version, in.BinDir, in.Source)
	}
	if r.PGError != "" {
		fmt.Fprintf(w, "  problem: %s\n", r.PGError)
	}
	p := r.Probe
	fmt.Fprintf(w, "\nDirectory %s\n", r.Dir)
	fmt.Fprintf(w, "  filesystem       %s\n", p.FSType)
	yes := func(ok bool, m clone.Method) string {
		if ok {
			return "works"
		}
		return "no (" + p.Errors[m] + ")"
	}
	fmt.Fprintf(w, "  clone            %s\n", yes(p.Clone, clone.Clone))
	fmt.Fprintf(w, "  copy-file-range  %s\n", yes(p.CopyFileRange, clone.CopyFileRange))
	fmt.Fprintf(w, "  copy             %s\n", yes(p.Copy, clone.PlainCopy))
	if p.SharesBlocks {
		fmt.Fprintln(w, "  shares blocks    yes: copies are copy-on-write and take almost no space or time")
	} else {
		fmt.Fprintln(w, "  shares blocks    no: every copy writes all its data (XFS with reflink or btrfs would share)")
	}
	fmt.Fprintf(w, "  pgfork will use  %s\n", r.WillUse)
	printVolumeAdvice(w, r.Volume, p.FSType)
}
