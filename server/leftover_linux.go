package server

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/pgfork/pgfork/instance"
	"github.com/pgfork/pgfork/internal/errs"
)

// stopLeftover stops a postmaster that a killed `pgfork serve` left running
// on dataDir, so the managed cluster can start again with its data and
// state. It signals a process only when it is provably that postmaster:
// the pid is within pid_max, and through a pidfd (so a pid reused after
// the checks is never signalled) the process runs a `postgres` executable,
// belongs to uid, has dataDir as its working directory and started when
// postmaster.pid says. Anything else is left alone: a stale pid file is
// PostgreSQL's own to handle, and a live stranger makes the start fail.
func stopLeftover(ctx context.Context, dataDir string, uid int) error {
	pf, err := instance.ReadPidFile(dataDir)
	if err != nil {
		return nil // no pid file, or one PostgreSQL rewrites itself
	}
	if pf.Pid <= 0 || pf.Pid > pidMax() {
		return errs.New(errs.Busy, "postmaster.pid names pid %d, which cannot be a process", pf.Pid).WithPath(dataDir).
			WithHint("make sure no server runs on this data directory, then remove postmaster.pid")
	}
	fd, err := unix.PidfdOpen(pf.Pid, 0)
	if errors.Is(err, unix.ESRCH) {
		return nil // dead: PostgreSQL replaces the stale pid file
	}
	if err != nil {
		return errs.Wrap(errs.Internal, err, "cannot open process %d", pf.Pid)
	}
	defer unix.Close(fd)
	if why, sure := notOurPostmaster(pf, dataDir, uid); why != "" {
		if sure {
			// The pid was reused by another process: the postmaster that
			// wrote the file is gone, and PostgreSQL would refuse to start
			// while the file names a live process.
			if err := os.Remove(filepath.Join(dataDir, "postmaster.pid")); err != nil && !os.IsNotExist(err) {
				return errs.Wrap(errs.Permission, err, "cannot remove the stale postmaster.pid").WithPath(dataDir)
			}
			return nil
		}
		return errs.New(errs.Busy, "postmaster.pid names pid %d, which is not this cluster's server (%s)", pf.Pid, why).
			WithPath(dataDir).WithHint("stop whatever runs on this data directory, or remove postmaster.pid if nothing does")
	}
	signal := func(sig unix.Signal) error {
		err := unix.PidfdSendSignal(fd, sig, nil, 0)
		if errors.Is(err, unix.ESRCH) {
			return nil
		}
		return err
	}
	if err := signal(unix.SIGINT); err != nil { // fast shutdown: a checkpoint, data kept
		return errs.Wrap(errs.Permission, err, "cannot stop the leftover server (pid %d)", pf.Pid)
	}
	for _, next := range []unix.Signal{unix.SIGQUIT, unix.SIGKILL} {
		if exited(ctx, fd, time.Minute) {
			return nil
		}
		_ = signal(next)
	}
	if exited(ctx, fd, 10*time.Second) {
		return nil
	}
	return errs.New(errs.Busy, "the leftover server (pid %d) does not stop", pf.Pid).WithPath(dataDir)
}

// exited waits up to d for the process of pidfd fd to end.
func exited(ctx context.Context, fd int, d time.Duration) bool {
	deadline := time.Now().Add(d)
	for time.Now().Before(deadline) && ctx.Err() == nil {
		fds := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}
		n, err := unix.Poll(fds, 100)
		if err == nil && n > 0 {
			return true
		}
	}
	return false
}

// notOurPostmaster says why process pf.Pid is not the postmaster of
// dataDir run by uid, or "" when it is; sure is set when the answer is
// proven (the process is readable and differs), not just unknown.
func notOurPostmaster(pf *instance.PidFile, dataDir string, uid int) (why string, sure bool) {
	proc := "/proc/" + strconv.Itoa(pf.Pid)
	exe, err := os.Readlink(proc + "/exe")
	if err != nil {
		return "its executable cannot be read: " + err.Error(), false
	}
	if filepath.Base(exe) != "postgres" {
		return "it runs " + exe, true
	}
	st, err := os.ReadFile(proc + "/status")
	if err != nil {
		return "its status cannot be read", false
	}
	u, ok := statusUID(string(st))
	if !ok {
		return "its uid cannot be read", false
	}
	if u != uid {
		return fmt.Sprintf("it runs as uid %d, not %d", u, uid), true
	}
	cwd, err := os.Readlink(proc + "/cwd")
	if err != nil {
		return "its working directory cannot be read", false
	}
	want, err := filepath.EvalSymlinks(dataDir)
	if err != nil {
		want = dataDir
	}
	if cwd != want {
		return "it works in " + cwd, true // a postmaster works in its data directory
	}
	started, ok := startTime(pf.Pid)
	if !ok {
		return "its start time cannot be read", false
	}
	if d := started.Sub(pf.Started); d < -2*time.Second || d > 2*time.Second {
		return fmt.Sprintf("it started at %s, the pid file says %s", started.Format(time.RFC3339), pf.Started.Format(time.RFC3339)), true
	}
	return "", false
}

// statusUID returns the real uid from /proc/PID/status.
func statusUID(status string) (int, bool) {
	for _, line := range strings.Split(status, "\n") {
		if rest, ok := strings.CutPrefix(line, "Uid:"); ok {
			f := strings.Fields(rest)
			if len(f) == 0 {
				return -1, false
			}
			u, err := strconv.Atoi(f[0])
			return u, err == nil
		}
	}
	return -1, false
}

// startTime returns when process pid started, from its start in clock
// ticks since boot (/proc/PID/stat field 22) and the boot time.
func startTime(pid int) (time.Time, bool) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return time.Time{}, false
	}
	s := string(b)
	i := strings.LastIndexByte(s, ')') // the name may hold spaces and ')'
	if i < 0 {
		return time.Time{}, false
	}
	f := strings.Fields(s[i+1:])
	if len(f) < 20 {
		return time.Time{}, false
	}
	ticks, err := strconv.ParseUint(f[19], 10, 64)
	if err != nil {
		return time.Time{}, false
	}
	st, err := os.ReadFile("/proc/stat")
	if err != nil {
		return time.Time{}, false
	}
	for _, line := range strings.Split(string(st), "\n") {
		if rest, ok := strings.CutPrefix(line, "btime "); ok {
			boot, err := strconv.ParseInt(strings.TrimSpace(rest), 10, 64)
			if err != nil {
				return time.Time{}, false
			}
			const clkTck = 100 // USER_HZ, fixed at 100 in Linux's ABI for /proc
			return time.Unix(boot, 0).Add(time.Duration(ticks) * time.Second / clkTck), true
		}
	}
	return time.Time{}, false
}

// pidMax is the kernel's largest pid (/proc/sys/kernel/pid_max).
func pidMax() int {
	b, err := os.ReadFile("/proc/sys/kernel/pid_max")
	if err != nil {
		return 1 << 22 // the kernel's upper limit for pid_max
	}
	n, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil || n <= 0 {
		return 1 << 22
	}
	return n
}
