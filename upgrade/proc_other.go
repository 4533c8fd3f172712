//go:build !linux

package upgrade

import "syscall"

// dieWithParent: only Linux can tie a child's life to its parent's; elsewhere
// the next run's cleanup stops what a killed pgfork left.
func dieWithParent(*syscall.SysProcAttr) {}
