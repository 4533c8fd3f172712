package instance

import (
	"os"
	"runtime"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/pgfork/pgfork/internal/errs"
)

// openAs opens path for appending, or truncated when trunc (created 0600
// if missing), with the
// filesystem identity of uid/gid: setfsuid/setfsgid act on the calling
// thread only, so the thread is locked for the call. The kernel then checks
// every step of the path as that user, and a new file is born owned by it.
// A root process that opens a file for another user this way can never be
// made to open, create or chown a file that user could not (a symlink to
// /etc/ld.so.preload, a directory swapped under the path). If the identity
// cannot be given back, the thread is left locked, and Go ends it with the
// goroutine rather than reuse it.
func openAs(path string, uid, gid int, trunc bool) (*os.File, error) {
	runtime.LockOSThread()
	// Root's supplementary groups would still grant their rights: the
	// thread takes the user's primary group alone (a raw setgroups changes
	// this thread's credentials only; the C library's wrapper would change
	// every thread's).
	groups, gerr := unix.Getgroups()
	if gerr != nil {
		runtime.UnlockOSThread()
		return nil, gerr
	}
	if err := setThreadGroups([]int{gid}); err != nil {
		runtime.UnlockOSThread()
		return nil, errs.FromOS(err, path, "cannot take the groups of gid %d to open the file", gid)
	}
	restored := false
	defer func() {
		if restored {
			runtime.UnlockOSThread()
		} // else: the thread dies locked with the goroutine
	}()
	prevGID, _ := unix.SetfsgidRetGid(gid)
	prevUID, _ := unix.SetfsuidRetUid(uid)
	// setfsuid returns the previous id whether or not it changed it: read
	// the ids back to know that the switch happened.
	var f *os.File
	var err error
	if now, _ := unix.SetfsuidRetUid(-1); now != uid {
		err = errs.New(errs.Permission, "cannot take the identity of uid %d to open the file", uid).WithPath(path)
	} else {
		f, err = openLogFile(path, trunc)
	}
	_, _ = unix.SetfsuidRetUid(prevUID)
	_, _ = unix.SetfsgidRetGid(prevGID)
	gerr = setThreadGroups(groups)
	u, _ := unix.SetfsuidRetUid(-1)
	g, _ := unix.SetfsgidRetGid(-1)
	restored = gerr == nil && u == prevUID && g == prevGID
	return f, err
}

// logOpenFlags: never follow a symlink in the last component, never block
// on a FIFO planted under the name.
const logOpenFlags = os.O_CREATE | os.O_WRONLY | os.O_APPEND | unix.O_NOFOLLOW | unix.O_NONBLOCK | unix.O_CLOEXEC

// setThreadGroups sets the supplementary groups of the calling thread only.
func setThreadGroups(gids []int) error {
	g := make([]uint32, len(gids))
	for i, v := range gids {
		g[i] = uint32(v)
	}
	var p unsafe.Pointer
	if len(g) > 0 {
		p = unsafe.Pointer(&g[0])
	}
	if _, _, e := unix.RawSyscall(unix.SYS_SETGROUPS, uintptr(len(g)), uintptr(p), 0); e != 0 {
		return e
	}
	return nil
}
