package clone

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sync"
	"time"

	"golang.org/x/sync/errgroup"

	"github.com/pgfork/pgfork/internal/errs"
	"github.com/pgfork/pgfork/internal/fsutil"
	"github.com/pgfork/pgfork/internal/units"
)

// The primitives below are the copy engine's for callers that build a tree
// of their own (restore rebuilds files block by block, then makes them
// durable, reports progress and words a full disk as a copy does).

// SyncTree makes a tree built in the staging directory root (its path is
// top, for messages and syncfs) durable before it is renamed into place:
// with SyncFsync every file in files (DefaultSyncJobs at once: filesystems
// commit concurrent fsyncs together), then every directory in dirs,
// deepest last in the list first, then the top; with SyncFS one syncfs of
// the filesystem; with SyncNone nothing. Paths are relative to root,
// '/'-separated, and opened through it (no symlink followed).
func SyncTree(ctx context.Context, root *os.Root, top string, files, dirs []string, mode SyncMode) error {
	switch mode {
	case SyncNone:
		return nil
	case SyncFS:
		if err := fsutil.SyncFS(top); err != nil {
			return errs.FromOS(err, top, "cannot sync the destination filesystem")
		}
		return nil
	}
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(DefaultSyncJobs)
	for _, rel := range files {
		g.Go(func() error {
			if err := gctx.Err(); err != nil {
				return err
			}
			return fsyncIn(root, top, rel)
		})
	}
	if err := g.Wait(); err != nil {
		return err
	}
	for i := len(dirs) - 1; i >= 0; i-- {
		if err := fsyncIn(root, top, dirs[i]); err != nil {
			return err
		}
	}
	return fsyncIn(root, top, ".")
}

// SyncExisting makes the tree at top, written earlier without syncing,
// durable as SyncTree does with SyncFsync: every regular file and
// directory under it, walked through an os.Root (no symlink followed, a
// symlink itself not synced). A server run with fsync=off leaves its data
// directory so; a stopped one kept as the source of later copies needs it.
func SyncExisting(ctx context.Context, top string) error {
	root, err := os.OpenRoot(top)
	if err != nil {
		return errs.FromOS(err, top, "cannot open to sync")
	}
	defer root.Close()
	var files, dirs []string
	err = fs.WalkDir(root.FS(), ".", func(rel string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		switch {
		case rel == ".":
		case d.IsDir():
			dirs = append(dirs, rel)
		case d.Type().IsRegular():
			files = append(files, rel)
		}
		return nil
	})
	if err != nil {
		return errs.FromOS(err, top, "cannot list the files to sync")
	}
	return SyncTree(ctx, root, top, files, dirs, SyncFsync)
}

func fsyncIn(root *os.Root, top, rel string) error {
	p := filepath.Join(top, filepath.FromSlash(rel))
	f, err := root.Open(filepath.FromSlash(rel))
	if err != nil {
		return errs.FromOS(err, p, "cannot open to sync")
	}
	defer f.Close()
	if err := f.Sync(); err != nil {
		return errs.FromOS(err, p, "cannot sync")
	}
	return nil
}

// StartProgress calls report every 100 ms until the returned stop is
// called, which reports once more; with a nil report it does nothing.
// report is called from one goroutine at a time.
func StartProgress(report func()) (stop func()) {
	if report == nil {
		return func() {}
	}
	quit := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		t := time.NewTicker(100 * time.Millisecond)
		defer t.Stop()
		for {
			select {
			case <-quit:
				report()
				return
			case <-t.C:
				report()
			}
		}
	}()
	var once sync.Once
	return func() { once.Do(func() { close(quit); wg.Wait() }) }
}

// IsNoSpace reports whether err is, or wraps, a full disk (ENOSPC or
// EDQUOT, or an error classified errs.NoSpace).
func IsNoSpace(err error) bool {
	var ns *noSpaceError
	return errors.As(err, &ns) || errs.OSKind(err) == errs.NoSpace || errs.IsNoSpace(err)
}

// NoSpaceError is what a user sees when a copy to final ran out of space
// on the filesystem of spaceDir, after the partial copy was removed (so
// the free space it reports is real): how much the copy needs (need; 0:
// unknown), how much is free, and where copies take no space.
func NoSpaceError(err error, spaceDir, final string, need int64) error {
	fsType, _ := FSType(spaceDir)
	msg := fmt.Sprintf("no space left on the %s filesystem of %s", fsType, spaceDir)
	avail, aerr := freeBytes(spaceDir)
	if need > 0 {
		msg += fmt.Sprintf(": the copy needs about %s", units.Bytes(need))
		if aerr == nil {
			msg += fmt.Sprintf(", %s are available", units.Bytes(avail))
		}
	}
	e := errs.Wrap(errs.NoSpace, err, "%s; the partial copy was removed", msg).WithPath(final)
	if need > avail && aerr == nil {
		return e.WithHint("free at least %s there, or copy to a filesystem that can clone (XFS with reflink, btrfs) where copies share blocks", units.Bytes(need-avail))
	}
	return e.WithHint("free some space there, or copy to a filesystem that can clone (XFS with reflink, btrfs) where copies share blocks")
}

// MayClone reports whether a filesystem of type fsType (as FSType names
// it) can clone files at all: xfs (made with reflink, mkfs.xfs's default
// since 2019), btrfs, bcachefs, zfs (2.2's block cloning), apfs. An
// estimate that writes nothing; Probe tells for sure.
func MayClone(fsType string) bool {
	switch fsType {
	case "xfs", "btrfs", "bcachefs", "zfs", "apfs":
		return true
	}
	return false
}
