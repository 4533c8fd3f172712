package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/pgfork/pgfork/clone"
	"github.com/pgfork/pgfork/internal/errs"
	"github.com/pgfork/pgfork/internal/statedir"
	"github.com/pgfork/pgfork/internal/units"
	"github.com/pgfork/pgfork/volume"
)

func (cl *cli) newVolumeCmd() *cobra.Command {
	c := &cobra.Command{
		Use:   "volume",
		Short: "A reflink volume for pgfork's state where the disk cannot clone (ext4)",
		Long: `On a filesystem that cannot clone (ext4, most CI runners and VMs) every copy
pgfork makes is a real copy. 'pgfork volume create' (as root) makes a sparse
image file beside the state directory, formats it XFS with reflink (btrfs
where mkfs.xfs is missing), attaches it to a loop device and mounts it; from
then on every pgfork command keeps its state, templates, clusters and the
managed server's data on it, without flags, and copies become clones.

Creating the volume moves the state: it is refused (exit 6) while anything
pgfork runs from the state directory (clusters, pgfork serve, its branches,
a pgfork pg install), naming them: stop pgfork serve and run
'pgfork down --all' first. The PostgreSQL builds of 'pgfork pg install' and
the cached templates are carried over onto the volume; serve's own databases
(a cache of test databases) are not.

The volume is recorded in the state directory (volume.json). After a reboot
any pgfork command run as root re-attaches it, as does 'pgfork volume attach';
'pgfork volume create' prints an /etc/fstab line that does it at boot.
'pgfork volume rm' unmounts it, detaches the loop device pgfork attached and
removes the image: everything on the volume is lost.`,
	}
	c.AddCommand(cl.newVolumeCreateCmd(), cl.newVolumeAttachCmd(), cl.newVolumeLsCmd(), cl.newVolumeRmCmd(), cl.newVolumeGrowCmd())
	return c
}

func parseSizeFlag(s string) (int64, error) {
	if s == "" {
		return 0, nil
	}
	n, err := units.ParseBytes(s)
	if err != nil {
		return 0, errs.Wrap(errs.Usage, err, "bad --size").WithHint("e.g. --size 8G")
	}
	return n, nil
}

func (cl *cli) newVolumeCreateCmd() *cobra.Command {
	var size, fsType string
	var force bool
	c := &cobra.Command{
		Use:   "create",
		Short: "Make and mount a reflink volume for pgfork's state, or re-attach it (root)",
		Example: `  sudo pgfork volume create
  sudo pgfork volume create --size 20G`,
		Args: usageArgs(cobra.NoArgs),
		RunE: func(cmd *cobra.Command, _ []string) error {
			n, err := parseSizeFlag(size)
			if err != nil {
				return err
			}
			r, err := volume.Create(cmd.Context(), cl.baseStateDir(), volume.Options{Size: n, FS: fsType, Progress: cl.info}, force)
			if err != nil {
				return err
			}
			return cl.printVolume(cmd.OutOrStdout(), r)
		},
	}
	c.Flags().StringVar(&size, "size", "", "size of the image (sparse), e.g. 20G (default: half the free space, at most 32G)")
	c.Flags().StringVar(&fsType, "fs", "", "xfs or btrfs (default: xfs when mkfs.xfs is installed)")
	c.Flags().BoolVar(&force, "force", false, "make a volume even where the state directory can already clone")
	return c
}

func (cl *cli) newVolumeAttachCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "attach",
		Short: "Mount the recorded volume again (after an unmount or a reboot)",
		Args:  usageArgs(cobra.NoArgs),
		RunE: func(cmd *cobra.Command, _ []string) error {
			r, err := volume.Attach(cmd.Context(), cl.baseStateDir())
			if err != nil {
				return err
			}
			return cl.printVolume(cmd.OutOrStdout(), r)
		},
	}
}

func (cl *cli) newVolumeLsCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "ls",
		Short: "Show the volume recorded for the state directory",
		Args:  usageArgs(cobra.NoArgs),
		RunE: func(cmd *cobra.Command, _ []string) error {
			s, err := volume.Stat(cl.baseStateDir())
			if errs.KindOf(err) == errs.NotFound {
				if cl.g.json {
					return printJSON(cmd.OutOrStdout(), []any{})
				}
				cl.infof("no volume recorded for %s (create one: %s)", cl.baseStateDir(), asRoot("pgfork volume create"))
				return nil
			}
			if err != nil {
				return err
			}
			if cl.g.json {
				return printJSON(cmd.OutOrStdout(), []*volume.Status{s})
			}
			w := cmd.OutOrStdout()
			fmt.Fprintf(w, "IMAGE\tMOUNT\tFS\tSIZE\tUSED\tATTACHED\tLOOP\n")
			fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%s\t%v\t%s\n", s.Image, s.Mount, s.FS, units.Bytes(s.Size), units.Bytes(s.Used), s.Attached, s.Loop)
			return nil
		},
	}
}

func (cl *cli) newVolumeRmCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "rm",
		Short: "Unmount the volume, detach its loop device, remove its image (data lost)",
		Args:  usageArgs(cobra.NoArgs),
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := volume.Remove(cmd.Context(), cl.baseStateDir()); err != nil {
				return err
			}
			cl.infof("volume of %s removed", cl.baseStateDir())
			return nil
		},
	}
}

func (cl *cli) newVolumeGrowCmd() *cobra.Command {
	var size string
	c := &cobra.Command{
		Use:     "grow --size N",
		Short:   "Grow the mounted volume to N (image, loop device, filesystem)",
		Example: `  sudo pgfork volume grow --size 40G`,
		Args:    usageArgs(cobra.NoArgs),
		RunE: func(cmd *cobra.Command, _ []string) error {
			n, err := parseSizeFlag(size)
			if err != nil {
				return err
			}
			if n == 0 {
				return errs.New(errs.Usage, "--size is required").WithHint("e.g. pgfork volume grow --size 40G")
			}
			r, err := volume.Grow(cmd.Context(), cl.baseStateDir(), n)
			if err != nil {
				return err
			}
			return cl.printVolume(cmd.OutOrStdout(), r)
		},
	}
	c.Flags().StringVar(&size, "size", "", "new size of the image, e.g. 40G")
	return c
}

func (cl *cli) printVolume(w io.Writer, r *volume.Record) error {
	if cl.g.json {
		return printJSON(w, r)
	}
	fmt.Fprintf(w, "volume %s (%s, %s) mounted at %s via %s\n", r.Image, r.FS, units.Bytes(r.Size), r.Mount, r.Loop)
	fmt.Fprintf(w, "pgfork's state is now %s\n", r.State)
	fmt.Fprintf(w, "pgfork commands run as root re-attach it after a reboot; to mount it at boot instead, add this line to /etc/fstab:\n  %s\n", r.FstabLine())
	return nil
}

// attachVolumeOnce re-attaches, as root, the volume recorded for base when
// its state directory d is missing (after an unmount or a reboot). Errors
// are left for statedir.Layout.Ensure to report.
func (cl *cli) attachVolumeOnce(base, d string) {
	if d == base || os.Geteuid() != 0 {
		return
	}
	cl.attachOnce.Do(func() {
		if _, err := os.Lstat(d); err == nil {
			return
		}
		if _, err := volume.Attach(context.Background(), base); err == nil {
			cl.infof("re-attached the pgfork volume of %s", base)
		}
	})
}

// volumeErrHint names the volume in errors it explains: full (exit 7, how to
// grow it) and recorded but not attached (how to attach it).
func (cl *cli) volumeErrHint(err error) error {
	if errors.Is(err, statedir.ErrVolumeDetached) {
		return errs.Wrap(errs.NotFound, err, "the pgfork volume is not attached").
			WithCLI("%s (or %s)", asRoot("pgfork volume attach"), asRoot("pgfork volume create"))
	}
	if errs.KindOf(err) != errs.NoSpace {
		return err
	}
	base := cl.baseStateDir()
	if statedir.Resolve(base) == base {
		return err
	}
	r, lerr := volume.Load(base)
	if lerr != nil {
		return err
	}
	return errs.Wrap(errs.NoSpace, err, "the pgfork volume %s (mounted at %s, %s) is full", r.Image, r.Mount, units.Bytes(r.Size)).
		WithCLI("%s", r.GrowHint())
}

// info is infof for a message as it is (volume.Options.Progress).
func (cl *cli) info(msg string) { cl.infof("%s", msg) }

// addVolumeFlag adds --volume to up and serve.
func (cl *cli) addVolumeFlag(f *pflag.FlagSet, v *string) {
	f.StringVar(v, "volume", cl.getenv("PGFORK_VOLUME"), `"auto": keep pgfork's state on the recorded reflink volume (re-attached if needed), or create one when root and none exists and the disk cannot clone; "none": create none (env PGFORK_VOLUME, as scripts/ci-setup.sh reads it)`)
}

// useVolume applies --volume: "" and "none" do nothing (a recorded volume
// is used anyway); "auto" attaches the recorded volume or, as root, creates one
// where the state directory cannot clone (refused, exit 6, while pgfork
// runs anything from the state directory; installs and templates are
// carried over: volume.Create). Without root and without a volume it goes
// on without one, saying so.
func (cl *cli) useVolume(ctx context.Context, mode string) error {
	switch mode {
	case "", "none":
		return nil
	case "auto":
	default:
		return errs.New(errs.Usage, "bad --volume %q", mode).WithHint(`use --volume auto or none`)
	}
	base := cl.baseStateDir()
	if _, err := volume.Load(base); err == nil {
		if os.Geteuid() != 0 {
			return nil // attached or not, layout().Ensure says which
		}
		_, err := volume.Attach(ctx, base)
		return err
	}
	if os.Geteuid() != 0 {
		cl.infof("--volume auto: no volume recorded for %s and not root; going on without one (create it: %s)", base, asRoot("pgfork volume create"))
		return nil
	}
	r, err := volume.Create(ctx, base, volume.Options{Progress: cl.info}, false)
	if errors.Is(err, volume.ErrCanClone) {
		return nil // the state directory clones already
	}
	if err != nil {
		return err
	}
	cl.infof("created the pgfork volume %s (%s) mounted at %s", r.Image, units.Bytes(r.Size), r.Mount)
	return nil
}

// volumeAdvice is doctor's word on a reflink volume for a directory that
// cannot clone: the speed-up measured there and then, and the command.
type volumeAdvice struct {
	Recorded *volume.Status  `json:"recorded,omitempty"`
	Speedup  *volume.Speedup `json:"speedup,omitempty"`
	Ratio    float64         `json:"speedup_ratio,omitempty"`
	Error    string          `json:"error,omitempty"`
	Command  string          `json:"command,omitempty"`
}

func (cl *cli) adviseVolume(ctx context.Context, dir string, p *clone.ProbeResult) *volumeAdvice {
	a := &volumeAdvice{}
	if s, err := volume.Stat(cl.baseStateDir()); err == nil {
		a.Recorded = s
	}
	if p.Clone {
		if a.Recorded == nil {
			return nil
		}
		return a
	}
	a.Command = asRoot("pgfork volume create")
	s, err := volume.Measure(ctx, dir)
	if err != nil {
		a.Error = err.Error()
		return a
	}
	a.Speedup, a.Ratio = s, s.Ratio()
	return a
}

func printVolumeAdvice(w io.Writer, a *volumeAdvice, fsType string) {
	if a == nil {
		return
	}
	if s := a.Recorded; s != nil {
		fmt.Fprintf(w, "  volume           %s (%s, %s, attached: %v)\n", s.Image, s.FS, units.Bytes(s.Size), s.Attached)
	}
	if a.Command == "" {
		return
	}
	fmt.Fprintf(w, "\nA reflink volume would make pgfork's copies clones here.\n")
	switch s := a.Speedup; {
	case a.Error != "":
		fmt.Fprintf(w, "  (could not measure the speed-up: %s)\n", a.Error)
	case s.Clone > 0:
		faster := fmt.Sprintf("%.0fx faster", a.Ratio)
		if a.Ratio < 1.5 {
			// A fast disk and a busy machine can make a small set as
			// quick to copy: say what was measured, not a speed-up.
			faster = fmt.Sprintf("%.2fx: no faster at this size, now", a.Ratio)
		}
		fmt.Fprintf(w, "  measured now (the fastest of %d each): copying %s in %d files took %s on %s, %s on a temporary XFS reflink volume (%s)\n",
			volume.MeasureRounds, units.Bytes(s.Bytes), s.Files, s.Copy.Round(time.Millisecond), fsType, s.Clone.Round(100*time.Microsecond), faster)
		fmt.Fprintf(w, "  (a clone's time hardly grows with size; a copy's grows with it: a 180 MiB template gains more)\n")
	default:
		fmt.Fprintf(w, "  measured now: copying %s in %d files took %s on %s (%.0f MiB/s); a clone takes milliseconds whatever the size\n",
			units.Bytes(s.Bytes), s.Files, s.Copy.Round(time.Millisecond), fsType, float64(s.Bytes)/(1<<20)/s.Copy.Seconds())
		fmt.Fprintf(w, "  (clone time not measured: %s)\n", s.Why)
	}
	fmt.Fprintf(w, "  create it: %s\n", a.Command)
}

// asRoot is command as the user should type it to run it as root: with
// sudo when pgfork does not run as root, as it is when it does.
func asRoot(command string) string {
	if os.Geteuid() == 0 {
		return command
	}
	return "sudo " + command
}
