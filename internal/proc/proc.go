// Package proc answers questions about other processes without trusting
// pids read from files that someone else can write: whether a pid is a
// valid process id at all, whether it runs, when it started, as whom, from
// which executable and in which directory, and a pidfd handle that signals
// exactly the process it was opened on (never a later process that reused
// its pid). Background lowers the calling process itself to background
// priority (every thread).
//
// It must not decide policy (which process may be signalled): that is the
// caller's (instance.Attach verifies a postmaster).
package proc

import (
	"os"
	"strconv"
	"strings"
	"sync"
)

// defaultPidMax is Linux's upper limit of pid_max (PID_MAX_LIMIT on 64-bit):
// used when /proc/sys/kernel/pid_max cannot be read.
const defaultPidMax = 1 << 22

var pidMax = sync.OnceValue(func() int {
	b, err := os.ReadFile("/proc/sys/kernel/pid_max")
	if err != nil {
		return defaultPidMax
	}
	n, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil || n <= 1 || n > 1<<30 {
		return defaultPidMax
	}
	return n
})

// Valid reports whether pid can name a process: 1 ≤ pid < pid_max. It
// rejects 0 and negative pids (kill(2) reads them as process groups or
// "every process") and values that would be truncated to 32 bits
// (2^32 + N becomes N, 2^32 - 1 becomes -1).
func Valid(pid int) bool {
	return pid >= 1 && pid < pidMax()
}

// Alive reports whether pid is valid and a process with that pid exists
// (signal 0; a process of another user counts).
func Alive(pid int) bool {
	if !Valid(pid) {
		return false
	}
	return alive(pid)
}
