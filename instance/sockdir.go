package instance

import (
	"bufio"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/pgfork/pgfork/internal/proc"
)

// sockPrefix starts the name of every private socket directory instance
// makes: pgfork-s-<pid>-<start>-<random>, where pid and start name the
// process that made it (start: proc.StartTime), so CleanSocketDirs can tell
// a leftover from a directory in use.
const sockPrefix = "pgfork-s-"

// maxSocketDir is the longest socket directory whose socket path
// (dir + "/.s.PGSQL.NNNNN") fits in sun_path (108 bytes with the NUL).
const maxSocketDir = 107 - len("/.s.PGSQL.65535")

// newSocketDir makes a private socket directory under parent (or the
// system temp dir when parent is empty or too long for a socket path).
func newSocketDir(parent string) (string, error) {
	me := os.Getpid()
	pattern := fmt.Sprintf("%s%d-%d-", sockPrefix, me, proc.StartTime(me))
	if parent != "" && len(parent)+1+len(pattern)+10 <= maxSocketDir {
		if err := os.MkdirAll(parent, 0o755); err == nil {
			return os.MkdirTemp(parent, pattern)
		}
	}
	return os.MkdirTemp("", pattern)
}

// CleanSocketDirs removes the private socket directories under parent
// (and in the system temp dir) that no one uses any more: the process that
// made them is gone (pid and start time, from the name) and no server
// still listens in them (a .s.PGSQL.*.lock file naming a live process).
// A server that outlives its pgfork (clone --start) keeps its directory
// until it stops; a pgfork killed with kill -9 leaves one that the next
// run removes. It is cheap: one directory listing.
func CleanSocketDirs(parent string) {
	for _, dir := range []string{parent, os.TempDir()} {
		if dir == "" {
			continue
		}
		ents, err := os.ReadDir(dir)
		if err != nil {
			continue
		}
		for _, e := range ents {
			if !e.IsDir() || !strings.HasPrefix(e.Name(), sockPrefix) {
				continue
			}
			p := filepath.Join(dir, e.Name())
			if socketDirInUse(p, e.Name()) {
				continue
			}
			_ = os.RemoveAll(p) // does not follow symlinks
		}
	}
}

func socketDirInUse(path, name string) bool {
	f := strings.SplitN(strings.TrimPrefix(name, sockPrefix), "-", 3)
	if len(f) < 2 {
		return true // not ours to judge
	}
	pid, err1 := strconv.Atoi(f[0])
	start, err2 := strconv.ParseUint(f[1], 10, 64)
	if err1 != nil || err2 != nil {
		return true
	}
	if proc.Alive(pid) && (start == 0 || proc.StartTime(pid) == start) {
		return true // its maker still runs
	}
	locks, _ := filepath.Glob(filepath.Join(path, ".s.PGSQL.*.lock"))
	for _, l := range locks {
		if fh, err := os.Open(l); err == nil {
			sc := bufio.NewScanner(fh)
			if sc.Scan() {
				if pid, err := strconv.Atoi(strings.TrimSpace(sc.Text())); err == nil && proc.Alive(pid) {
					fh.Close()
					return true // a server still listens here
				}
			}
			fh.Close()
		}
	}
	return false
}
