//go:build !linux

package proc

import (
	"os/exec"
	"syscall"
)

// DieWithParent: only Linux can tie a child's life to its parent's; here
// the child gets a process group of its own, and the next run's cleanup
// stops what a killed pgfork left.
func DieWithParent(cmd *exec.Cmd) {
	if cmd.SysProcAttr == nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{}
	}
	cmd.SysProcAttr.Setpgid = true
}
