package restore

import (
	"context"
	"errors"
	"fmt"
	"hash"
	"os"
	"path/filepath"
	"sort"
	"sync/atomic"
	"syscall"

	"golang.org/x/sync/errgroup"

	"github.com/pgfork/pgfork/clone"
	"github.com/pgfork/pgfork/internal/errs"
	"github.com/pgfork/pgfork/pgbackup"
)

// The writer: it executes a Plan in the staging directory with the copy
// engine's primitives (range clones or copy_file_range, progress, sync)
// and computes each file's manifest checksum on the way.

// testHookAfterFile, when set (tests only), runs after each file is made.
var testHookAfterFile func()

// testHookAfterMkdir, when set (tests only), runs after each directory of
// the result is created in staging, with the staging directory and the
// new directory's path relative to it: a test swaps things there as a
// hostile user would.
var testHookAfterMkdir func(staging, rel string)

type writer struct {
	plan *Plan
	opts Options
	in   *input  // the backups: every read goes through them
	outs outputs // the staging directories: every write goes through them
	rc   *clone.RangeCopier

	out []fileResult // by index in plan.Files

	doneFiles, doneBytes          atomic.Int64
	shared, ranged, plain, linked atomic.Int64
	calls                         atomic.Int64 // range copies and base clones made for rebuilt files
	noBaseClone                   atomic.Bool  // the filesystem refused a whole-file clone
}

// fileResult is what the manifest needs of a file written.
type fileResult struct {
	algo     string
	checksum []byte
}

func newWriter(p *Plan, in *input, outs outputs, opts Options) *writer {
	return &writer{plan: p, opts: opts, in: in, outs: outs,
		rc: &clone.RangeCopier{NoClone: opts.NoClone}, out: make([]fileResult, len(p.Files))}
}

// mkdirs creates the plan's directories in staging, with their modes and
// owner, then its links (a tablespace's pg_tblspc/OID).
func (w *writer) mkdirs() error {
	for _, d := range w.plan.Dirs {
		out, inner := w.outs.at(d.Rel)
		p := filepath.Join(out.st.Dir, inner)
		if err := out.root.Mkdir(inner, d.Mode); err != nil {
			return errs.FromOS(err, p, "cannot create a directory of the result")
		}
		if w.opts.Owner != nil {
			if err := out.root.Lchown(inner, w.opts.Owner.UID, w.opts.Owner.GID); err != nil {
				return errs.FromOS(err, p, "cannot give a directory of the result to its owner")
			}
		}
		if testHookAfterMkdir != nil {
			testHookAfterMkdir(out.st.Dir, filepath.ToSlash(inner))
		}
	}
	data := w.outs[0]
	for _, l := range w.plan.Links {
		rel := filepath.FromSlash(l.Rel)
		if err := data.root.Symlink(l.Link, rel); err != nil {
			return errs.FromOS(err, filepath.Join(data.st.Dir, rel), "cannot create the tablespace link")
		}
		if w.opts.Owner != nil {
			if err := data.root.Lchown(rel, w.opts.Owner.UID, w.opts.Owner.GID); err != nil {
				return errs.FromOS(err, filepath.Join(data.st.Dir, rel), "cannot give the tablespace link to its owner")
			}
		}
	}
	return nil
}

// files makes every file of the plan, opts.Jobs at a time, largest first.
func (w *writer) files(ctx context.Context) error {
	order := make([]int, len(w.plan.Files))
	for i := range order {
		order[i] = i
	}
	sort.SliceStable(order, func(a, b int) bool { return w.plan.Files[order[a]].Size > w.plan.Files[order[b]].Size })
	g, gctx := errgroup.WithContext(ctx)
	ch := make(chan int)
	g.Go(func() error {
		defer close(ch)
		for _, i := range order {
			select {
			case ch <- i:
			case <-gctx.Done():
				return gctx.Err()
			}
		}
		return nil
	})
	for range max(w.opts.Jobs, 1) {
		g.Go(func() error {
			buf := make([]byte, 1<<20)
			for i := range ch {
				if err := gctx.Err(); err != nil {
					return err
				}
				if err := w.file(gctx, i, buf); err != nil {
					return err
				}
				w.doneFiles.Add(1)
				if testHookAfterFile != nil {
					testHookAfterFile()
				}
			}
			return nil
		})
	}
	return g.Wait()
}

// progress is the writer's progress now.
func (w *writer) progress() clone.Progress {
	return clone.Progress{Files: w.doneFiles.Load(), TotalFiles: int64(len(w.plan.Files)),
		Bytes: w.doneBytes.Load(), TotalBytes: w.plan.Bytes}
}

// file makes plan.Files[i]: opens its sources, creates it, moves its
// runs (or the whole file), and computes its checksum.
func (w *writer) file(ctx context.Context, i int, buf []byte) error {
	f := w.plan.Files[i]
	srcs := make([]*os.File, len(f.Sources))
	defer func() {
		for _, s := range srcs {
			if s != nil {
				s.Close()
			}
		}
	}()
	for k, s := range f.Sources {
		sf, err := w.in.openSource(s.Backup, s.Path)
		if err != nil {
			return readErr(err, w.in.sourcePath(s.Backup, s.Path))
		}
		srcs[k] = sf
	}
	if w.opts.Link && f.Whole() {
		return w.link(f, i, srcs[0], buf)
	}
	out, inner := w.outs.at(f.Rel)
	df, err := out.root.OpenFile(inner, os.O_RDWR|os.O_CREATE|os.O_EXCL, f.Mode)
	if err != nil {
		return writeErr(err, filepath.Join(out.st.Dir, inner))
	}
	defer df.Close()
	if w.opts.Owner != nil {
		if err := df.Chown(w.opts.Owner.UID, w.opts.Owner.GID); err != nil {
			return errs.FromOS(err, df.Name(), "cannot give a file of the result to its owner")
		}
	}
	if f.Whole() {
		err = w.whole(f, i, srcs[0], df, buf)
	} else {
		err = w.rebuild(ctx, f, i, srcs, df, buf)
	}
	if err != nil {
		return err
	}
	if err := df.Close(); err != nil {
		return writeErr(err, df.Name())
	}
	return nil
}

// whole copies sf whole to df; the checksum comes from the manifest of
// the backup holding sf when it has a CRC32C one for a file of this size,
// else it is computed.
func (w *writer) whole(f *FilePlan, i int, sf, df *os.File, buf []byte) error {
	fi, err := sf.Stat()
	if err != nil {
		return errs.FromOS(err, sf.Name(), "cannot read the backup")
	}
	if fi.Size() != f.Size {
		return errs.New(errs.Usage, "the backup changed while it was restored (size %d, then %d)", f.Size, fi.Size()).WithPath(sf.Name()).
			WithHint("backups must not change while they are restored; restore again")
	}
	if w.opts.Prefetch && f.Size > 0 {
		clone.Prefetch(sf, 0, f.Size)
	}
	rc := w.rc
	if w.opts.WholeCopy {
		rc = &clone.RangeCopier{NoClone: true, NoCopyRange: true}
	}
	m, err := rc.CopyRange(df, sf, 0, 0, f.Size, buf)
	if err != nil {
		return writeErr(err, df.Name())
	}
	w.count(m, f.Size)
	w.doneBytes.Add(f.Size)
	return w.wholeChecksum(f, i, sf, buf)
}

// link makes f a hard link to its source, the backup's file itself
// (Options.Link). The link shares the file's owner: with an Owner, the
// backup's file must already be that user's (root never gives a backup's
// files away).
func (w *writer) link(f *FilePlan, i int, sf *os.File, buf []byte) error {
	fi, err := sf.Stat()
	if err != nil {
		return errs.FromOS(err, sf.Name(), "cannot read the backup")
	}
	if fi.Size() != f.Size {
		return errs.New(errs.Usage, "the backup changed while it was restored (size %d, then %d)", f.Size, fi.Size()).WithPath(sf.Name()).
			WithHint("backups must not change while they are restored; restore again")
	}
	if o := w.opts.Owner; o != nil {
		if st, ok := fi.Sys().(*syscall.Stat_t); ok && (int(st.Uid) != o.UID || int(st.Gid) != o.GID) {
			return errs.New(errs.Usage, "a hard-linked result shares its files with the backups, and this file belongs to %d:%d, not to the result's owner %d:%d",
				st.Uid, st.Gid, o.UID, o.GID).WithPath(sf.Name()).
				WithHint("give the backups to the result's owner first, or restore by copy or clone instead of hard links")
		}
	}
	out, inner := w.outs.at(f.Rel)
	dir, base := filepath.Split(inner)
	if dir == "" {
		dir = "."
	}
	d, err := out.root.Open(dir)
	if err != nil {
		return writeErr(err, filepath.Join(out.st.Dir, dir))
	}
	defer d.Close()
	if err := clone.LinkOpen(sf, d, base); err != nil {
		p := filepath.Join(out.st.Dir, inner)
		if errors.Is(err, syscall.EXDEV) {
			return errs.Wrap(errs.Unsupported, err, "hard links cannot cross filesystems: the backups and the destination are on different ones").WithPath(p).
				WithHint("restore onto the backups' filesystem, or by copy or clone instead of hard links")
		}
		return writeErr(err, p)
	}
	w.linked.Add(f.Size)
	w.doneBytes.Add(f.Size)
	return w.wholeChecksum(f, i, sf, buf)
}

// wholeChecksum sets the checksum of f, copied or linked whole from sf:
// the one the source backup's manifest has for it, when of the algorithm
// asked for and this size, else computed.
func (w *writer) wholeChecksum(f *FilePlan, i int, sf *os.File, buf []byte) error {
	if h := w.newChecksum(); h != nil && !f.WAL {
		algo := w.opts.checksums()
		mf := w.in.chain[f.Sources[0].Backup].Manifest.Files[f.Rel]
		if mf != nil && mf.Algorithm == algo && mf.Size == f.Size && len(mf.Checksum) == digestLen(algo) {
			w.out[i] = fileResult{algo, mf.Checksum}
		} else {
			if err := hashRange(h, sf, 0, f.Size, buf); err != nil {
				return err
			}
			w.out[i] = fileResult{algo, h.bytes()}
		}
	}
	return nil
}

// rebuild moves f's runs into df, each with one range copy (zero runs
// stay holes), and computes the checksum from the sources in output
// order, in a second goroutine: the reads overlap the copies (the sources
// are only read, so the order between the two does not matter).
func (w *writer) rebuild(ctx context.Context, f *FilePlan, i int, srcs []*os.File, df *os.File, buf []byte) error {
	if w.opts.Prefetch {
		for _, ru := range f.Runs {
			if ru.Source >= 0 {
				clone.Prefetch(srcs[ru.Source], ru.SrcOff, ru.Blocks*pgbackup.BlockSize)
			}
		}
	}
	h := w.newChecksum()
	if f.WAL {
		h = nil
	}
	hashed := make(chan error, 1)
	if h != nil {
		go func() { hashed <- hashRuns(ctx, h, f.Runs, srcs) }()
	} else {
		hashed <- nil
	}
	runs, err := w.cloneBase(f, srcs, df)
	if err == nil {
		err = w.moveRuns(ctx, df, runs, srcs, buf)
	}
	if herr := <-hashed; err == nil { // the hasher reads the sources, closed when we return
		err = herr
	}
	if err != nil {
		return err
	}
	fi, err := df.Stat()
	if err != nil {
		return errs.FromOS(err, df.Name(), "cannot read the restored file")
	}
	if fi.Size() != f.Size {
		if err := df.Truncate(f.Size); err != nil {
			return writeErr(err, df.Name())
		}
	}
	if h != nil {
		w.out[i] = fileResult{w.opts.checksums(), h.bytes()}
	}
	return nil
}

// cloneBase clones the whole full version of f (its base) into the empty
// df with one call, when the filesystem can, cut to the part the output
// keeps, and returns the runs still to move: those that come from
// elsewhere. A relation with a few changed blocks then takes one clone
// and a call per changed run, instead of a call for every run between
// them too. Elsewhere (no reflinks; measurements) it returns every run.
func (w *writer) cloneBase(f *FilePlan, srcs []*os.File, df *os.File) ([]BlockRun, error) {
	if f.Base < 0 || f.BaseBytes == 0 || w.opts.NoClone || w.opts.NoMerge || w.noBaseClone.Load() {
		return f.Runs, nil
	}
	if err := clone.CloneFile(df, srcs[f.Base]); err != nil {
		if clone.Unsupported(err) {
			w.noBaseClone.Store(true) // one refusal says it for this pair of filesystems
			return f.Runs, nil
		}
		return nil, writeErr(err, df.Name())
	}
	if err := df.Truncate(f.BaseBytes); err != nil {
		return nil, writeErr(err, df.Name())
	}
	w.calls.Add(1)
	rest := make([]BlockRun, 0, len(f.Runs))
	for _, r := range f.Runs {
		if f.FromBase(r) {
			n := r.Blocks * pgbackup.BlockSize
			w.shared.Add(n)
			w.doneBytes.Add(n)
			continue
		}
		rest = append(rest, r)
	}
	return rest, nil
}

// moveRuns copies each run of blocks to df with one range copy; zero runs
// are left as holes (the caller sets the size).
func (w *writer) moveRuns(ctx context.Context, df *os.File, runs []BlockRun, srcs []*os.File, buf []byte) error {
	for _, ru := range runs {
		if err := ctx.Err(); err != nil {
			return err
		}
		n := ru.Blocks * pgbackup.BlockSize
		if ru.Source >= 0 {
			m, err := w.rc.CopyRange(df, srcs[ru.Source], ru.DstOff, ru.SrcOff, n, buf)
			if err != nil {
				return writeErr(err, df.Name())
			}
			w.calls.Add(1)
			w.count(m, n)
		}
		w.doneBytes.Add(n)
	}
	return nil
}

var zeroBlock [pgbackup.BlockSize]byte

// hashRuns feeds h the output the runs make, in order.
func hashRuns(ctx context.Context, h hash.Hash, runs []BlockRun, srcs []*os.File) error {
	buf := make([]byte, 1<<20)
	for _, ru := range runs {
		if err := ctx.Err(); err != nil {
			return err
		}
		if ru.Source < 0 {
			for range ru.Blocks {
				h.Write(zeroBlock[:])
			}
			continue
		}
		if err := hashRange(h, srcs[ru.Source], ru.SrcOff, ru.Blocks*pgbackup.BlockSize, buf); err != nil {
			return err
		}
	}
	return nil
}

func (w *writer) count(m clone.Method, n int64) {
	switch m {
	case clone.Clone:
		w.shared.Add(n)
	case clone.CopyFileRange:
		w.ranged.Add(n)
	default:
		w.plain.Add(n)
	}
}

// newChecksum starts a file's manifest checksum; nil for none.
func (w *writer) newChecksum() *checksum {
	if w.opts.NoManifest {
		return nil
	}
	return newChecksum(w.opts.checksums())
}

func hashRange(h hash.Hash, f *os.File, off, n int64, buf []byte) error {
	for n > 0 {
		k := min(n, int64(len(buf)))
		got, err := f.ReadAt(buf[:k], off)
		if int64(got) < k {
			if err == nil {
				err = errors.New("short read")
			}
			return errs.FromOS(fmt.Errorf("read at %d: %w", off, err), f.Name(), "cannot read the backup")
		}
		h.Write(buf[:k])
		off += k
		n -= k
	}
	return nil
}

// writeErr classifies an error writing the result (a full disk is worded
// by finalErr, once the staging directory is gone).
func writeErr(err error, p string) error {
	return errs.FromOS(err, p, "cannot write the restored file")
}
