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
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"time"

	"github.com/pgfork/pgfork/clone"
	"github.com/pgfork/pgfork/instance"
	"github.com/pgfork/pgfork/internal/errs"
	"github.com/pgfork/pgfork/internal/fsutil"
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
	// Checksums is the manifest's checksum algorithm, one of
	// ChecksumAlgorithms (NONE: sizes only); default CRC32C, as
	// pg_combinebackup. A file copied whole keeps its backup's checksum
	// when that backup's manifest has one of this algorithm.
	Checksums string
	// NoManifest writes no backup_manifest (pg_combinebackup --no-manifest).
	NoManifest bool

	// Tablespaces maps each tablespace outside the data directory, by the
	// directory the newest backup's pg_tblspc link points to, to the new
	// directory its restored copy goes to (pg_combinebackup -T OLD=NEW;
	// ParseTablespaceMapping). Every such tablespace needs one.
	Tablespaces map[string]string

	// Link makes the files copied whole hard links to the backups' own
	// (pg_combinebackup --link): the fastest way without reflinks, but the
	// result then shares those files with the backups, so starting it or
	// changing it changes the backups. Rebuilt files are written. Never a
	// default; the backups and the destination must be on one filesystem.
	Link bool

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
	// run of consecutive blocks from one source file; where the filesystem
	// clones, one for the whole full version of the file and one per run
	// from elsewhere). A dry run counts one per run (the most it takes).
	Calls int64 `json:"calls"`

	Bytes       int64 `json:"bytes"`        // total size of the result
	SharedBytes int64 `json:"shared_bytes"` // moved by reflink: shared with the backups
	RangeBytes  int64 `json:"range_bytes"`  // moved by copy_file_range (shared where the filesystem does it)
	CopiedBytes int64 `json:"copied_bytes"` // read and written
	LinkedBytes int64 `json:"linked_bytes"` // hard-linked to the backups' files (Options.Link)

	// Tablespaces are the user tablespaces restored outside the data
	// directory.
	Tablespaces []TablespaceResult `json:"tablespaces,omitempty"`

	Checksums string         `json:"checksums"`
	Sync      clone.SyncMode `json:"sync"`
	Phases    []Phase        `json:"phases"`
	Elapsed   time.Duration  `json:"elapsed_ns"`
}

// TablespaceResult is a tablespace restored outside the data directory.
type TablespaceResult struct {
	OID  string `json:"oid"`
	From string `json:"from"` // the newest backup's tablespace directory
	Dir  string `json:"dir"`  // the restored one
}

// Restore checks the chain dirs (full backup first) and rebuilds the data
// directory it describes at dst, which must not exist. Nothing is written
// before the chain is checked and the restore planned; the backups are
// only read; on any error (or cancellation) dst does not exist afterwards.
func Restore(ctx context.Context, dirs []string, dst string, opts Options) (*Summary, error) {
	start := time.Now()
	opts, err := opts.withDefaults()
	if err != nil {
		return nil, err
	}
	var sum Summary
	phase := func(name string, t0 time.Time) {
		sum.Phases = append(sum.Phases, Phase{Name: name, Elapsed: time.Since(t0)})
	}
	for _, d := range dirs {
		if err := instance.CheckDataOwner(d, opts.Owner); err != nil {
			return nil, err
		}
	}
	t0 := time.Now()
	in, err := open(dirs, dst, opts.Tablespaces)
	if err != nil {
		return nil, err
	}
	defer in.close()
	phase("check", t0)

	t0 = time.Now()
	plan, err := in.plan(opts)
	if err != nil {
		return nil, err
	}
	phase("plan", t0)

	outs, err := stage(dst, in.rootMode, in.ts)
	if err != nil {
		return nil, err
	}
	defer outs.abort()
	w := newWriter(plan, in, outs, opts)
	fail := func(err error) (*Summary, error) {
		outs.abort() // first: the free space a full disk's message reports is then real
		return nil, finalErr(ctx, err, outs[0].st.Destination(), plan)
	}

	t0 = time.Now()
	if err := w.mkdirs(); err != nil {
		return fail(err)
	}
	var report func()
	if opts.OnProgress != nil {
		report = func() { opts.OnProgress(w.progress()) }
	}
	stop := clone.StartProgress(report)
	err = w.files(ctx)
	stop()
	if err != nil {
		return fail(err)
	}
	phase("files", t0)

	t0 = time.Now()
	if sum.Bytes, err = w.writeLabelAndManifest(); err != nil {
		return fail(err)
	}
	phase("manifest", t0)

	t0 = time.Now()
	files, dirsToSync := w.syncPaths()
	if err := outs.sync(ctx, files, dirsToSync, opts.Sync); err != nil {
		return fail(err)
	}
	phase("sync", t0)

	t0 = time.Now()
	if err := outs.commit(opts.Owner, opts.Sync != clone.SyncNone); err != nil {
		return nil, err
	}
	phase("rename", t0)

	sum.fill(in, plan, opts)
	sum.Dst = outs[0].st.Destination()

	sum.SharedBytes, sum.RangeBytes, sum.CopiedBytes, sum.LinkedBytes = w.shared.Load(), w.ranged.Load(), w.plain.Load(), w.linked.Load()
	sum.Calls = w.calls.Load()
	sum.Elapsed = time.Since(start)
	return &sum, nil
}

// PlanOnly checks the chain as Restore does and returns what Restore
// would do at dst, writing nothing (pgfork restore --dry-run).
func PlanOnly(dirs []string, dst string, opts Options) (*DryRun, error) {
	opts, err := opts.withDefaults()
	if err != nil {
		return nil, err
	}
	in, err := open(dirs, dst, opts.Tablespaces)
	if err != nil {
		return nil, err
	}
	defer in.close()
	if _, err := os.Lstat(dst); err == nil {
		return nil, errs.New(errs.Exists, "the destination already exists").WithPath(dst).
			WithHint("restore into a new directory; pgfork never overwrites one")
	}
	plan, err := in.plan(opts)
	if err != nil {
		return nil, err
	}
	d := &DryRun{Plan: plan}
	for _, f := range plan.Files {
		df := DryRunFile{Rel: f.Rel, Size: f.Size}
		if f.Whole() {
			df.WholeFrom = f.Sources[0].Backup + 1
		} else {
			df.Blocks = make([]int64, len(plan.Backups))
			for _, r := range f.Runs {
				if r.Source < 0 {
					df.ZeroBlocks += r.Blocks
				} else {
					df.Blocks[f.Sources[r.Source].Backup] += r.Blocks
				}
			}
		}
		d.Files = append(d.Files, df)
	}
	d.Summary.fill(in, plan, opts)
	d.Summary.Dst, _ = filepath.Abs(dst)
	d.Summary.Bytes = plan.Bytes
	d.NeedBytes, d.SharesBlocks = spaceNeeded(plan, in.chain.Newest().Dir, filepath.Dir(d.Summary.Dst))
	if opts.Link && !d.SharesBlocks {
		// Files copied whole are links: only the rebuilt ones take space.
		d.NeedBytes = 0
		for _, f := range plan.Files {
			if !f.Whole() {
				d.NeedBytes += f.Size
			}
		}
		d.NeedBytes -= plan.ZeroBlocks * pgbackup.BlockSize
	}
	if free, err := clone.FreeBytes(filepath.Dir(d.Summary.Dst)); err == nil {
		d.FreeBytes = free
	}
	return d, nil
}

// DryRun is what a restore would do (PlanOnly).
type DryRun struct {
	// Summary is the restore's summary as planned (no times, no bytes
	// moved).
	Summary Summary `json:"summary"`
	// Plan is every file with its sources and runs of blocks.
	Plan *Plan `json:"-"`
	// Files says how each file would be made.
	Files []DryRunFile `json:"files"`
	// NeedBytes is the space the result takes of its own: when
	// SharesBlocks (the destination is on the backups' filesystem and it
	// clones), only the manifest's; else every block written (holes
	// excepted).
	NeedBytes    int64 `json:"need_bytes"`
	SharesBlocks bool  `json:"shares_blocks"`
	FreeBytes    int64 `json:"free_bytes"`
}

// DryRunFile is how a restore would make one file.
type DryRunFile struct {
	Rel  string `json:"path"`
	Size int64  `json:"size"`
	// WholeFrom is the backup (1 the full backup) it is copied whole
	// from; 0 when it is rebuilt.
	WholeFrom int `json:"whole_from,omitempty"`
	// Blocks counts a rebuilt file's blocks by backup; ZeroBlocks are in
	// none.
	Blocks     []int64 `json:"blocks_by_backup,omitempty"`
	ZeroBlocks int64   `json:"zero_blocks,omitempty"`
}

// spaceNeeded estimates the space a restore of plan into dir takes: on
// the backups' own filesystem, when it clones (XFS with reflink, btrfs),
// the result shares its blocks with them; else every block written takes
// space (zero runs are holes).
func spaceNeeded(plan *Plan, backup, dir string) (int64, bool) {
	dfs, derr := clone.FSType(dir)
	same, err := clone.SameFS(backup, dir)
	if derr == nil && err == nil && same && clone.MayClone(dfs) {
		return 0, true
	}
	return plan.Bytes - plan.ZeroBlocks*pgbackup.BlockSize, false
}

// fill sets what a summary says of the chain and the plan.
func (s *Summary) fill(in *input, p *Plan, opts Options) {
	chain := in.chain
	for _, t := range in.ts {
		s.Tablespaces = append(s.Tablespaces, TablespaceResult{OID: t.oid, From: t.old, Dir: t.new})
	}
	for _, b := range chain {
		s.Backups = append(s.Backups, b.Dir)
	}
	s.Major, s.SystemID = chain.Newest().Major, chain.Newest().SystemID
	s.Files, s.Dirs = int64(len(p.Files)), int64(len(p.Dirs))
	s.FilesWhole, s.FilesOlder, s.FilesRebuilt = p.FilesWhole, p.FilesOlder, p.FilesRebuilt
	s.BlocksBySource, s.ZeroBlocks, s.Calls = p.BlocksBySource, p.ZeroBlocks, p.Calls
	s.Sync = opts.Sync
	s.Checksums = opts.checksums()
	if opts.NoManifest {
		s.Checksums = "no manifest"
	}
}

// checksums is the manifest checksum algorithm (canonical; checked by
// withDefaults).
func (o Options) checksums() string {
	a, _ := checksumAlgorithm(o.Checksums)
	return a
}

// withDefaults fills the defaults in and checks the options.
func (o Options) withDefaults() (Options, error) {
	var err error
	if o.Checksums, err = checksumAlgorithm(o.Checksums); err != nil {
		return o, err
	}
	if o.Jobs <= 0 {
		o.Jobs = runtime.NumCPU()
	}
	if o.Sync == "" {
		o.Sync = clone.SyncFsync
	}
	return o, nil
}

// input is a checked chain, opened for reading without following links.
type input struct {
	chain pgbackup.Chain
	src   []*safefs.Dir
	ts    []*tablespace
	// rootMode is the mode the result's top directory gets when it is
	// handed over (the newest backup's); until then staging stays root's
	// own, 0700.
	rootMode fs.FileMode
}

// open checks the chain and the destination: dst outside every backup,
// each backup as its manifest says, no tablespace outside the data
// directory.
func open(dirs []string, dst string, mapping map[string]string) (_ *input, err error) {
	in := &input{}
	defer func() {
		if err != nil {
			in.close()
		}
	}()
	if in.chain, err = pgbackup.OpenChain(dirs); err != nil {
		return nil, err
	}
	for _, b := range in.chain {
		if fsutil.WithinByID(filepath.Dir(dst), b.Dir) {
			return nil, errs.New(errs.Usage, "the destination is inside a backup").WithPath(dst).
				WithHint("restore to a directory outside the backups (they are only read)")
		}
		d, err := safefs.OpenDir(b.Dir)
		if err != nil {
			return nil, errs.FromOS(err, b.Dir, "cannot read the backup")
		}
		in.src = append(in.src, d)
	}
	if err := in.findTablespaces(mapping, dst); err != nil {
		return nil, err
	}
	if err := in.checkManifests(); err != nil {
		return nil, err
	}
	fi, err := os.Stat(in.chain.Newest().Dir)
	if err != nil {
		return nil, errs.FromOS(err, in.chain.Newest().Dir, "cannot read the backup")
	}
	in.rootMode = fi.Mode().Perm()
	return in, nil
}

func (in *input) close() {
	for _, d := range in.src {
		d.Close()
	}
	for _, t := range in.ts {
		for _, d := range t.src {
			if d != nil {
				d.Close()
			}
		}
	}
}

// plan scans the newest backup and plans the restore.
func (in *input) plan(opts Options) (*Plan, error) {
	tree, err := in.scan()
	if err != nil {
		return nil, err
	}
	var names []string
	for _, b := range in.chain {
		names = append(names, b.Dir)
	}
	return BuildPlan(names, tree, in.lookup, PlanOptions{NoMerge: opts.NoMerge, Jobs: opts.Jobs})
}

// handOver gives the finished staging directory (open as sd, named top)
// its final mode and owner, by descriptor, last of all, and checks that
// the name it will be renamed from is still the directory that was built
// (no other user could reach into it while it was private, but its parent
// may be theirs).
func handOver(sd *os.Root, top string, mode fs.FileMode, owner *clone.Owner) error {
	d, err := sd.Open(".")
	if err != nil {
		return errs.FromOS(err, top, "cannot open the staging directory")
	}
	defer d.Close()
	if owner != nil {
		if err := d.Chown(owner.UID, owner.GID); err != nil {
			return errs.FromOS(err, top, "cannot give the result to its owner")
		}
	}
	if err := d.Chmod(mode); err != nil {
		return errs.FromOS(err, top, "cannot set the result's mode")
	}
	built, err := d.Stat()
	if err != nil {
		return errs.FromOS(err, top, "cannot read the staging directory")
	}
	if err := clone.SameDir(top, built); err != nil {
		return errs.New(errs.Permission, "the staging directory was replaced while the restore ran").WithPath(top).
			WithHint("restore into a directory whose parent only you can write")
	}
	return nil
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

// finalErr is what the user sees of a failed restore, once staging is
// gone: an interruption, a full disk (with the space the restore needs),
// or the error itself.
func finalErr(ctx context.Context, err error, dst string, p *Plan) error {
	if ctx.Err() != nil {
		return errs.Wrap(errs.Interrupted, ctx.Err(), "restore interrupted; nothing was left at the destination")
	}
	if clone.IsNoSpace(err) {
		return clone.NoSpaceError(err, filepath.Dir(dst), dst, p.Bytes-p.ZeroBlocks*pgbackup.BlockSize)
	}
	if errs.KindOf(err) != errs.Internal {
		return err
	}
	return errs.Wrap(errs.Internal, err, "restore failed; nothing was left at the destination")
}

// checkManifests checks each backup of the chain against its own
// backup_manifest before anything is built: every file it lists is there,
// a plain file (no link), of the size listed. A file missing from a backup
// would otherwise be missing from the result, and the fresh manifest
// written for the result would hide it from pg_verifybackup. Files of a
// tablespace are read through the tablespace's link; those of a
// tablespace the result does not have (dropped before the newest backup)
// are not needed and not checked.
func (in *input) checkManifests() error {
	for k, b := range in.chain {
		for rel, mf := range b.Manifest.Files {
			if t, _ := in.tablespaceOf(rel); t == nil && strings.HasPrefix(rel, "pg_tblspc/") && strings.Count(rel, "/") > 2 {
				if _, err := in.src[k].Open(strings.Join(strings.SplitN(rel, "/", 3)[:2], "/")); errors.Is(err, safefs.ErrSymlink) {
					continue // a tablespace outside the data directory that the result does not have
				}
			}
			p := in.sourcePath(k, rel)
			f, err := in.openSource(k, rel)
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
