package pgclone

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	"github.com/pgfork/pgfork/clone"
	"github.com/pgfork/pgfork/internal/errs"
	"github.com/pgfork/pgfork/internal/flock"
	"github.com/pgfork/pgfork/internal/fsutil"
)

// Names of what a clone builds beside its destination DST:
//
//	.DST.pgfork-clone-PID-RAND          the data directory being built
//	.DST.tblspc.pgfork-clone-PID-RAND   the tablespace copies being built
//	DST.tblspc/OID                      the finished tablespace copies
//
// A staging directory is held with flock(2) while its clone runs, so a
// later run can tell a crashed clone's leftovers from a live one, whatever
// happened to the pid. DST.tblspc carries the incomplete marker from the
// moment it is renamed into place until DST itself is.
const (
	stagingTag       = ".pgfork-clone-"
	tablespaceSuffix = ".tblspc"
	incompleteMarker = ".pgfork-clone-incomplete"
)

// TablespaceDir returns where the clone at dst keeps its tablespace copies.
func TablespaceDir(dst string) string { return dst + tablespaceSuffix }

// staged is a directory being built, locked (flock.LockDir) while it is.
type staged struct {
	path   string
	unlock func()
	built  os.FileInfo // the directory as made: checked before the rename (clone.SameDir)
}

func newStaged(parent, base string) (*staged, error) {
	p, err := os.MkdirTemp(parent, "."+base+stagingTag+fmt.Sprint(os.Getpid())+"-")
	if err != nil {
		return nil, errs.FromOS(err, parent, "cannot create a staging directory beside the destination")
	}
	unlock, err := flock.LockDir(p)
	if err != nil {
		_ = os.Remove(p)
		return nil, errs.Wrap(errs.Internal, err, "cannot lock the staging directory").WithPath(p)
	}
	built, err := os.Lstat(p)
	if err != nil {
		unlock()
		_ = os.Remove(p)
		return nil, errs.FromOS(err, p, "cannot stat the staging directory")
	}
	return &staged{path: p, unlock: unlock, built: built}, nil
}

// release drops the lock; the directory stays where it is.
func (s *staged) release() {
	if s != nil && s.unlock != nil {
		s.unlock()
		s.unlock = nil
	}
}

// CleanStale removes what earlier clones to dst left behind when they
// crashed or were killed: their staging directories, and a DST.tblspc
// still marked incomplete (renamed into place just before the crash, while
// DST never was). Leftovers of clones still running are left alone.
func CleanStale(dst string) error {
	dst, err := filepath.Abs(dst)
	if err != nil {
		return err
	}
	var all []error
	parent := filepath.Dir(dst)
	for _, base := range []string{filepath.Base(dst), filepath.Base(dst) + tablespaceSuffix} {
		matches, _ := filepath.Glob(filepath.Join(parent, "."+globEscape(base)+stagingTag+"*"))
		for _, m := range matches {
			fi, err := os.Lstat(m)
			if err != nil || !fi.IsDir() || flock.IsLockedByLiveProcess(m) {
				continue
			}
			if err := fsutil.RemoveAll(m); err != nil {
				all = append(all, err)
			}
		}
	}
	ts := TablespaceDir(dst)
	if _, err := os.Lstat(filepath.Join(ts, incompleteMarker)); err == nil && !flock.IsLockedByLiveProcess(ts) {
		if _, err := os.Lstat(dst); errors.Is(err, fs.ErrNotExist) {
			if err := fsutil.RemoveAll(ts); err != nil {
				all = append(all, err)
			}
		}
	}
	if err := clone.CleanStale(dst); err != nil {
		all = append(all, err)
	}
	return errors.Join(all...)
}

func globEscape(s string) string {
	r := strings.NewReplacer(`\`, `\\`, `*`, `\*`, `?`, `\?`, `[`, `\[`)
	return r.Replace(s)
}
