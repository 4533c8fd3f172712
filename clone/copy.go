package clone

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"

	"github.com/pgfork/pgfork/internal/errs"
	"github.com/pgfork/pgfork/internal/flock"
	"github.com/pgfork/pgfork/internal/fsutil"
)

// Copy copies the directory tree src to dst, which must not exist (unless
// opts.Force, which replaces it atomically). The copy is built in a staging
// directory beside dst and renamed into place only when complete, so dst
// never holds a partial copy; on error or cancellation the staging directory
// is removed. Staging leftovers of earlier crashed copies are removed first.
// The source is never written.
func Copy(ctx context.Context, src, dst string, opts Options) (*Summary, error) {
	start := time.Now()
	if err := opts.normalize(); err != nil {
		return nil, err
	}
	srcAbs, dstAbs, dstExists, err := checkPaths(src, dst, opts.Force)
	if err != nil {
		return nil, err
	}
	_ = CleanStale(dstAbs)

	parent, base := filepath.Dir(dstAbs), filepath.Base(dstAbs)
	staging, err := os.MkdirTemp(parent, "."+base+stagingTag+fmt.Sprint(os.Getpid())+"-")
	if err != nil {
		return nil, errs.FromOS(err, parent, "cannot create a staging directory beside the destination")
	}
	release, err := flock.LockDir(staging)
	if err != nil {
		_ = os.Remove(staging)
		return nil, errs.Wrap(errs.Internal, err, "cannot lock the staging directory").WithPath(staging)
	}
	done := false
	defer func() {
		if !done {
			_ = fsutil.RemoveAll(staging)
		}
		release()
	}()

	// The staging directory stays root's and private while it is filled
	// (docs/SECURITY.md): its owner and mode are applied last, just before
	// the rename, and the name is checked to still be the directory built.
	opts.KeepRootPrivate = true
	c := newCopier(srcAbs, staging, dstAbs, opts)
	sum, err := c.run(ctx)
	if err == nil {
		err = c.rootMeta()
	}
	if err == nil {
		err = SameDir(staging, c.rootID)
	}
	if err != nil {
		_ = fsutil.RemoveAll(staging)
		return nil, c.finalError(ctx, err, parent)
	}

	if dstExists {
		err = replace(staging, dstAbs)
	} else {
		err = fsutil.RenameNoReplace(staging, dstAbs)
		if errors.Is(err, fs.ErrExist) {
			return nil, errs.New(errs.Exists, "destination appeared while copying").WithPath(dstAbs).
				WithHint("choose another destination, or ask for it to be replaced").WithCLI("pass --force to replace it")
		}
	}
	if err != nil {
		return nil, errs.FromOS(err, dstAbs, "cannot move the finished copy into place")
	}
	done = true
	if opts.Sync != SyncNone {
		if err := fsutil.SyncDir(parent); err != nil {
			return nil, errs.FromOS(err, parent, "cannot sync the destination's parent directory")
		}
	}
	sum.Elapsed = time.Since(start)
	return sum, nil
}

// CopyInto copies the contents of src into dst, an existing empty directory,
// without staging or renaming: for callers that stage the result themselves.
// dst's own mode, ownership and mtime are set from src. On error, whatever
// was created inside dst is removed.
func CopyInto(ctx context.Context, src, dst string, opts Options) (*Summary, error) {
	start := time.Now()
	if err := opts.normalize(); err != nil {
		return nil, err
	}
	srcAbs, err := checkSrc(src)
	if err != nil {
		return nil, err
	}
	dstAbs, err := filepath.Abs(dst)
	if err != nil {
		return nil, errs.Wrap(errs.Usage, err, "bad destination path").WithPath(dst)
	}
	ents, err := os.ReadDir(dstAbs)
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return nil, errs.New(errs.NotFound, "destination directory does not exist").WithPath(dstAbs).
				WithHint("create it first (CopyInto fills an existing empty directory)")
		}
		return nil, errs.FromOS(err, dstAbs, "cannot read the destination directory")
	}
	if len(ents) > 0 {
		return nil, errs.New(errs.Exists, "destination directory is not empty").WithPath(dstAbs).
			WithHint("empty it or choose another destination")
	}
	if err := checkNesting(srcAbs, dstAbs, false); err != nil {
		return nil, err
	}
	c := newCopier(srcAbs, dstAbs, dstAbs, opts)
	sum, err := c.run(ctx)
	if err != nil {
		emptyDir(dstAbs)
		return nil, c.finalError(ctx, err, dstAbs)
	}
	sum.Elapsed = time.Since(start)
	return sum, nil
}

type entry struct {
	rel          string // '/'-separated, "" for the root
	kind         kind
	mode         fs.FileMode
	size         int64
	mtime, atime time.Time
	sys          sysInfo
	target       string // symlink target
}

// pairInfo is what the probe learned about copying from one source
// filesystem to the destination.
type pairInfo struct {
	best   Method
	shares bool // the best method shares blocks (FIEMAP says so)
}

type copier struct {
	src, root, final string // root: the directory being filled
	opts             Options
	isRoot           bool
	dstDev           uint64
	rootID           os.FileInfo // the destination directory as it was when the copy began

	dirs, files, others []*entry
	totalBytes          int64
	needBytes           int64 // allocated bytes of the source files

	pairs map[uint64]*pairInfo

	files64, bytes64, shared64, vanished64 atomic.Int64
	methods                                sync.Map // Method -> *atomic.Int64
}

// testHookAfterDirs, when set (tests only), runs once the directories of a
// copy exist in its destination, before any file is copied.
var testHookAfterDirs func(root string)

func newCopier(src, root, final string, opts Options) *copier {
	return &copier{src: src, root: root, final: final, opts: opts, isRoot: os.Geteuid() == 0, pairs: map[uint64]*pairInfo{}}
}

func (c *copier) srcPath(e *entry) string { return filepath.Join(c.src, filepath.FromSlash(e.rel)) }

func (c *copier) dstPath(e *entry) string { return filepath.Join(c.root, filepath.FromSlash(e.rel)) }

func (c *copier) finalPath(e *entry) string {
	return filepath.Join(c.final, filepath.FromSlash(e.rel))
}

func (c *copier) run(ctx context.Context) (*Summary, error) {
	if err := c.walk(ctx); err != nil {
		return nil, err
	}
	dev, err := devOf(c.root)
	if err != nil {
		return nil, errs.FromOS(err, c.root, "cannot stat the destination")
	}
	c.dstDev = dev
	if c.rootID, err = os.Lstat(c.root); err != nil {
		return nil, errs.FromOS(err, c.root, "cannot stat the destination")
	}

	// Directories first (owner-writable until their contents are in), then
	// symlinks and fifos, then file contents in parallel.
	for _, d := range c.dirs[1:] {
		if err := os.Mkdir(c.dstPath(d), 0o700); err != nil {
			return nil, c.writeErr(err, d)
		}
	}
	for _, e := range c.others {
		if err := c.makeOther(e); err != nil {
			return nil, err
		}
	}
	if testHookAfterDirs != nil {
		testHookAfterDirs(c.root)
	}
	if err := c.probe(ctx); err != nil {
		return nil, err
	}

	stop := c.startProgress()
	err = c.copyFiles(ctx, c.setDirsMeta)
	stop()
	if err != nil {
		return nil, err
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	switch c.opts.Sync {
	case SyncFsync:
		if err := c.syncDirs(ctx); err != nil {
			return nil, err
		}
	case SyncFS:
		if err := fsutil.SyncFS(c.root); err != nil {
			return nil, errs.FromOS(err, c.final, "cannot sync the destination filesystem")
		}
	}

	sum := &Summary{
		Files:       c.files64.Load(),
		Dirs:        int64(len(c.dirs) - 1),
		Bytes:       c.bytes64.Load(),
		SharedBytes: c.shared64.Load(),
		Methods:     map[Method]int64{},
		Sync:        c.opts.Sync,
		Vanished:    c.vanished64.Load(),
	}
	for _, e := range c.others {
		if e.kind == kSymlink {
			sum.Symlinks++
		}
	}
	c.methods.Range(func(k, v any) bool {
		sum.Methods[k.(Method)] = v.(*atomic.Int64).Load()
		return true
	})
	return sum, nil
}

// startProgress calls OnProgress every 100 ms until the returned stop is
// called, which reports once more.
func (c *copier) startProgress() (stop func()) {
	if c.opts.OnProgress == nil {
		return func() {}
	}
	return StartProgress(c.report)
}

func (c *copier) report() {
	if c.opts.OnProgress == nil {
		return
	}
	c.opts.OnProgress(Progress{
		Files: c.files64.Load(), TotalFiles: int64(len(c.files)),
		Bytes: c.bytes64.Load(), TotalBytes: c.totalBytes,
	})
}
