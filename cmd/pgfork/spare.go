package main

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"syscall"

	"github.com/spf13/cobra"

	"github.com/pgfork/pgfork/instance"
	"github.com/pgfork/pgfork/internal/proc"
	"github.com/pgfork/pgfork/template"
	"github.com/pgfork/pgfork/up"
)

// envSpares sets the default of up's --spares.
const envSpares = "PGFORK_SPARES"

// defaultSpares is the default of --spares: 1 (PGFORK_SPARES, checked by
// sparesFromEnv, replaces it when the flag is not given).
const defaultSpares = 1

// spawnRefill is up.Options.Refill: it starts `pgfork template refill KEY`
// as a detached process (its own session, stdio on /dev/null) and does not
// wait for it: up returns while the spare is being made. The request
// crosses the process boundary as the hidden command's flags, which
// newTemplateRefillCmd parses and checks back into template.RefillOptions.
func spawnRefill(r up.Refill) error {
	lay, key, n, user := r.Layout, r.Key, r.Spares, r.User
	self, err := os.Executable()
	if err != nil {
		return err
	}
	root, err := filepath.Abs(lay.Root)
	if err != nil {
		return err
	}
	args := []string{"--state-dir", root, "-q"}
	if user != nil {
		args = append(args, "--run-as", user.Name)
	}
	args = append(args, "template", "refill", key, "--spares", strconv.Itoa(n))
	devnull, err := os.OpenFile(os.DevNull, os.O_RDWR, 0)
	if err != nil {
		return err
	}
	defer devnull.Close()
	cmd := exec.Command(self, args...)
	cmd.Stdin, cmd.Stdout, cmd.Stderr = devnull, devnull, devnull
	cmd.Dir = "/"
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := cmd.Start(); err != nil {
		return err
	}
	return cmd.Process.Release()
}

func (cl *cli) newTemplateRefillCmd() *cobra.Command {
	var n int
	cmd := &cobra.Command{
		Use:    "refill KEY",
		Short:  "Make spare copies of a template until it has --spares of them (run by up in the background)",
		Hidden: true,
		Args:   usageArgs(cobra.ExactArgs(1)),
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := checkIntRange("--spares", n, 0, template.MaxSpares, "--spares 2"); err != nil {
				return err
			}
			// The refill runs while the caller's tests use the cluster up
			// just started, and while later ups copy: it takes the CPU
			// and the disk only when they are free. Best effort.
			_ = proc.Background()
			user, err := instance.ResolveUser(cl.g.runAs)
			if err != nil {
				return err
			}
			o := template.RefillOptions{Spares: n, OnSkip: func(why string) { cl.infof("refill stopped: %s", why) }}
			if user != nil {
				o.Owner = user.Owner()
			}
			made, err := template.Refill(cmd.Context(), cl.layout(), args[0], o)
			if err != nil {
				return err
			}
			cl.infof("made %d spare(s) of template %s", made, args[0])
			if cl.g.json {
				return printJSON(cmd.OutOrStdout(), map[string]int{"made": made})
			}
			fmt.Fprintln(cmd.OutOrStdout(), made)
			return nil
		},
	}
	cmd.Flags().IntVar(&n, "spares", 1, "spare copies to keep")
	return cmd
}
