package main

import "golang.org/x/sys/unix"

// lowerPriority makes the calling process yield the CPU and the disk to
// everything else (nice 10, lowest best-effort I/O priority): the spare
// refill runs while the caller's tests use the cluster up just started.
func lowerPriority() {
	_ = unix.Setpriority(unix.PRIO_PROCESS, 0, 10)
	const whoProcess, classBestEffort = 1, 2
	_, _, _ = unix.Syscall(unix.SYS_IOPRIO_SET, whoProcess, 0, uintptr(classBestEffort<<13|7))
}
