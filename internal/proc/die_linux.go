package proc

import (
	"os/exec"
	"syscall"
)

// DieWithParent makes the kernel kill cmd's process (SIGKILL) when the
// thread that starts it, and so pgfork, dies (prctl PR_SET_PDEATHSIG):
// a pg_basebackup or pg_upgrade never outlives a killed pgfork.
func DieWithParent(cmd *exec.Cmd) {
	if cmd.SysProcAttr == nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{}
	}
	cmd.SysProcAttr.Pdeathsig = syscall.SIGKILL
}
