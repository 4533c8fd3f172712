package clone

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"runtime"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sync/errgroup"

	"github.com/pgfork/pgfork/internal/errs"
	"github.com/pgfork/pgfork/internal/flock"
	"github.com/pgfork/pgfork/internal/fsutil"
	"github.com/pgfork/pgfork/internal/units"
)

// Options shape a copy. The zero value is a parallel, durable copy of
// everything by the best method available.
type Options struct {
	// Method is how file contents are copied; default Auto.
	Method Method
	// Jobs is the number of files copied at once; default runtime.NumCPU().
	Jobs int
	// Prefetch asks the kernel to read each source file ahead
	// (posix_fadvise WILLNEED).
	Prefetch bool
	// Sync is how the copy is made durable before it is renamed into
	// place; default SyncFsync (fsync every file written and every directory).
	Sync SyncMode
	// SyncJobs is the number of fsyncs in flight at once with SyncFsync;
	// default DefaultSyncJobs. An fsync waits on the device, not the CPU,
	// and filesystems commit concurrent fsyncs in one journal flush, so
	// many more of them than Jobs pay off.
	SyncJobs int
	// Filter decides what to copy; nil copies everything.
	Filter Filter
	// Force replaces an existing dst atomically.
	Force bool
	// Owner, when set, makes everything copied belong to this uid/gid.
	// Otherwise the source's ownership is kept when running as root.
	Owner *Owner
	// TolerateVanished skips files that disappear between listing and
	// copying (online copy of a running server) instead of failing.
	TolerateVanished bool
	// OnProgress is called periodically (about every 100 ms) while the copy
	// runs, and once at the end; nil for none. It is called from one
	// goroutine at a time.
	OnProgress func(Progress)
}

// DefaultSyncJobs is the default for Options.SyncJobs. Measured on the
// XFS reflink image with 1,000 freshly cloned files, all copied before the
// first fsync: 8 at a time ~0.2-0.45 s, 32 or 64 at a time about 0.15 s,
// close to no fsync at all; more than 64 gained nothing.
const DefaultSyncJobs = 64

// Methods lists the methods a user may ask for, best first.
var Methods = []Method{Auto, Clone, CopyFileRange, PlainCopy, Link}

// SyncModes lists the durability modes.
var SyncModes = []SyncMode{SyncNone, SyncFsync, SyncFS}

// ParseMethod returns the Method named s, or a Usage error.
func ParseMethod(s string) (Method, error) {
	for _, m := range Methods {
		if string(m) == s {
			return m, nil
		}
	}
	return "", errs.New(errs.Usage, "unknown copy method %q", s).WithHint("use one of: auto, clone, copy-file-range, copy, link")
}

// ParseSyncMode returns the SyncMode named s, or a Usage error.
func ParseSyncMode(s string) (SyncMode, error) {
	for _, m := range SyncModes {
		if string(m) == s {
			return m, nil
		}
	}
	return "", errs.New(errs.Usage, "unknown sync mode %q", s).WithHint("use one of: none, fsync, syncfs")
}

func (o *Options) normalize() error {
	if o.Method == "" {
		o.Method = Auto
	}
	if _, err := ParseMethod(string(o.Method)); err != nil {
		return err
	}
	if o.Sync == "" {
		o.Sync = SyncFsync
	}
	if _, err := ParseSyncMode(string(o.Sync)); err != nil {
		return err
	}
	if o.Jobs < 0 {
		return errs.New(errs.Usage, "jobs must be at least 1, not %d", o.Jobs).WithHint("use --jobs N with N >= 1, or leave it out for one per core")
	}
	if o.Jobs == 0 {
		o.Jobs = runtime.NumCPU()
	}
	if o.SyncJobs < 0 {
		return errs.New(errs.Usage, "sync jobs must be at least 1, not %d", o.SyncJobs).WithHint("leave it at 0 for the default")
	}
	if o.SyncJobs == 0 {
		o.SyncJobs = DefaultSyncJobs
	}
	if o.Method == Link && o.Owner != nil {
		return errs.New(errs.Usage, "--method link cannot change ownership: hard links share the source's inode").
			WithHint("use --method auto, or do not ask for another owner")
	}
	return nil
}

var errEOF = io.EOF

var bufPool = sync.Pool{New: func() any { b := make([]byte, 1<<20); return &b }}

const (
	stagingTag = ".pgfork-staging-"
	oldTag     = ".pgfork-old-"
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
			_ = removeAll(staging)
		}
		release()
	}()

	c := newCopier(srcAbs, staging, dstAbs, opts)
	sum, err := c.run(ctx)
	if err != nil {
		_ = removeAll(staging)
		return nil, c.finalError(ctx, err, parent)
	}

	if dstExists {
		err = replace(staging, dstAbs)
	} else {
		err = renameNoReplace(staging, dstAbs)
		if errors.Is(err, fs.ErrExist) {
			return nil, errs.New(errs.Exists, "destination appeared while copying").WithPath(dstAbs).
				WithHint("choose another destination, or pass --force to replace it")
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

// replace swaps the finished staging dir with the existing dst and removes
// the old one: atomically with RENAME_EXCHANGE, else by renaming it aside.
func replace(staging, dst string) error {
	ok, err := exchange(staging, dst)
	if err != nil {
		return err
	}
	if ok { // staging now holds the old dst
		return removeAll(staging)
	}
	aside := filepath.Join(filepath.Dir(dst), "."+filepath.Base(dst)+oldTag+fmt.Sprint(os.Getpid())+"-"+randTag())
	if err := os.Rename(dst, aside); err != nil {
		return err
	}
	if err := os.Rename(staging, dst); err != nil {
		_ = os.Rename(aside, dst)
		return err
	}
	return removeAll(aside)
}

func randTag() string { return fmt.Sprintf("%x", time.Now().UnixNano()&0xffffffff) }

// CleanStale removes what earlier copies to dst left behind when they
// crashed or were killed: staging directories (and replaced old copies)
// beside dst whose process is gone. Staging directories of copies still
// running are left alone.
func CleanStale(dst string) error {
	dst, err := filepath.Abs(dst)
	if err != nil {
		return err
	}
	parent, base := filepath.Dir(dst), filepath.Base(dst)
	ents, err := os.ReadDir(parent)
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return nil
		}
		return err
	}
	var all []error
	for _, e := range ents {
		name := e.Name()
		var rest string
		switch {
		case strings.HasPrefix(name, "."+base+stagingTag):
			rest = strings.TrimPrefix(name, "."+base+stagingTag)
		case strings.HasPrefix(name, "."+base+oldTag):
			rest = strings.TrimPrefix(name, "."+base+oldTag)
		default:
			continue
		}
		pidStr, _, ok := strings.Cut(rest, "-")
		var pid int
		if _, err := fmt.Sscanf(pidStr, "%d", &pid); !ok || err != nil || pid <= 0 {
			continue
		}
		p := filepath.Join(parent, name)
		if (pidAlive(pid) && flock.IsLockedByLiveProcess(p)) || (pid == os.Getpid() && strings.Contains(name, oldTag)) {
			continue
		}
		if err := removeAll(p); err != nil {
			all = append(all, err)
		}
	}
	return errors.Join(all...)
}

// checkSrc resolves src and checks it is a readable directory.
func checkSrc(src string) (string, error) {
	if src == "" {
		return "", errs.New(errs.Usage, "empty source path").WithHint("give the directory to copy")
	}
	abs, err := filepath.Abs(src)
	if err != nil {
		return "", errs.Wrap(errs.Usage, err, "bad source path").WithPath(src)
	}
	fi, err := os.Stat(abs)
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return "", errs.New(errs.NotFound, "source directory does not exist").WithPath(abs).
				WithHint("check the path")
		}
		return "", errs.FromOS(err, abs, "cannot read the source")
	}
	if !fi.IsDir() {
		return "", errs.New(errs.Usage, "source is not a directory").WithPath(abs).
			WithHint("give a directory; a single file is copied with cp")
	}
	return abs, nil
}

// checkPaths validates src and dst for Copy.
func checkPaths(src, dst string, force bool) (srcAbs, dstAbs string, dstExists bool, err error) {
	srcAbs, err = checkSrc(src)
	if err != nil {
		return
	}
	if dst == "" {
		return "", "", false, errs.New(errs.Usage, "empty destination path").WithHint("give the directory to create")
	}
	dstAbs, err = filepath.Abs(dst)
	if err != nil {
		return "", "", false, errs.Wrap(errs.Usage, err, "bad destination path").WithPath(dst)
	}
	if b := filepath.Base(dstAbs); b == "/" || b == "." || b == ".." {
		return "", "", false, errs.New(errs.Usage, "destination cannot be a filesystem root").WithPath(dstAbs).
			WithHint("name a new directory to create")
	}
	parent := filepath.Dir(dstAbs)
	pfi, perr := os.Stat(parent)
	if perr != nil {
		if errors.Is(perr, fs.ErrNotExist) {
			return "", "", false, errs.New(errs.NotFound, "the destination's parent directory does not exist").WithPath(parent).
				WithHint("create it first: mkdir -p %s", parent)
		}
		return "", "", false, errs.FromOS(perr, parent, "cannot use the destination's parent directory")
	}
	if !pfi.IsDir() {
		return "", "", false, errs.New(errs.Usage, "the destination's parent is not a directory").WithPath(parent).
			WithHint("choose a destination inside a directory")
	}
	if _, lerr := os.Lstat(dstAbs); lerr == nil {
		dstExists = true
		if !force {
			return "", "", false, errs.New(errs.Exists, "destination already exists").WithPath(dstAbs).
				WithHint("choose another destination, or pass --force to replace it")
		}
	}
	if err = checkNesting(srcAbs, dstAbs, force); err != nil {
		return
	}
	return srcAbs, dstAbs, dstExists, nil
}

// checkNesting refuses a dst inside src (the copy would copy itself and
// write the source) and, with force, a src inside dst (replacing dst would
// delete the source).
func checkNesting(srcAbs, dstAbs string, force bool) error {
	realSrc, err := filepath.EvalSymlinks(srcAbs)
	if err != nil {
		realSrc = srcAbs
	}
	realDst := dstAbs
	if p, err := filepath.EvalSymlinks(filepath.Dir(dstAbs)); err == nil {
		realDst = filepath.Join(p, filepath.Base(dstAbs))
	}
	if within(realDst, realSrc) {
		return errs.New(errs.Usage, "destination %s is inside the source %s", dstAbs, srcAbs).
			WithHint("copy to a directory outside the source")
	}
	if force && within(realSrc, realDst) {
		return errs.New(errs.Usage, "the source %s is inside the destination %s: replacing it would delete the source", srcAbs, dstAbs).
			WithHint("choose a destination that does not contain the source")
	}
	return nil
}

func within(p, dir string) bool {
	if p == dir {
		return true
	}
	rel, err := filepath.Rel(dir, p)
	return err == nil && rel != ".." && !strings.HasPrefix(rel, "../")
}

// removeAll removes path, first making read-only directories writable so
// that an unprivileged user can remove a copy of a read-only tree.
func removeAll(p string) error {
	err := os.RemoveAll(p)
	if err == nil || !errors.Is(err, fs.ErrPermission) {
		return err
	}
	_ = filepath.WalkDir(p, func(q string, d fs.DirEntry, err error) error {
		if err == nil && d.IsDir() {
			_ = os.Chmod(q, 0o700)
		}
		return nil
	})
	return os.RemoveAll(p)
}

func emptyDir(dir string) {
	ents, _ := os.ReadDir(dir)
	for _, e := range ents {
		_ = removeAll(filepath.Join(dir, e.Name()))
	}
}

// ---- the copier ----

type kind int

const (
	kDir kind = iota
	kFile
	kSymlink
	kFifo
)

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

	dirs, files, others []*entry
	totalBytes          int64
	needBytes           int64 // allocated bytes of the source files

	pairs map[uint64]*pairInfo

	files64, bytes64, shared64, vanished64 atomic.Int64
	methods                                sync.Map // Method -> *atomic.Int64
}

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
	c.report()
	return sum, nil
}

// setDirsMeta gives the copied directories their metadata, children before
// parents (so their mtimes stick), once every entry is in place.
func (c *copier) setDirsMeta() error {
	for i := len(c.dirs) - 1; i >= 0; i-- {
		d := c.dirs[i]
		if err := c.setMeta(nil, c.dstPath(d), d); err != nil {
			return err
		}
	}
	return nil
}

// walk lists the source tree, applying the filter.
func (c *copier) walk(ctx context.Context) error {
	fi, err := os.Lstat(c.src)
	if err != nil {
		return errs.FromOS(err, c.src, "cannot read the source")
	}
	if !fi.IsDir() { // src given as a symlink to a directory
		if fi, err = os.Stat(c.src); err != nil {
			return errs.FromOS(err, c.src, "cannot read the source")
		}
	}
	c.dirs = append(c.dirs, newEntry("", kDir, fi))
	return c.walkDir(ctx, "")
}

func newEntry(rel string, k kind, fi fs.FileInfo) *entry {
	si := statOf(fi)
	at := si.atime
	if at.IsZero() {
		at = fi.ModTime()
	}
	return &entry{rel: rel, kind: k, mode: fi.Mode(), size: fi.Size(), mtime: fi.ModTime(), atime: at, sys: si}
}

func (c *copier) walkDir(ctx context.Context, rel string) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	abs := filepath.Join(c.src, filepath.FromSlash(rel))
	ents, err := os.ReadDir(abs)
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) && c.opts.TolerateVanished && rel != "" {
			return nil
		}
		return errs.FromOS(err, abs, "cannot list the source directory")
	}
	for _, d := range ents {
		r := path.Join(rel, d.Name())
		act := Include
		if c.opts.Filter != nil {
			act = c.opts.Filter(r, d)
		}
		if act == Skip {
			continue
		}
		fi, err := d.Info()
		if err != nil {
			if errors.Is(err, fs.ErrNotExist) && c.opts.TolerateVanished {
				c.vanished64.Add(1)
				continue
			}
			return c.readErr(err, filepath.Join(abs, d.Name()))
		}
		switch m := fi.Mode(); {
		case m.IsDir():
			c.dirs = append(c.dirs, newEntry(r, kDir, fi))
			if act != EmptyDir {
				if err := c.walkDir(ctx, r); err != nil {
					return err
				}
			}
		case m.IsRegular():
			e := newEntry(r, kFile, fi)
			c.files = append(c.files, e)
			c.totalBytes += e.size
			c.needBytes += e.sys.blocks * 512
		case m&fs.ModeSymlink != 0:
			e := newEntry(r, kSymlink, fi)
			t, err := os.Readlink(filepath.Join(abs, d.Name()))
			if err != nil {
				if errors.Is(err, fs.ErrNotExist) && c.opts.TolerateVanished {
					c.vanished64.Add(1)
					continue
				}
				return c.readErr(err, filepath.Join(abs, d.Name()))
			}
			e.target = t
			c.others = append(c.others, e)
		case m&fs.ModeNamedPipe != 0:
			c.others = append(c.others, newEntry(r, kFifo, fi))
		case m&fs.ModeSocket != 0:
			// A socket is meaningless without its server; leave it out.
		default:
			return errs.New(errs.Unsupported, "cannot copy special file (%s)", m.Type()).
				WithPath(filepath.Join(abs, d.Name())).
				WithHint("remove it from the source or skip it with a filter")
		}
	}
	return nil
}

func (c *copier) readErr(err error, p string) error {
	if errors.Is(err, fs.ErrNotExist) {
		return errs.Wrap(errs.NotFound, err, "source file vanished during the copy").WithPath(p).
			WithHint("stop whatever is changing the source, or copy a running server with pgfork's online clone")
	}
	return errs.FromOS(err, p, "cannot read")
}

func (c *copier) writeErr(err error, e *entry) error {
	return errs.FromOS(err, c.finalPath(e), "cannot write")
}

func (c *copier) makeOther(e *entry) error {
	p := c.dstPath(e)
	switch e.kind {
	case kSymlink:
		if err := os.Symlink(e.target, p); err != nil {
			return c.writeErr(err, e)
		}
	case kFifo:
		if err := mkfifo(p, e.mode); err != nil {
			return c.writeErr(err, e)
		}
	}
	return c.setMeta(nil, p, e)
}

// setMeta gives the copy at p the ownership, mode and times of e. f, when
// not nil, is p opened for writing.
func (c *copier) setMeta(f *os.File, p string, e *entry) error {
	uid, gid, chown := -1, -1, false
	if c.opts.Owner != nil {
		uid, gid, chown = c.opts.Owner.UID, c.opts.Owner.GID, true
	} else if c.isRoot && e.sys.ok {
		uid, gid, chown = e.sys.uid, e.sys.gid, true
	}
	if chown {
		var err error
		if f != nil {
			err = f.Chown(uid, gid)
		} else {
			err = os.Lchown(p, uid, gid)
		}
		if err != nil {
			return c.writeErr(err, e)
		}
	}
	if e.kind != kSymlink {
		mode := e.mode & (fs.ModePerm | fs.ModeSetuid | fs.ModeSetgid | fs.ModeSticky)
		var err error
		if f != nil {
			err = f.Chmod(mode)
		} else {
			err = os.Chmod(p, mode)
		}
		if err != nil {
			return c.writeErr(err, e)
		}
	}
	if err := lutimes(p, e.atime, e.mtime); err != nil {
		return c.writeErr(err, e)
	}
	return nil
}

// probe decides, once per source filesystem, which method auto uses, with
// a real file of that filesystem copied into the destination; for a forced
// clone or copy-file-range it checks that the method works at all.
func (c *copier) probe(ctx context.Context) error {
	m := c.opts.Method
	if m == PlainCopy {
		return nil
	}
	// The smallest non-empty file of each source filesystem.
	pick := map[uint64]*entry{}
	for _, f := range c.files {
		if m == Link {
			if f.sys.ok && f.sys.dev != c.dstDev {
				return c.unsupported(Link, f, errors.New("hard links cannot cross filesystems"))
			}
			continue
		}
		if f.size == 0 {
			continue
		}
		if p, ok := pick[f.sys.dev]; !ok || f.size < p.size {
			pick[f.sys.dev] = f
		}
	}
	for dev, f := range pick {
		pi, err := probeFile(ctx, c.srcPath(f), c.root)
		if err != nil {
			if errors.Is(err, fs.ErrNotExist) && c.opts.TolerateVanished {
				// Probe again with the next file when it is reached.
				continue
			}
			if isNoSpace(err) {
				return &noSpaceError{rel: f.rel, err: err}
			}
			if errors.Is(err, fs.ErrNotExist) {
				return c.readErr(err, c.srcPath(f))
			}
			return errs.FromOS(err, c.srcPath(f), "cannot probe copy methods with this file")
		}
		info := &pairInfo{best: pi.Best, shares: pi.SharesBlocks}
		if m == Clone || m == CopyFileRange {
			if !pi.works(m) {
				return c.unsupported(m, f, errors.New(pi.Errors[m]))
			}
			info.best = m
		}
		c.pairs[dev] = info
	}
	return nil
}

func (c *copier) unsupported(m Method, f *entry, cause error) error {
	dstFS, _ := FSType(c.root)
	srcFS, _ := FSType(c.src)
	what := map[Method]string{Clone: "clone (reflink)", CopyFileRange: "copy_file_range", Link: "hard-link"}[m]
	var msg string
	if srcFS == dstFS && f.sys.dev == c.dstDev {
		msg = fmt.Sprintf("the %s filesystem at %s cannot %s files", dstFS, filepath.Dir(c.final), what)
	} else {
		msg = fmt.Sprintf("cannot %s files from the %s filesystem of %s to the %s filesystem of %s", what, srcFS, c.src, dstFS, filepath.Dir(c.final))
	}
	return errs.Wrap(errs.Unsupported, cause, "%s (tried on %s)", msg, f.rel).
		WithHint("use --method auto, which picks the best method that works here")
}

// copyFiles copies the file contents with opts.Jobs workers. With
// SyncFsync, each worker hands the finished file, still open, to
// opts.SyncJobs syncers that fsync and close it. The syncers start when
// every file is copied, or earlier when maxPendingSyncs files wait (so the
// number of open files stays bounded): one journal commit then covers the
// metadata of many files, and the device sees many fsyncs at once, which
// a journaling filesystem commits together. Measured on the XFS reflink
// image: 1,000 clones fsynced one by one after each copy took ~1.3 s; all
// copied first, then 64 at a time, they take about as long as the copy
// (see bench/results/copy.md). Each file is fsynced through the
// descriptor that wrote it, so a write-back error cannot be lost between a
// close and a reopen. afterCopy runs once every file is copied (before the
// syncers start, unless they had to start early). copyFiles returns only
// when every file is closed; its error is the first failure of a copy, of
// afterCopy or of an fsync.
func (c *copier) copyFiles(ctx context.Context, afterCopy func() error) error {
	files := append([]*entry(nil), c.files...)
	sort.SliceStable(files, func(i, j int) bool { return files[i].size > files[j].size })
	g, gctx := errgroup.WithContext(ctx)

	work := make(chan *entry)
	g.Go(func() error {
		defer close(work)
		for _, f := range files {
			select {
			case work <- f:
			case <-gctx.Done():
				return nil
			}
		}
		return nil
	})

	var toSync chan syncItem
	start := make(chan struct{})
	var startOnce sync.Once
	startSync := func() { startOnce.Do(func() { close(start) }) }
	if c.opts.Sync == SyncFsync {
		toSync = make(chan syncItem, max(min(len(files), maxPendingSyncs()), c.opts.SyncJobs))
	}
	var copiers sync.WaitGroup
	for range min(c.opts.Jobs, max(len(files), 1)) {
		copiers.Add(1)
		g.Go(func() error {
			defer copiers.Done()
			for f := range work {
				if err := c.copyFile(gctx, f, toSync, startSync); err != nil {
					return err
				}
			}
			return nil
		})
	}
	if toSync != nil {
		g.Go(func() error {
			defer close(toSync)
			copiers.Wait()
			if gctx.Err() == nil {
				// Before the syncers start, so that the journal commit of
				// the files' fsyncs carries the directories' metadata too.
				if err := afterCopy(); err != nil {
					return err
				}
			}
			startSync()
			return nil
		})
		for range c.opts.SyncJobs {
			g.Go(func() error {
				select {
				case <-start:
				case <-gctx.Done():
					return nil
				}
				for it := range toSync {
					if err := c.syncFile(it); err != nil {
						return err
					}
				}
				return nil
			})
		}
	}
	err := g.Wait()
	if toSync != nil {
		for it := range toSync { // left over after a failure: close unsynced
			_ = it.f.Close()
		}
	}
	if err != nil {
		return err
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	if toSync == nil {
		return afterCopy()
	}
	return nil
}

// syncItem is a copied file, still open, waiting for its fsync.
type syncItem struct {
	e *entry
	f *os.File
}

// syncFile fsyncs and closes a copied file.
func (c *copier) syncFile(it syncItem) error {
	err := it.f.Sync()
	if cerr := it.f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		if isNoSpace(err) { // delayed allocation can run out of space only now
			return &noSpaceError{rel: it.e.rel, err: err}
		}
		return c.writeErr(err, it.e)
	}
	return nil
}

func (c *copier) countMethod(m Method) {
	v, _ := c.methods.LoadOrStore(m, new(atomic.Int64))
	v.(*atomic.Int64).Add(1)
}

// copyFile copies one file. With toSync not nil, the open destination is
// handed over to the syncers, which close it; otherwise it is closed here.
func (c *copier) copyFile(ctx context.Context, e *entry, toSync chan<- syncItem, startSync func()) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	sp, dp := c.srcPath(e), c.dstPath(e)
	if c.opts.Method == Link {
		if err := os.Link(sp, dp); err != nil {
			if errors.Is(err, fs.ErrNotExist) && c.opts.TolerateVanished {
				c.vanished64.Add(1)
				return nil
			}
			if fallbackable(err) {
				return c.unsupported(Link, e, err)
			}
			return c.writeErr(err, e)
		}
		c.countMethod(Link)
		c.files64.Add(1)
		c.bytes64.Add(e.size)
		return nil
	}
	sf, err := openFile(sp, os.O_RDONLY, 0)
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) && c.opts.TolerateVanished {
			c.vanished64.Add(1)
			return nil
		}
		return c.readErr(err, sp)
	}
	defer sf.Close()
	fi, err := sf.Stat()
	if err != nil {
		return c.readErr(err, sp)
	}
	size := fi.Size()
	if c.opts.Prefetch && size > 0 {
		prefetch(sf)
	}
	df, err := openFile(dp, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return c.writeErr(err, e)
	}
	handedOver := false
	defer func() {
		if !handedOver {
			_ = df.Close()
		}
	}()

	m, err := c.copyData(ctx, e, sf, df, size)
	if err != nil {
		return err
	}
	if err := c.setMeta(df, dp, e); err != nil {
		return err
	}
	switch info := c.pairs[e.sys.dev]; {
	case m == Clone && e.sys.ok:
		// A fresh clone shares every allocated block with its source.
		c.shared64.Add(min(e.sys.blocks*512, size))
	case info != nil && info.shares && m != PlainCopy && size > 0:
		if n, err := sharedBytesFd(int(df.Fd())); err == nil {
			c.shared64.Add(n)
		}
	}
	c.countMethod(m)
	c.files64.Add(1)
	if toSync != nil {
		it := syncItem{e: e, f: df}
		select {
		case toSync <- it:
			handedOver = true
			return nil
		default:
			startSync()
		}
		select {
		case toSync <- it:
			handedOver = true
			return nil
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	handedOver = true
	if err := df.Close(); err != nil {
		return c.writeErr(err, e)
	}
	return nil
}

// copyData copies the contents by the chosen method, falling back per file
// (auto only) when the kernel says the method cannot serve this pair.
func (c *copier) copyData(ctx context.Context, e *entry, sf, df *os.File, size int64) (Method, error) {
	chain := []Method{c.opts.Method}
	if c.opts.Method == Auto {
		best := PlainCopy
		if info := c.pairs[e.sys.dev]; info != nil {
			best = info.best
		}
		switch best {
		case Clone:
			chain = []Method{Clone, CopyFileRange, PlainCopy}
		case CopyFileRange:
			chain = []Method{CopyFileRange, PlainCopy}
		default:
			chain = []Method{PlainCopy}
		}
	}
	if size == 0 {
		return chain[0], nil
	}
	// With fsync to come, start writing back what was written every
	// writebackEvery bytes, so the device works while the copy goes on and
	// the fsync finds little left to do. (A clone writes no data.)
	writeback := c.opts.Sync == SyncFsync
	for i, m := range chain {
		var done, pending int64
		err := copyWith(ctx, m, sf, df, size, func(n int64) {
			done += n
			c.bytes64.Add(n)
			if writeback && m != Clone {
				if pending += n; pending >= writebackEvery {
					startWriteback(df)
					pending = 0
				}
			}
		})
		if err == nil && writeback && m != Clone && done > 0 {
			startWriteback(df)
		}
		if err == nil {
			c.bytes64.Add(size - done) // holes count as done
			return m, nil
		}
		c.bytes64.Add(-done)
		if ctx.Err() != nil {
			return m, ctx.Err()
		}
		if fallbackable(err) {
			if c.opts.Method != Auto {
				return m, c.unsupported(m, e, err)
			}
			if i < len(chain)-1 {
				if terr := df.Truncate(0); terr != nil {
					return m, c.writeErr(terr, e)
				}
				continue
			}
		}
		if isNoSpace(err) {
			return m, &noSpaceError{rel: e.rel, err: err}
		}
		if errors.Is(err, fs.ErrPermission) {
			return m, errs.FromOS(err, c.finalPath(e), "cannot copy %s", c.srcPath(e))
		}
		return m, errs.Wrap(errs.Internal, err, "copying %s (method %s)", c.srcPath(e), m).WithPath(c.finalPath(e))
	}
	return PlainCopy, nil
}

// writebackEvery is how many bytes a copy writes between two requests to
// start their writeback (see startWriteback).
const writebackEvery = 16 << 20

type noSpaceError struct {
	rel string
	err error
}

func (e *noSpaceError) Error() string { return e.rel + ": " + e.err.Error() }
func (e *noSpaceError) Unwrap() error { return e.err }

// finalError turns a failed run's error into what the user sees, after the
// partial copy has been removed (so the free space reported is real).
func (c *copier) finalError(ctx context.Context, err error, spaceDir string) error {
	if ctx.Err() != nil && (errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) || errs.KindOf(err) == errs.Internal) {
		return errs.Wrap(errs.Interrupted, ctx.Err(), "copy to %s interrupted; nothing was left behind", c.final).
			WithHint("run it again")
	}
	var ns *noSpaceError
	if errors.As(err, &ns) || isNoSpace(err) {
		fsType, _ := FSType(spaceDir)
		avail, aerr := freeBytes(spaceDir)
		need := c.needBytes
		msg := fmt.Sprintf("no space left on the %s filesystem of %s: the copy needs about %s",
			fsType, spaceDir, units.Bytes(need))
		if aerr == nil {
			msg += fmt.Sprintf(", %s are available", units.Bytes(avail))
		}
		e := errs.Wrap(errs.NoSpace, err, "%s; the partial copy was removed", msg).WithPath(c.final)
		return e.WithHint("free at least %s there, or copy to a filesystem that can clone (XFS with reflink, btrfs) where copies share blocks", units.Bytes(need-avail))
	}
	return err
}

// startProgress calls OnProgress every 100 ms until the returned stop is
// called, which reports once more.
func (c *copier) startProgress() (stop func()) {
	if c.opts.OnProgress == nil {
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
				return
			case <-t.C:
				c.report()
			}
		}
	}()
	return func() { close(quit); wg.Wait() }
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

// syncDirs fsyncs every directory of the copy, opts.SyncJobs at a time:
// their entries (files, symlinks, fifos, subdirectories) and metadata.
func (c *copier) syncDirs(ctx context.Context) error {
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(c.opts.SyncJobs)
	for _, d := range c.dirs {
		if gctx.Err() != nil {
			break
		}
		g.Go(func() error {
			if err := fsutil.SyncDir(c.dstPath(d)); err != nil {
				return c.writeErr(err, d)
			}
			return nil
		})
	}
	return g.Wait()
}
