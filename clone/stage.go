package clone

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"

	"github.com/pgfork/pgfork/internal/errs"
	"github.com/pgfork/pgfork/internal/flock"
	"github.com/pgfork/pgfork/internal/fsutil"
)

// Staging is a directory beside a destination that a caller fills itself
// and then renames into place with Commit, under the same naming and lock
// as Copy's staging: CleanStale (called by Stage and by every Copy to the
// same destination) removes it if its process dies before Commit.
type Staging struct {
	Dir     string // the staging directory, to be filled
	dst     string
	release func()
	done    bool
}

// Stage creates a staging directory for dst, which must not exist, after
// removing the leftovers of crashed earlier runs.
func Stage(dst string) (*Staging, error) {
	dstAbs, err := filepath.Abs(dst)
	if err != nil {
		return nil, errs.Wrap(errs.Usage, err, "bad destination path").WithPath(dst)
	}
	if _, err := os.Lstat(dstAbs); err == nil {
		return nil, errs.New(errs.Exists, "destination already exists").WithPath(dstAbs).
			WithHint("choose a new directory, or remove this one first")
	}
	_ = CleanStale(dstAbs)
	parent, base := filepath.Dir(dstAbs), filepath.Base(dstAbs)
	dir, err := os.MkdirTemp(parent, "."+base+stagingTag+fmt.Sprint(os.Getpid())+"-")
	if err != nil {
		return nil, errs.FromOS(err, parent, "cannot create a staging directory beside the destination")
	}
	release, err := flock.LockDir(dir)
	if err != nil {
		_ = os.Remove(dir)
		return nil, errs.Wrap(errs.Internal, err, "cannot lock the staging directory").WithPath(dir)
	}
	return &Staging{Dir: dir, dst: dstAbs, release: release}, nil
}

// Commit renames the staging directory to the destination (never
// replacing one that appeared meanwhile) and, when durable, fsyncs the
// parent directory so the rename survives a crash.
func (s *Staging) Commit(durable bool) error {
	if err := fsutil.RenameNoReplace(s.Dir, s.dst); err != nil {
		if errors.Is(err, fs.ErrExist) {
			return errs.New(errs.Exists, "destination appeared while it was being built").WithPath(s.dst).
				WithHint("choose another destination")
		}
		return errs.FromOS(err, s.dst, "cannot move the finished directory into place")
	}
	s.done = true
	s.release()
	if durable {
		if err := fsutil.SyncDir(filepath.Dir(s.dst)); err != nil {
			return errs.FromOS(err, filepath.Dir(s.dst), "cannot sync the destination's parent directory")
		}
	}
	return nil
}

// Abort removes the staging directory unless it was committed; safe to
// call more than once and after Commit (defer it).
func (s *Staging) Abort() {
	if s.done {
		return
	}
	s.done = true
	_ = fsutil.RemoveAll(s.Dir)
	s.release()
}

// Destination is the absolute final path.
func (s *Staging) Destination() string { return s.dst }
