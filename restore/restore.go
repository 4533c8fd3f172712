// Package restore rebuilds a data directory from a chain of plain-format
// base backups (a full backup, then PostgreSQL 17+ incrementals) on the
// copy engine: files that are whole in the newest backup holding them are
// cloned; INCREMENTAL.* files are rebuilt with pg_combinebackup's rules,
// moving each run of consecutive blocks that come from one source file
// with one FICLONERANGE (or copy_file_range) call, so that on XFS the
// result shares its blocks with the backups. The result gets a
// backup_manifest that pg_verifybackup accepts, is built in staging and
// renamed into place; it can then be started as a branch (Start).
package restore

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"hash"
	"hash/crc32"
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

	"github.com/pgfork/pgfork/clone"
	"github.com/pgfork/pgfork/internal/errs"
	"github.com/pgfork/pgfork/internal/safefs"
	"github.com/pgfork/pgfork/pgbackup"
)

// Options shape a restore. The zero value is a parallel, durable restore
// with CRC32C manifest checksums and no prefetch.
type Options struct {
	// Jobs is the number of files worked on at once; default one per core.
	Jobs int
	// Prefetch asks the kernel to read each source range ahead
	// (posix_fadvise WILLNEED) before it is copied.
	Prefetch bool
	// Sync is how the result is made durable before it is renamed into
	// place; default clone.SyncFsync.
	Sync clone.SyncMode
	// Owner, when set, makes everything written belong to this uid/gid.
	Owner *clone.Owner
	// NoChecksums writes the manifest without file checksums (sizes only,
	// as pg_combinebackup --manifest-checksums=NONE); otherwise CRC32C,
	// pg_combinebackup's default, computed over the output.
	NoChecksums bool

	// For measurements (hidden flags of pgfork restore, bench scenario
	// restore): NoMerge moves rebuilt files one block per call;
	// WholeCopy copies whole files with read/write instead of cloning
	// them; NoClone never reflinks anything.
	NoMerge, WholeCopy, NoClone bool

	// OnProgress is called about every 100 ms and once at the end; nil
	// for none.
	OnProgress func(clone.Progress)
}

// Phase is one timed step of a restore.
type Phase struct {
	Name    string        `json:"name"`
	Elapsed time.Duration `json:"elapsed_ns"`
}

// Summary describes a finished restore.
type Summary struct {
	Backups  []string `json:"backups"`
	Dst      string   `json:"dst"`
	Major    int      `json:"major"`
	SystemID uint64   `json:"system_identifier,string"`

	Files        int64 `json:"files"`
	Dirs         int64 `json:"dirs"`
	FilesWhole   int64 `json:"files_whole"`   // copied whole from the newest backup holding them
	FilesOlder   int64 `json:"files_older"`   // of those, unchanged since an older backup (INCREMENTAL with no blocks)
	FilesRebuilt int64 `json:"files_rebuilt"` // rebuilt from blocks of several backups
	// BlocksBySource counts the blocks of rebuilt files by the backup they
	// came from (index as in Backups); ZeroBlocks were in no backup and
	// are zeros (holes), as pg_combinebackup's zero-fill.
	BlocksBySource []int64 `json:"blocks_by_source"`
	ZeroBlocks     int64   `json:"zero_blocks"`
	// Calls is the number of range copies made for rebuilt files (one per
	// run of consecutive blocks from one source file).
	Calls int64 `json:"calls"`

	Bytes       int64 `json:"bytes"`        // total size of the result
	SharedBytes int64 `json:"shared_bytes"` // moved by reflink: shared with the backups
	RangeBytes  int64 `json:"range_bytes"`  // moved by copy_file_range (shared where the filesystem does it)
	CopiedBytes int64 `json:"copied_bytes"` // read and written

	Checksums string         `json:"checksums"`
	Sync      clone.SyncMode `json:"sync"`
	Phases    []Phase        `json:"phases"`
	Elapsed   time.Duration  `json:"elapsed_ns"`
}

// Restore checks the chain dirs (full backup first) and rebuilds the data
// directory it describes at dst, which must not exist. Nothing is written
// before the chain is checked; the backups are only read; on any error
// (or cancellation) dst does not exist afterwards.
func Restore(ctx context.Context, dirs []string, dst string, opts Options) (*Summary, error) {
	start := time.Now()
	if opts.Jobs <= 0 {
		opts.Jobs = runtime.NumCPU()
	}
	if opts.Sync == "" {
		opts.Sync = clone.SyncFsync
	}
	r := &restorer{opts: opts, rc: &clone.RangeCopier{NoClone: opts.NoClone}}
	r.sum.Sync = opts.Sync
	r.sum.Checksums = "CRC32C"
	if opts.NoChecksums {
		r.sum.Checksums = "NONE"
	}
	phase := func(name string, t0 time.Time) {
		r.sum.Phases = append(r.sum.Phases, Phase{Name: name, Elapsed: time.Since(t0)})
	}

	t0 := time.Now()
	chain, err := pgbackup.OpenChain(dirs)
	if err != nil {
		return nil, err
	}
	r.chain = chain
	for _, b := range chain {
		r.sum.Backups = append(r.sum.Backups, b.Dir)
		if insideDir(dst, b.Dir) {
			return nil, errs.New(errs.Usage, "the destination is inside a backup").WithPath(dst).
				WithHint("restore to a directory outside the backups (they are only read)")
		}
		d, err := safefs.OpenDir(b.Dir)
		if err != nil {
			return nil, errs.FromOS(err, b.Dir, "cannot read the backup")
		}
		defer d.Close()
		r.src = append(r.src, d)
	}
	if err := r.checkManifests(); err != nil {
		return nil, err
	}
	r.sum.Major, r.sum.SystemID = chain.Newest().Major, chain.Newest().SystemID
	r.sum.BlocksBySource = make([]int64, len(chain))
	if err := checkTablespaces(chain.Newest().Dir); err != nil {
		return nil, err
	}
	phase("check", t0)

	t0 = time.Now()
	st, err := clone.Stage(dst)
	if err != nil {
		return nil, err
	}
	defer st.Abort()
	r.root = st.Dir
	if r.sd, err = os.OpenRoot(st.Dir); err != nil {
		return nil, errs.FromOS(err, st.Dir, "cannot open the staging directory")
	}
	defer r.sd.Close()
	r.sum.Dst = st.Destination()
	if err := r.plan(); err != nil {
		return nil, err
	}
	phase("plan", t0)

	t0 = time.Now()
	stop := r.startProgress()
	err = r.run(ctx)
	stop()
	if err != nil {
		return nil, r.finalErr(ctx, err)
	}
	phase("files", t0)

	t0 = time.Now()
	if err := r.writeLabelAndManifest(); err != nil {
		return nil, r.finalErr(ctx, err)
	}
	phase("manifest", t0)

	t0 = time.Now()
	if err := r.syncAll(ctx); err != nil {
		return nil, r.finalErr(ctx, err)
	}
	phase("sync", t0)

	t0 = time.Now()
	if err := r.handOver(); err != nil {
		return nil, err
	}
	if err := st.Commit(opts.Sync != clone.SyncNone); err != nil {
		return nil, err
	}
	phase("rename", t0)
	r.sum.Elapsed = time.Since(start)
	return &r.sum, nil
}

// insideDir reports whether the directory p would be created in is dir or
// below it, whatever the spelling: p's parent is resolved (symlinks,
// "..") and each of its ancestors compared with dir by device and inode,
// so a symlinked path or a bind mount of the backup is caught too.
func insideDir(p, dir string) bool {
	abs, err := filepath.Abs(p)
	if err != nil {
		return false
	}
	want, err := os.Stat(dir)
	if err != nil {
		return false
	}
	parent := filepath.Dir(abs)
	if real, err := filepath.EvalSymlinks(parent); err == nil {
		parent = real
	}
	for q := parent; ; q = filepath.Dir(q) {
		if fi, err := os.Stat(q); err == nil && os.SameFile(fi, want) {
			return true
		}
		if q == filepath.Dir(q) {
			return false
		}
	}
}

// checkTablespaces refuses tablespaces outside the data directory (they
// would need a mapping, as pg_combinebackup -T); in-place ones are fine.
func checkTablespaces(dir string) error {
	ents, err := os.ReadDir(filepath.Join(dir, "pg_tblspc"))
	if err != nil {
		return nil
	}
	for _, e := range ents {
		if e.Type()&fs.ModeSymlink != 0 {
			return errs.New(errs.Unsupported, "the backup has a tablespace outside the data directory (pg_tblspc/%s)", e.Name()).
				WithPath(dir).WithHint("pgfork restore handles in-place tablespaces only; use pg_combinebackup --tablespace-mapping for this chain")
		}
	}
	return nil
}

type jobKind int

const (
	jobWhole jobKind = iota
	jobRebuild
)

type job struct {
	rel  string // output path relative to the data directory, '/'-separated
	kind jobKind
	src  string // jobWhole: file to copy; jobRebuild: INCREMENTAL file of the newest backup ('/'-separated, relative to that backup)
	mode fs.FileMode
	size int64 // expected output size (progress)
	wal  bool  // under pg_wal: in backup_manifest without a checksum, as pg_combinebackup

	// results
	outSize  int64
	algo     string
	checksum []byte
}

// testHookAfterFile, when set (tests only), runs after each file is made.
var testHookAfterFile func()

// testHookAfterMkdir, when set (tests only), runs after each directory of
// the result is created in staging, with the staging directory and the
// new directory's path relative to it: a test swaps things there as a
// hostile user would.
var testHookAfterMkdir func(staging, rel string)

type restorer struct {
	opts  Options
	chain pgbackup.Chain
	root  string        // staging dir (its path: for messages and syncfs only)
	sd    *os.Root      // staging dir: every write goes through it, never by path
	src   []*safefs.Dir // the backups, in chain order: every read goes through them
	// rootMode is the mode the result's top directory gets when it is
	// handed over; until then staging stays root's own, 0700.
	rootMode fs.FileMode
	rc       *clone.RangeCopier

	jobs  []*job
	dirs  []string // rel dirs created, for fsync
	total int64

	sum          Summary
	doneFiles    atomic.Int64
	doneBytes    atomic.Int64
	shared       atomic.Int64
	ranged       atomic.Int64
	copied       atomic.Int64
	calls        atomic.Int64
	zeroBlocks   atomic.Int64
	blocksBySrc  []atomic.Int64
	whole, older atomic.Int64
	rebuilt      atomic.Int64
}

// plan walks the newest backup, creates its directories in staging and
// lists the files to make.
func (r *restorer) plan() error {
	newest := r.chain.Newest().Dir
	r.blocksBySrc = make([]atomic.Int64, len(r.chain))
	rootInfo, err := os.Stat(newest)
	if err != nil {
		return err
	}
	// The top directory stays root's own and private until handOver: no
	// other user can reach anything below it while it is built.
	r.rootMode = rootInfo.Mode().Perm()
	newestSrc := r.src[len(r.src)-1]
	return filepath.WalkDir(newest, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return errs.Wrap(errs.Internal, err, "cannot read the backup").WithPath(p)
		}
		rel, _ := filepath.Rel(newest, p)
		rel = filepath.ToSlash(rel)
		if rel == "." {
			return nil
		}
		dir := filepath.ToSlash(filepath.Dir(rel))
		if d.IsDir() {
			fi, err := d.Info()
			if err != nil {
				return err
			}
			out := filepath.FromSlash(rel)
			if err := r.sd.Mkdir(out, fi.Mode().Perm()); err != nil {
				return errs.FromOS(err, filepath.Join(r.root, out), "cannot create a directory of the result")
			}
			if err := r.chown(out); err != nil {
				return errs.FromOS(err, filepath.Join(r.root, out), "cannot give a directory of the result to its owner")
			}
			if testHookAfterMkdir != nil {
				testHookAfterMkdir(r.root, rel)
			}
			r.dirs = append(r.dirs, rel)
			r.sum.Dirs++
			return nil
		}
		if !d.Type().IsRegular() {
			// pg_combinebackup skips these; pgfork refuses them, as a backup
			// pg_basebackup wrote has none (tablespaces are refused above)
			// and restore must not hide what it did not rebuild.
			return errs.New(errs.Usage, "the backup holds %s where pg_basebackup writes only files and directories", safefs.TypeName(d.Type())).
				WithPath(p).WithHint("remove it or take a new backup; the backup's own manifest does not list it")
		}
		if dir == "." && (rel == "backup_label" || rel == "backup_manifest") {
			return nil
		}
		fi, err := d.Info()
		if err != nil {
			return err
		}
		j := &job{rel: rel, src: rel, mode: fi.Mode().Perm(), size: fi.Size(),
			wal: strings.HasPrefix(rel, "pg_wal/")}
		name := d.Name()
		if pgbackup.IsIncrementalDir(dir) && strings.HasPrefix(name, pgbackup.IncrementalPrefix) {
			if len(r.chain) == 1 {
				return fullHasIncremental(p)
			}
			j.kind = jobRebuild
			j.rel = dir + "/" + strings.TrimPrefix(name, pgbackup.IncrementalPrefix)
			f, err := newestSrc.OpenRegular(rel)
			if err != nil {
				return readErr(err, p)
			}
			h, err := pgbackup.ReadIncremental(f)
			f.Close()
			if err != nil {
				return errs.Wrap(errs.Usage, err, "damaged incremental file").WithPath(p).
					WithHint("check the backup with pg_verifybackup")
			}
			j.size = int64(h.OutputBlocks()) * pgbackup.BlockSize
		}
		r.jobs = append(r.jobs, j)
		r.total += j.size
		return nil
	})
}

// chown gives rel (in staging) to the owner, through the staging root
// (no symlink followed).
func (r *restorer) chown(rel string) error {
	if r.opts.Owner == nil {
		return nil
	}
	return r.sd.Lchown(rel, r.opts.Owner.UID, r.opts.Owner.GID)
}

// handOver gives the finished staging directory its final mode and owner,
// by descriptor, last of all, and checks that the name it will be renamed
// from is still the directory that was built (no other user could reach
// into it while it was private, but its parent may be theirs).
func (r *restorer) handOver() error {
	top, err := r.sd.Open(".")
	if err != nil {
		return errs.FromOS(err, r.root, "cannot open the staging directory")
	}
	defer top.Close()
	if r.opts.Owner != nil {
		if err := top.Chown(r.opts.Owner.UID, r.opts.Owner.GID); err != nil {
			return errs.FromOS(err, r.root, "cannot give the result to its owner")
		}
	}
	if err := top.Chmod(r.rootMode); err != nil {
		return errs.FromOS(err, r.root, "cannot set the result's mode")
	}
	built, err := top.Stat()
	if err != nil {
		return errs.FromOS(err, r.root, "cannot read the staging directory")
	}
	named, err := os.Lstat(r.root)
	if err != nil || !os.SameFile(built, named) {
		return errs.New(errs.Permission, "the staging directory was replaced while the restore ran").WithPath(r.root).
			WithHint("restore into a directory whose parent only you can write")
	}
	return nil
}

// fullHasIncremental is the error for an INCREMENTAL file in a full backup:
// no older backup holds its blocks, so rebuilding it would make them up.
func fullHasIncremental(p string) error {
	return errs.New(errs.Usage, "full backup contains unexpected incremental file").WithPath(p).
		WithHint("the full backup is damaged or is not a full backup; check it with pg_verifybackup")
}

// readErr classifies an error reading a backup file: a symlink or a
// special file where pg_basebackup writes a plain file is refused, naming it.
func readErr(err error, p string) error {
	switch {
	case errors.Is(err, safefs.ErrSymlink):
		return errs.New(errs.Usage, "the backup has a symbolic link in this path; pgfork does not follow links in backups").WithPath(p).
			WithHint("pg_basebackup writes no links there: replace it with the file, or take a new backup")
	case errors.Is(err, safefs.ErrNotRegular):
		return errs.New(errs.Usage, "the backup has a special file where pg_basebackup writes a plain file: %v", errors.Unwrap(err)).WithPath(p).
			WithHint("replace it with the file, or take a new backup")
	}
	return errs.FromOS(err, p, "cannot read the backup")
}

func (r *restorer) run(ctx context.Context) error {
	order := make([]*job, len(r.jobs))
	copy(order, r.jobs)
	sort.SliceStable(order, func(a, b int) bool { return order[a].size > order[b].size })
	g, gctx := errgroup.WithContext(ctx)
	ch := make(chan *job)
	g.Go(func() error {
		defer close(ch)
		for _, j := range order {
			select {
			case ch <- j:
			case <-gctx.Done():
				return gctx.Err()
			}
		}
		return nil
	})
	for range r.opts.Jobs {
		g.Go(func() error {
			buf := make([]byte, 1<<20)
			for j := range ch {
				if err := gctx.Err(); err != nil {
					return err
				}
				var err error
				if j.kind == jobWhole {
					r.whole.Add(1)
					err = r.doWhole(j, len(r.chain)-1, j.src, buf)
				} else {
					err = r.doRebuild(gctx, j, buf)
				}
				if err != nil {
					return err
				}
				r.doneFiles.Add(1)
				if testHookAfterFile != nil {
					testHookAfterFile()
				}
			}
			return nil
		})
	}
	err := g.Wait()
	r.sum.Files = int64(len(r.jobs))
	r.sum.FilesWhole, r.sum.FilesOlder, r.sum.FilesRebuilt = r.whole.Load(), r.older.Load(), r.rebuilt.Load()
	r.sum.SharedBytes, r.sum.RangeBytes, r.sum.CopiedBytes = r.shared.Load(), r.ranged.Load(), r.copied.Load()
	r.sum.Calls, r.sum.ZeroBlocks = r.calls.Load(), r.zeroBlocks.Load()
	for i := range r.blocksBySrc {
		r.sum.BlocksBySource[i] = r.blocksBySrc[i].Load()
	}
	return err
}

func (r *restorer) create(j *job) (*os.File, error) {
	f, err := r.sd.OpenFile(filepath.FromSlash(j.rel), os.O_RDWR|os.O_CREATE|os.O_EXCL, j.mode)
	if err != nil {
		return nil, writeErr(err, filepath.Join(r.root, filepath.FromSlash(j.rel)))
	}
	if r.opts.Owner != nil {
		if err := f.Chown(r.opts.Owner.UID, r.opts.Owner.GID); err != nil {
			f.Close()
			return nil, err
		}
	}
	return f, nil
}

func (r *restorer) count(m clone.Method, n int64) {
	switch m {
	case clone.Clone:
		r.shared.Add(n)
	case clone.CopyFileRange:
		r.ranged.Add(n)
	default:
		r.copied.Add(n)
	}
}

func (r *restorer) newCRC() hash.Hash32 {
	if r.opts.NoChecksums {
		return nil
	}
	return crc32.New(crc32.MakeTable(crc32.Castagnoli))
}

func crcBytes(h hash.Hash32) []byte {
	var b [4]byte
	binary.LittleEndian.PutUint32(b[:], h.Sum32()) // pg_checksum_final copies the uint32 in memory order
	return b[:]
}

// doWhole copies src whole to j's output; the checksum comes from the
// manifest of the backup holding src when it has a CRC32C one for a file
// of this size, else it is computed.
func (r *restorer) doWhole(j *job, k int, src string, buf []byte) error {
	from := r.chain[k]
	sf, err := r.src[k].OpenRegular(src)
	if err != nil {
		return readErr(err, filepath.Join(from.Dir, filepath.FromSlash(src)))
	}
	defer sf.Close()
	fi, err := sf.Stat()
	if err != nil {
		return err
	}
	size := fi.Size()
	df, err := r.create(j)
	if err != nil {
		return err
	}
	defer df.Close()
	if r.opts.Prefetch && size > 0 {
		clone.Prefetch(sf, 0, size)
	}
	rc := r.rc
	if r.opts.WholeCopy {
		rc = &clone.RangeCopier{NoClone: true, NoCopyRange: true}
	}
	m, err := rc.CopyRange(df, sf, 0, 0, size, buf)
	if err != nil {
		return writeErr(err, df.Name())
	}
	r.count(m, size)
	r.doneBytes.Add(size)
	j.outSize = size
	if h := r.newCRC(); h != nil && !j.wal {
		if mf := from.Manifest.Files[j.rel]; mf != nil && mf.Algorithm == "CRC32C" && mf.Size == size && len(mf.Checksum) == 4 {
			j.algo, j.checksum = "CRC32C", mf.Checksum
		} else {
			if err := hashRange(h, sf, 0, size, buf); err != nil {
				return err
			}
			j.algo, j.checksum = "CRC32C", crcBytes(h)
		}
	}
	return df.Close()
}

func hashRange(h hash.Hash32, f *os.File, off, n int64, buf []byte) error {
	for n > 0 {
		k := min(n, int64(len(buf)))
		got, err := f.ReadAt(buf[:k], off)
		if int64(got) < k {
			if err == nil {
				err = errors.New("short read")
			}
			return fmt.Errorf("read %s at %d: %w", f.Name(), off, err)
		}
		h.Write(buf[:k])
		off += k
		n -= k
	}
	return nil
}

var zeroBlock [pgbackup.BlockSize]byte

// source is one file version consulted to rebuild an output file.
type source struct {
	f      *os.File
	backup int
}

// run is a range of output blocks that come from one source file at
// consecutive offsets (src -1: zeros).
type run struct {
	src            int
	srcOff, dstOff int64
	blocks         int64
}

// doRebuild rebuilds one file from an INCREMENTAL file of the newest
// backup and the versions of the file in older backups, by
// pg_combinebackup's rules (src/bin/pg_combinebackup/reconstruct.c):
// blocks present in the newest incremental come from it; the output is
// as long as its truncation block length, or longer to hold its blocks;
// the other blocks below the truncation length come from the newest older
// backup holding them, down to the first full version of the file (whose
// blocks beyond its length, and any block no backup holds, are zeros).
// When no incremental contributes a block and the full version has
// exactly the output's length, the full version is copied whole.
func (r *restorer) doRebuild(ctx context.Context, j *job, buf []byte) error {
	n := len(r.chain)
	newestPath := filepath.Join(r.chain.Newest().Dir, filepath.FromSlash(j.src))
	newest, err := r.src[n-1].OpenRegular(j.src)
	if err != nil {
		return readErr(err, newestPath)
	}
	srcs := []source{{f: newest, backup: n - 1}}
	defer func() {
		for _, s := range srcs {
			s.f.Close()
		}
	}()
	latest, err := pgbackup.ReadIncremental(newest)
	if err != nil {
		return errs.Wrap(errs.Usage, err, "damaged incremental file").WithPath(newestPath)
	}
	length := latest.OutputBlocks()
	srcOf := make([]int32, length) // index into srcs, -1: none yet
	offOf := make([]int64, length)
	for i := range srcOf {
		srcOf[i] = -1
	}
	fullCopyPossible := true
	for i, b := range latest.Blocks {
		srcOf[b], offOf[b] = 0, latest.DataOffset(i)
		fullCopyPossible = false
	}
	dir, base := path.Split(j.rel)
	var copyFrom string
	copyBackup := -1
	for k := n - 2; k >= 0; k-- {
		bdir := r.chain[k].Dir
		full := filepath.Join(bdir, filepath.FromSlash(j.rel))
		f, err := r.src[k].OpenRegular(j.rel)
		if err == nil {
			fi, err := f.Stat()
			if err != nil {
				f.Close()
				return err
			}
			srcs = append(srcs, source{f: f, backup: k})
			idx := int32(len(srcs) - 1)
			have := uint32(fi.Size() / pgbackup.BlockSize)
			for b := uint32(0); b < latest.TruncationBlocks && b < have; b++ {
				if srcOf[b] < 0 {
					srcOf[b], offOf[b] = idx, int64(b)*pgbackup.BlockSize
				}
			}
			if fullCopyPossible && int64(latest.TruncationBlocks)*pgbackup.BlockSize == fi.Size() {
				copyFrom, copyBackup = j.rel, k
			}
			break
		}
		if !errors.Is(err, fs.ErrNotExist) {
			return readErr(err, full)
		}
		incRel := dir + pgbackup.IncrementalPrefix + base
		inc := filepath.Join(bdir, filepath.FromSlash(incRel))
		f, err = r.src[k].OpenRegular(incRel)
		if err == nil && k == 0 {
			f.Close()
			return fullHasIncremental(inc)
		}
		if err != nil && !errors.Is(err, fs.ErrNotExist) {
			return readErr(err, inc)
		}
		if err != nil {
			return errs.Wrap(errs.Usage, err, "the chain is inconsistent: %s is incremental in a later backup but neither it nor an INCREMENTAL file is in %s",
				j.rel, r.chain[k].Name()).WithHint("check the backups with pg_verifybackup; a backup of the chain may be damaged or from another chain")
		}
		srcs = append(srcs, source{f: f, backup: k})
		idx := int32(len(srcs) - 1)
		h, err := pgbackup.ReadIncremental(f)
		if err != nil {
			return errs.Wrap(errs.Usage, err, "damaged incremental file").WithPath(inc)
		}
		for i, b := range h.Blocks {
			if b < latest.TruncationBlocks && srcOf[b] < 0 {
				srcOf[b], offOf[b] = idx, h.DataOffset(i)
				fullCopyPossible = false
			}
		}
	}
	if copyFrom != "" {
		r.older.Add(1)
		r.whole.Add(1)
		return r.doWhole(j, copyBackup, copyFrom, buf)
	}
	r.rebuilt.Add(1)

	// Runs of consecutive blocks from one source at consecutive offsets.
	var runs []run
	for b := uint32(0); b < length; b++ {
		s, off := srcOf[b], offOf[b]
		if len(runs) > 0 && !r.opts.NoMerge {
			last := &runs[len(runs)-1]
			if last.src == int(s) && (s < 0 || last.srcOff+last.blocks*pgbackup.BlockSize == off) {
				last.blocks++
				continue
			}
		}
		runs = append(runs, run{src: int(s), srcOff: off, dstOff: int64(b) * pgbackup.BlockSize, blocks: 1})
	}
	df, err := r.create(j)
	if err != nil {
		return err
	}
	defer df.Close()
	if r.opts.Prefetch {
		for _, ru := range runs {
			if ru.src >= 0 {
				clone.Prefetch(srcs[ru.src].f, ru.srcOff, ru.blocks*pgbackup.BlockSize)
			}
		}
	}
	// The checksum is computed from the sources, in output order, by a
	// second goroutine while this one moves the runs: the reads overlap
	// the copies (the sources are only read, so the order between the two
	// does not matter).
	h := r.newCRC()
	if j.wal {
		h = nil
	}
	hashed := make(chan error, 1)
	if h != nil {
		go func() {
			hbuf := make([]byte, 1<<20)
			for _, ru := range runs {
				if err := ctx.Err(); err != nil {
					hashed <- err
					return
				}
				if ru.src < 0 {
					for range ru.blocks {
						h.Write(zeroBlock[:])
					}
					continue
				}
				if err := hashRange(h, srcs[ru.src].f, ru.srcOff, ru.blocks*pgbackup.BlockSize, hbuf); err != nil {
					hashed <- err
					return
				}
			}
			hashed <- nil
		}()
	} else {
		hashed <- nil
	}
	if err := r.moveRuns(ctx, df, srcs, runs, buf); err != nil {
		<-hashed // the hasher reads the sources, closed when we return
		return err
	}
	if err := <-hashed; err != nil {
		return err
	}
	size := int64(length) * pgbackup.BlockSize
	fi, err := df.Stat()
	if err != nil {
		return err
	}
	if fi.Size() != size {
		if err := df.Truncate(size); err != nil {
			return writeErr(err, df.Name())
		}
	}
	j.outSize = size
	if h != nil {
		j.algo, j.checksum = "CRC32C", crcBytes(h)
	}
	return df.Close()
}

// moveRuns copies each run of blocks to df with one range copy; zero runs
// are left as holes.
func (r *restorer) moveRuns(ctx context.Context, df *os.File, srcs []source, runs []run, buf []byte) error {
	for _, ru := range runs {
		if err := ctx.Err(); err != nil {
			return err
		}
		nbytes := ru.blocks * pgbackup.BlockSize
		if ru.src < 0 {
			r.zeroBlocks.Add(ru.blocks)
			r.doneBytes.Add(nbytes)
			continue // a hole; the size is set by the caller
		}
		s := srcs[ru.src]
		m, err := r.rc.CopyRange(df, s.f, ru.dstOff, ru.srcOff, nbytes, buf)
		if err != nil {
			return writeErr(err, df.Name())
		}
		r.calls.Add(1)
		r.count(m, nbytes)
		r.blocksBySrc[s.backup].Add(ru.blocks)
		r.doneBytes.Add(nbytes)
	}
	return nil
}

func writeErr(err error, p string) error {
	if errors.Is(err, errNoSpace) {
		return errs.Wrap(errs.NoSpace, err, "the destination filesystem is full").WithPath(p).
			WithHint("free some space, or restore onto a filesystem with reflinks (XFS, btrfs) where unchanged blocks take no space")
	}
	return errs.Wrap(errs.Internal, err, "cannot write the restored file").WithPath(p)
}

func (r *restorer) finalErr(ctx context.Context, err error) error {
	if ctx.Err() != nil {
		return errs.Wrap(errs.Interrupted, ctx.Err(), "restore interrupted; nothing was left at the destination")
	}
	var e *errs.Error
	if errors.As(err, &e) {
		return err
	}
	if errors.Is(err, errNoSpace) {
		return writeErr(err, r.sum.Dst)
	}
	return errs.Wrap(errs.Internal, err, "restore failed; nothing was left at the destination")
}

// writeLabelAndManifest writes backup_label (the newest backup's without
// its INCREMENTAL FROM lines) and backup_manifest (every file written,
// with its size, mtime and checksum; the newest backup's WAL ranges).
func (r *restorer) writeLabelAndManifest() error {
	newest := r.chain.Newest()
	w := pgbackup.NewManifestWriter(newest.Manifest.Version, newest.SystemID)
	label := newest.Label.CombinedLabel()
	if err := r.writeSmall("backup_label", label); err != nil {
		return err
	}
	fi, err := r.sd.Stat("backup_label")
	if err != nil {
		return err
	}
	var sum []byte
	algo := ""
	if h := r.newCRC(); h != nil {
		h.Write(label)
		sum, algo = crcBytes(h), "CRC32C"
	}
	w.Add("backup_label", int64(len(label)), fi.ModTime(), algo, sum)
	for _, j := range r.jobs {
		r.sum.Bytes += j.outSize
		fi, err := r.sd.Lstat(filepath.FromSlash(j.rel))
		if err != nil {
			return err
		}
		w.Add(j.rel, fi.Size(), fi.ModTime(), j.algo, j.checksum)
	}
	return r.writeSmall("backup_manifest", w.Finish(newest.Manifest.WAL))
}

// writeSmall writes a new file rel (in staging) holding b.
func (r *restorer) writeSmall(rel string, b []byte) error {
	p := filepath.Join(r.root, rel)
	f, err := r.sd.OpenFile(rel, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return writeErr(err, p)
	}
	if _, err := f.Write(b); err != nil {
		f.Close()
		return writeErr(err, p)
	}
	if r.opts.Owner != nil {
		if err := f.Chown(r.opts.Owner.UID, r.opts.Owner.GID); err != nil {
			f.Close()
			return err
		}
	}
	return f.Close()
}

// syncAll makes the result durable: fsync of every file (64 at a time:
// filesystems commit concurrent fsyncs together) and directory, or one
// syncfs.
func (r *restorer) syncAll(ctx context.Context) error {
	switch r.opts.Sync {
	case clone.SyncNone:
		return nil
	case clone.SyncFS:
		return syncFS(r.root)
	}
	paths := []string{"backup_label", "backup_manifest"}
	for _, j := range r.jobs {
		paths = append(paths, j.rel)
	}
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(clone.DefaultSyncJobs)
	for _, rel := range paths {
		g.Go(func() error {
			if err := gctx.Err(); err != nil {
				return err
			}
			return r.fsync(filepath.FromSlash(rel))
		})
	}
	if err := g.Wait(); err != nil {
		return err
	}
	for i := len(r.dirs) - 1; i >= 0; i-- {
		if err := r.fsync(filepath.FromSlash(r.dirs[i])); err != nil {
			return err
		}
	}
	return r.fsync(".")
}

// fsync flushes rel (in staging) to disk.
func (r *restorer) fsync(rel string) error {
	p := filepath.Join(r.root, rel)
	f, err := r.sd.Open(rel)
	if err != nil {
		return err
	}
	defer f.Close()
	if err := f.Sync(); err != nil {
		return fmt.Errorf("fsync %s: %w", p, err)
	}
	return nil
}

func (r *restorer) startProgress() (stop func()) {
	if r.opts.OnProgress == nil {
		return func() {}
	}
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	report := func() {
		r.opts.OnProgress(clone.Progress{Files: r.doneFiles.Load(), TotalFiles: int64(len(r.jobs)),
			Bytes: r.doneBytes.Load(), TotalBytes: r.total})
	}
	go func() {
		defer wg.Done()
		t := time.NewTicker(100 * time.Millisecond)
		defer t.Stop()
		for {
			select {
			case <-done:
				report()
				return
			case <-t.C:
				report()
			}
		}
	}()
	return func() { close(done); wg.Wait() }
}

// checkManifests checks each backup of the chain against its own
// backup_manifest before anything is built: every file it lists is there,
// a plain file (no link), of the size listed. A file missing from a backup
// would otherwise be missing from the result, and the fresh manifest
// written for the result would hide it from pg_verifybackup.
func (r *restorer) checkManifests() error {
	for k, b := range r.chain {
		for rel, mf := range b.Manifest.Files {
			p := filepath.Join(b.Dir, filepath.FromSlash(rel))
			f, err := r.src[k].OpenRegular(rel)
			if errors.Is(err, fs.ErrNotExist) {
				return errs.New(errs.Usage, "%s is present in the backup's manifest but not on disk", rel).WithPath(b.Dir).
					WithHint("the backup is damaged; check it with pg_verifybackup %s, or take a new backup", b.Dir)
			}
			if err != nil {
				return readErr(err, p)
			}
			fi, err := f.Stat()
			f.Close()
			if err != nil {
				return errs.FromOS(err, p, "cannot read the backup")
			}
			if fi.Size() != mf.Size {
				return errs.New(errs.Usage, "%s has size %d on disk but size %d in the backup's manifest", rel, fi.Size(), mf.Size).WithPath(b.Dir).
					WithHint("the backup is damaged; check it with pg_verifybackup %s, or take a new backup", b.Dir)
			}
		}
	}
	return nil
}
