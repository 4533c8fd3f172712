package restore

import (
	"io/fs"
	"path/filepath"
	"strings"

	"golang.org/x/sync/errgroup"

	"github.com/pgfork/pgfork/internal/errs"
	"github.com/pgfork/pgfork/pgbackup"
)

// The planner: what the chain holds in, what to write out. It reads no
// file: the newest backup's tree comes scanned (scan.go) and older
// versions of a file are asked of a Lookup, so that its rules — those of
// pg_combinebackup's reconstruct.c — are tested on chains described in
// memory (plan_test.go), and a --dry-run prints the plan without writing.

// EntryKind says what one backup holds under one output file's name.
type EntryKind int

// What a backup can hold for a file.
const (
	// Absent: neither the file nor an INCREMENTAL file of it.
	Absent EntryKind = iota
	// Full: the file itself, whole.
	Full
	// Incr: an INCREMENTAL file: some blocks and the truncation length.
	Incr
)

// Entry is what one backup holds for one output file.
type Entry struct {
	Kind EntryKind
	// Path is the file in the backup, '/'-separated: the file itself
	// (Full) or its INCREMENTAL file (Incr).
	Path string
	// Size is a Full file's size.
	Size int64
	// Inc is an Incr file's header.
	Inc *pgbackup.Incremental
}

// Lookup answers what backup k (0 is the full backup) holds for the
// output file rel. It may be called from several goroutines at once.
type Lookup func(k int, rel string) (Entry, error)

// Node is one entry of the newest backup's tree, as scanned.
type Node struct {
	// Rel is the output path relative to the data directory,
	// '/'-separated (for an INCREMENTAL file, the name it rebuilds).
	Rel  string
	Dir  bool
	Mode fs.FileMode
	// Link, when set, makes the node a symbolic link to this path (a
	// tablespace's pg_tblspc/OID, to the tablespace's new directory).
	Link string
	// Entry is what the newest backup holds (files only): Full or Incr.
	Entry
}

// Source is one file of one backup that a planned file is made from.
type Source struct {
	Backup int    // index in the chain, 0 the full backup
	Path   string // in that backup, '/'-separated
}

// BlockRun is a range of output blocks that come from one source file at
// consecutive offsets, moved with one range copy; Source -1 is zeros (a
// hole: blocks no backup holds).
type BlockRun struct {
	Source         int
	SrcOff, DstOff int64
	Blocks         int64
}

// FilePlan is how one output file is made.
type FilePlan struct {
	Rel  string
	Mode fs.FileMode
	// Size is the output's size in bytes.
	Size int64
	// WAL files (under pg_wal) go into the manifest without a checksum,
	// as pg_combinebackup writes them.
	WAL bool
	// Sources are the files read. With no Runs the file is copied whole
	// from Sources[0]; else each BlockRun moves blocks of one of them.
	Sources []Source
	Runs    []BlockRun
	// Older: copied whole from an older backup than the newest (an
	// INCREMENTAL file of the newest with no blocks; the file unchanged).
	Older bool
	// Base, for a rebuilt file, is the index in Sources of the full
	// version of the file (-1: none), and BaseBytes how much of it the
	// output keeps where it is (up to the truncation length): a writer
	// that can clone the base whole first needs to move only the runs
	// that come from elsewhere (BlockRun.FromBase tells them apart).
	Base      int
	BaseBytes int64
}

// FromBase reports whether run r of f moves blocks of f's base (the full
// version) to where they are in it: after a clone of the base, nothing to do.
func (f *FilePlan) FromBase(r BlockRun) bool {
	return f.Base >= 0 && r.Source == f.Base && r.SrcOff == r.DstOff && r.DstOff+r.Blocks*pgbackup.BlockSize <= f.BaseBytes
}

// Whole reports whether the file is copied whole from Sources[0].
func (f *FilePlan) Whole() bool { return f.Runs == nil }

// Plan is a restore's work: the directories to create and the files to
// make, in the newest backup's order, with totals.
type Plan struct {
	// Backups are the chain's directories, full first.
	Backups []string
	Dirs    []Node
	Links   []Node
	Files   []*FilePlan

	Bytes        int64 // size of every file of the result
	FilesWhole   int64 // copied whole (Older ones included)
	FilesOlder   int64
	FilesRebuilt int64
	// BlocksBySource counts the blocks of rebuilt files by the backup
	// they come from; ZeroBlocks are in no backup (holes).
	BlocksBySource []int64
	ZeroBlocks     int64
	// Calls is the number of range copies rebuilt files take.
	Calls int64
}

// PlanOptions shape a plan.
type PlanOptions struct {
	// NoMerge gives each block a call of its own (a measurement).
	NoMerge bool
	// Jobs files are planned at once (Lookup reads headers); default 1.
	Jobs int
}

// BuildPlan plans the restore of a chain of len(backups) backups whose
// newest holds tree, asking look about the older ones. backup_label and
// backup_manifest at the top are left out: the label and manifest writer
// makes them.
func BuildPlan(backups []string, tree []Node, look Lookup, o PlanOptions) (*Plan, error) {
	n := len(backups)
	p := &Plan{Backups: backups, BlocksBySource: make([]int64, n)}
	var files []Node
	for _, nd := range tree {
		switch {
		case nd.Dir:
			p.Dirs = append(p.Dirs, nd)
		case nd.Link != "":
			p.Links = append(p.Links, nd)
		case nd.Rel == "backup_label" || nd.Rel == "backup_manifest":
		default:
			files = append(files, nd)
		}
	}
	p.Files = make([]*FilePlan, len(files))
	g := new(errgroup.Group)
	g.SetLimit(max(o.Jobs, 1))
	for i, nd := range files {
		g.Go(func() error {
			fp, err := planFile(backups, nd, look, o.NoMerge)
			p.Files[i] = fp
			return err
		})
	}
	if err := g.Wait(); err != nil {
		return nil, err
	}
	for _, f := range p.Files {
		p.Bytes += f.Size
		switch {
		case f.Whole():
			p.FilesWhole++
			if f.Older {
				p.FilesOlder++
			}
		default:
			p.FilesRebuilt++
			for _, r := range f.Runs {
				if r.Source < 0 {
					p.ZeroBlocks += r.Blocks
					continue
				}
				p.Calls++
				p.BlocksBySource[f.Sources[r.Source].Backup] += r.Blocks
			}
		}
	}
	return p, nil
}

// planFile plans one file of the newest backup. A full file is copied
// whole. An INCREMENTAL one is rebuilt by pg_combinebackup's rules
// (src/bin/pg_combinebackup/reconstruct.c): blocks present in the newest
// incremental come from it; the output is as long as its truncation block
// length, or longer to hold its blocks; the other blocks below the
// truncation length come from the newest older backup holding them, down
// to the first full version of the file (whose blocks beyond its length,
// and any block no backup holds, are zeros). When no incremental
// contributes a block and the full version has exactly the output's
// length, the full version is copied whole.
func planFile(backups []string, nd Node, look Lookup, noMerge bool) (*FilePlan, error) {
	n := len(backups)
	f := &FilePlan{Rel: nd.Rel, Mode: nd.Mode, WAL: strings.HasPrefix(nd.Rel, "pg_wal/"), Base: -1}
	if nd.Kind == Full {
		f.Size = nd.Size
		f.Sources = []Source{{Backup: n - 1, Path: nd.Path}}
		return f, nil
	}
	if n == 1 {
		return nil, fullHasIncremental(filepath.Join(backups[0], filepath.FromSlash(nd.Path)))
	}
	latest := nd.Inc
	length := latest.OutputBlocks()
	f.Size = int64(length) * pgbackup.BlockSize
	f.Sources = []Source{{Backup: n - 1, Path: nd.Path}}
	srcOf := make([]int32, length) // index into f.Sources, -1: none yet
	offOf := make([]int64, length)
	for i := range srcOf {
		srcOf[i] = -1
	}
	fullCopyPossible := true
	for i, b := range latest.Blocks {
		srcOf[b], offOf[b] = 0, latest.DataOffset(i)
		fullCopyPossible = false
	}
	for k := n - 2; k >= 0; k-- {
		e, err := look(k, nd.Rel)
		if err != nil {
			return nil, err
		}
		switch e.Kind {
		case Absent:
			return nil, errs.New(errs.Usage, "the chain is inconsistent: %s is incremental in a later backup but neither it nor an INCREMENTAL file is in %s",
				nd.Rel, filepath.Base(backups[k])).WithPath(backups[k]).
				WithHint("check the backups with pg_verifybackup; a backup of the chain may be damaged or from another chain")
		case Full:
			idx := int32(len(f.Sources))
			f.Sources = append(f.Sources, Source{Backup: k, Path: e.Path})
			f.Base, f.BaseBytes = int(idx), min(e.Size/pgbackup.BlockSize, int64(latest.TruncationBlocks))*pgbackup.BlockSize
			have := uint32(e.Size / pgbackup.BlockSize)
			for b := uint32(0); b < latest.TruncationBlocks && b < have; b++ {
				if srcOf[b] < 0 {
					srcOf[b], offOf[b] = idx, int64(b)*pgbackup.BlockSize
				}
			}
			if fullCopyPossible && int64(latest.TruncationBlocks)*pgbackup.BlockSize == e.Size {
				f.Sources = []Source{{Backup: k, Path: e.Path}}
				f.Older, f.Base, f.BaseBytes = true, -1, 0
				return f, nil
			}
			return f.runs(srcOf, offOf, noMerge), nil
		case Incr:
			if k == 0 {
				return nil, fullHasIncremental(filepath.Join(backups[0], filepath.FromSlash(e.Path)))
			}
			idx := int32(len(f.Sources))
			f.Sources = append(f.Sources, Source{Backup: k, Path: e.Path})
			for i, b := range e.Inc.Blocks {
				if b < latest.TruncationBlocks && srcOf[b] < 0 {
					srcOf[b], offOf[b] = idx, e.Inc.DataOffset(i)
					fullCopyPossible = false
				}
			}
		}
	}
	// Not reached: backup 0 is full or an error above.
	return f.runs(srcOf, offOf, noMerge), nil
}

// runs sets f.Runs: consecutive blocks from one source at consecutive
// offsets (or zeros) merged into one run, unless noMerge.
func (f *FilePlan) runs(srcOf []int32, offOf []int64, noMerge bool) *FilePlan {
	f.Runs = []BlockRun{}
	for b := range srcOf {
		s, off := int(srcOf[b]), offOf[b]
		if len(f.Runs) > 0 && !noMerge {
			last := &f.Runs[len(f.Runs)-1]
			if last.Source == s && (s < 0 || last.SrcOff+last.Blocks*pgbackup.BlockSize == off) {
				last.Blocks++
				continue
			}
		}
		f.Runs = append(f.Runs, BlockRun{Source: s, SrcOff: off, DstOff: int64(b) * pgbackup.BlockSize, Blocks: 1})
	}
	return f
}

// fullHasIncremental is the error for an INCREMENTAL file in a full backup:
// no older backup holds its blocks, so rebuilding it would make them up.
func fullHasIncremental(p string) error {
	return errs.New(errs.Usage, "full backup contains unexpected incremental file").WithPath(p).
		WithHint("the full backup is damaged or is not a full backup; check it with pg_verifybackup")
}
