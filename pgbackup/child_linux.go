package pgbackup

import "syscall"

// dieWithParent makes a child process get SIGKILL when pgfork dies
// (prctl PR_SET_PDEATHSIG), so pg_basebackup never outlives a killed
// pgfork backup (issue 19, F5).
func dieWithParent() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}
