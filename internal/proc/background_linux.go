package proc

import (
	"os"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// The "who", class and level of ioprio_set(2) (linux/ioprio.h).
const (
	ioprioWhoProcess      = 1
	ioprioClassShift      = 13
	ioprioClassBestEffort = 2
	ioprioLowest          = 7
	backgroundIOPrio      = ioprioClassBestEffort<<ioprioClassShift | ioprioLowest
)

// BackgroundNice is the nice value Background gives the process.
const BackgroundNice = 19

// Background lowers the calling process to background priority: nice 19
// and the lowest best-effort I/O priority, so that everything else gets the
// CPU and the disk first. (Not the idle I/O class: a process starved of the
// disk while it holds a filesystem lock stalls everyone who needs that
// lock.) Linux keeps both per thread, and a Go program's
// goroutines move between threads, so every thread is lowered (threads
// made later inherit it from the thread that makes them); the pass is
// repeated until it finds no thread it has not seen.
func Background() error {
	seen := map[int]bool{}
	for {
		ents, err := os.ReadDir("/proc/self/task")
		if err != nil {
			return err
		}
		fresh := false
		for _, e := range ents {
			tid, err := strconv.Atoi(e.Name())
			if err != nil || seen[tid] {
				continue
			}
			seen[tid], fresh = true, true
			if err := lowerTask(tid); err != nil && err != unix.ESRCH {
				return err
			}
		}
		if !fresh {
			return nil
		}
	}
}

// lowerTask gives one thread (a single-threaded process: its pid) nice
// BackgroundNice and the lowest best-effort I/O priority; an ESRCH comes
// back unwrapped.
func lowerTask(tid int) error {
	if err := unix.Setpriority(unix.PRIO_PROCESS, tid, BackgroundNice); err != nil {
		if err == unix.ESRCH {
			return err
		}
		return os.NewSyscallError("setpriority", err)
	}
	if _, _, e1 := unix.Syscall(unix.SYS_IOPRIO_SET, ioprioWhoProcess, uintptr(tid), backgroundIOPrio); e1 != 0 {
		if e1 == unix.ESRCH {
			return e1
		}
		return os.NewSyscallError("ioprio_set", e1)
	}
	return nil
}

// LowerTree lowers a child process (pgfork's own: a server or a tool it
// started) and the processes it has started so far to background priority,
// as Background does for pgfork itself; processes it starts later inherit
// it. Call it right after the child starts, before it had time to start
// others, and again once it has (a server's background processes). For
// the single-threaded PostgreSQL programs a process is one thread. Processes
// that ended meanwhile are skipped.
func LowerTree(pid int) error {
	if !Valid(pid) {
		return unix.EINVAL
	}
	if err := lowerTask(pid); err != nil {
		if err == unix.ESRCH {
			return nil
		}
		return err
	}
	for _, c := range children(pid) {
		if err := LowerTree(c); err != nil {
			return err
		}
	}
	return nil
}

// children lists pid's child processes (/proc/PID/task/PID/children: the
// children of its main thread, which is where single-threaded programs fork).
func children(pid int) []int {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/task/" + strconv.Itoa(pid) + "/children")
	if err != nil {
		return nil
	}
	var out []int
	for _, f := range strings.Fields(string(b)) {
		if c, err := strconv.Atoi(f); err == nil {
			out = append(out, c)
		}
	}
	return out
}
