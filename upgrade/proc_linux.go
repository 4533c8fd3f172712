package upgrade

import "syscall"

// dieWithParent makes the kernel kill the child when pgfork dies.
func dieWithParent(a *syscall.SysProcAttr) { a.Pdeathsig = syscall.SIGKILL }
