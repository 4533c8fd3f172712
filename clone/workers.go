package clone

import (
	"context"
	"errors"
	"io"
	"io/fs"
	"os"
	"sort"
	"sync"
	"sync/atomic"

	"golang.org/x/sync/errgroup"

	"github.com/pgfork/pgfork/internal/errs"
	"github.com/pgfork/pgfork/internal/fsutil"
)

var errEOF = io.EOF

var bufPool = sync.Pool{New: func() any { b := make([]byte, 1<<20); return &b }}

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
			if errs.OSKind(err) == errs.NoSpace {
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

	// The copiers take the next file by an atomic index, not from a
	// channel fed by another goroutine: a hand-over per file cost a
	// goroutine switch (often a thread wake-up) per file, which on a
	// cluster of thousands of small files was a visible share of the copy.
	var next atomic.Int64

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
			for {
				i := next.Add(1) - 1
				if i >= int64(len(files)) || gctx.Err() != nil {
					return nil
				}
				if err := c.copyFile(gctx, files[i], toSync, startSync); err != nil {
					return err
				}
			}
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
		if errs.OSKind(err) == errs.NoSpace { // delayed allocation can run out of space only now
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
	df, err := openFile(dp, os.O_WRONLY|os.O_CREATE|os.O_EXCL, createPerm(e))
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
		if errs.OSKind(err) == errs.NoSpace {
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
