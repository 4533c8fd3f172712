package proc

import (
	"os"
	"strconv"

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
			if err := unix.Setpriority(unix.PRIO_PROCESS, tid, BackgroundNice); err != nil && err != unix.ESRCH {
				return os.NewSyscallError("setpriority", err)
			}
			_, _, e1 := unix.Syscall(unix.SYS_IOPRIO_SET, ioprioWhoProcess, uintptr(tid), backgroundIOPrio)
			if e1 != 0 && e1 != unix.ESRCH {
				return os.NewSyscallError("ioprio_set", e1)
			}
		}
		if !fresh {
			return nil
		}
	}
}
