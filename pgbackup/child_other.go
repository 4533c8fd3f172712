//go:build !linux

package pgbackup

import "syscall"

// dieWithParent: outside Linux there is no parent-death signal; the child
// gets its own process group only.
func dieWithParent() *syscall.SysProcAttr { return &syscall.SysProcAttr{Setpgid: true} }
