package upgrade

import (
	"context"
	"fmt"
	"io/fs"
	"path/filepath"
	"sort"
	"strings"

	"github.com/pgfork/pgfork/clone"
	"github.com/pgfork/pgfork/internal/errs"
	"github.com/pgfork/pgfork/internal/units"
)

// fsInfo is what pgfork learned about the filesystems involved.
type fsInfo struct {
	sameFS    bool   // old data dir and NEW_DATADIR's parent on one filesystem
	newFSType string // filesystem type of NEW_DATADIR's parent
	newProbe  *clone.ProbeResult
	// oldCanClone: the old data directory's filesystem clones files with
	// shared blocks (so a rehearsal clone costs seconds and little space).
	oldCanClone bool
	oldFSType   string
}

// probeFS probes the filesystems of the old data directory and of
// NEW_DATADIR's parent with real test files. The old data directory itself
// is never written: its filesystem is probed in its parent directory, when
// that is on the same filesystem.
func probeFS(ctx context.Context, oldDir, newDir string) (*fsInfo, error) {
	fi := &fsInfo{}
	newParent := filepath.Dir(newDir)
	oldParent := filepath.Dir(oldDir)
	dOld, err := devOf(oldDir)
	if err != nil {
		return nil, errs.FromOS(err, oldDir, "cannot stat the old data directory")
	}
	dNew, err := devOf(newParent)
	if err != nil {
		return nil, errs.Wrap(errs.NotFound, err, "the parent directory of the new data directory does not exist").WithPath(newParent).
			WithHint("create it first; pgfork creates the new data directory itself")
	}
	dOldParent, _ := devOf(oldParent)
	fi.sameFS = dOld == dNew
	if fi.newProbe, err = clone.Probe(ctx, newParent, newParent); err != nil {
		return nil, err
	}
	fi.newFSType = fi.newProbe.FSType
	fi.oldFSType, _ = clone.FSType(oldDir)
	switch {
	case fi.sameFS:
		fi.oldCanClone = fi.newProbe.Clone && fi.newProbe.SharesBlocks
	case dOldParent == dOld:
		p, err := clone.Probe(ctx, oldParent, oldParent)
		if err == nil {
			fi.oldCanClone = p.Clone && p.SharesBlocks
		}
	}
	return fi, nil
}

// chooseMode resolves Auto and checks an explicit mode against what the
// filesystems and the new PostgreSQL build can do.
func chooseMode(want Mode, newMajor int, fi *fsInfo) (Mode, string, error) {
	p := fi.newProbe
	canClone := fi.sameFS && p.Clone
	canCFR := p.CopyFileRange && newMajor >= 17
	switch want {
	case Auto:
		switch {
		case canClone:
			return Clone, fmt.Sprintf("both directories are on one %s filesystem that clones files (copy-on-write): data is shared, not copied", fi.newFSType), nil
		case fi.sameFS && canCFR:
			return CopyFileRange, fmt.Sprintf("%s cannot clone files; copy_file_range copies them in the kernel", fi.newFSType), nil
		case !fi.sameFS:
			return Copy, "the old and new data directories are on different filesystems: files must be copied", nil
		default:
			return Copy, fmt.Sprintf("%s can neither clone files nor copy_file_range with PostgreSQL %d", fi.newFSType, newMajor), nil
		}
	case Clone:
		if !canClone {
			why := fmt.Sprintf("the %s filesystem cannot clone files", fi.newFSType)
			if !fi.sameFS {
				why = "the old and new data directories are on different filesystems"
			}
			return "", "", errs.New(errs.Unsupported, "the clone mode is not possible here: %s", why).
				WithHint("let pgfork pick the fastest mode that works here (clone needs XFS with reflink, btrfs or ZFS ≥ 2.2, with both directories on it)").
				WithCLI("use --mode auto")
		}
	case CopyFileRange:
		if newMajor < 17 {
			return "", "", errs.New(errs.Unsupported, "the copy-file-range mode needs pg_upgrade 17 or newer, not %d", newMajor).
				WithHint("let pgfork pick the mode, or copy").WithCLI("use --mode auto or copy")
		}
		if !p.CopyFileRange {
			return "", "", errs.New(errs.Unsupported, "copy_file_range does not work on this %s filesystem", fi.newFSType).
				WithHint("let pgfork pick the mode, or copy").WithCLI("use --mode auto or copy")
		}
	case Link:
		if !fi.sameFS {
			return "", "", errs.New(errs.Unsupported, "the link mode needs both data directories on one filesystem").
				WithHint("put the new data directory on the old cluster's filesystem, or let pgfork pick the mode").WithCLI("or use --mode auto")
		}
	case Swap:
		if newMajor < 18 {
			return "", "", errs.New(errs.Unsupported, "the swap mode needs pg_upgrade 18 or newer, not %d", newMajor).
				WithHint("use the link mode, or let pgfork pick the mode").WithCLI("use --mode link or auto")
		}
		if !fi.sameFS {
			return "", "", errs.New(errs.Unsupported, "the swap mode needs both data directories on one filesystem").
				WithHint("put the new data directory on the old cluster's filesystem, or let pgfork pick the mode").WithCLI("or use --mode auto")
		}
	}
	return want, "asked for", nil
}

// catalogAllowance estimates what a new cluster needs besides the user's
// data: its own catalogs (pg_upgrade restores every database's schema, about
// 8 MB of catalogs each), WAL and headroom.
func catalogAllowance(dbs int) int64 { return 128<<20 + int64(dbs)*12<<20 }

// spaceNeed is the free space an upgrade needs, per filesystem.
type spaceNeed struct {
	dev   uint64
	path  string // a directory on that filesystem, for messages and statfs
	bytes int64
	what  string
}

// oldSizes measures the old cluster: bytes of the data directory (without
// pg_wal) and of each tablespace's version directory, and its databases.
type oldSizes struct {
	dataBytes int64
	tsBytes   map[string]int64 // tablespace location → bytes
	dbs       int
	// userData is the apparent size of the databases' files (base and the
	// tablespaces): what pg_upgrade transfers, for progress and the result.
	userData int64
}

// measureOld walks the old cluster once (each file is stat'ed once: with
// thousands of databases there are hundreds of thousands).
func measureOld(oldDir string, tss []Tablespace) oldSizes {
	s := oldSizes{tsBytes: map[string]int64{}}
	ents, _ := filepath.Glob(filepath.Join(oldDir, "*"))
	for _, p := range ents {
		if filepath.Base(p) == "pg_wal" {
			continue
		}
		b, a := sizeOf(p)
		s.dataBytes += b
		if filepath.Base(p) == "base" {
			s.userData += a
		}
	}
	dbs, _ := filepath.Glob(filepath.Join(oldDir, "base", "*"))
	s.dbs = len(dbs)
	for _, ts := range tss {
		b, a := sizeOf(filepath.Join(ts.Location, ts.VersionDir))
		s.tsBytes[ts.Location] = b
		s.userData += a
	}
	return s
}

func (s oldSizes) total() int64 {
	n := s.dataBytes
	for _, b := range s.tsBytes {
		n += b
	}
	return n
}

// checkSpace refuses when a filesystem has less free space than the needs
// on it add up to.
func checkSpace(needs []spaceNeed, mode Mode) error {
	byDev := map[uint64]*spaceNeed{}
	var order []uint64
	for _, n := range needs {
		if n.bytes <= 0 {
			continue
		}
		if d, ok := byDev[n.dev]; ok {
			d.bytes += n.bytes
			d.what += " and " + n.what
			continue
		}
		c := n
		byDev[n.dev] = &c
		order = append(order, n.dev)
	}
	sort.Slice(order, func(i, j int) bool { return order[i] < order[j] })
	for _, dev := range order {
		n := byDev[dev]
		free, err := freeBytes(n.path)
		if err != nil {
			continue
		}
		if free < n.bytes {
			hint := "free some space there"
			if mode == Copy || mode == CopyFileRange {
				hint += ", or put the new data directory on a filesystem that clones (XFS with reflink, btrfs) with the old cluster, or use the link mode"
			}
			return errs.New(errs.NoSpace, "not enough free space for %s: about %s needed, %s free",
				n.what, units.Bytes(n.bytes), units.Bytes(free)).WithPath(n.path).WithHint("%s", hint)
		}
	}
	return nil
}

// transferStats says how the new cluster's files relate to the old one's:
// bytes shared with it (reflinked extents, or hard links) and bytes copied.
// pg_upgrade --clone, --link and --swap fail rather than fall back to a
// copy, and --copy copies, so for those the answer is known without
// looking at the files (a walk with one FIEMAP per file costs tens of
// seconds with thousands of databases); copy_file_range shares blocks on
// some filesystems only, so there the new files are examined.
func transferStats(mode Mode, roots []string, userData int64) (shared, copied int64) {
	switch mode {
	case Clone, Link, Swap:
		return userData, 0
	case Copy:
		return 0, userData
	}
	var total int64
	for _, root := range roots {
		_ = filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
			if err != nil || !d.Type().IsRegular() {
				return nil
			}
			fi, err := d.Info()
			if err != nil {
				return nil
			}
			total += fi.Size()
			if fi.Size() > 0 && !strings.HasSuffix(p, "pg_control") {
				if n, err := clone.SharedBytes(p); err == nil {
					shared += min(n, fi.Size())
				}
			}
			return nil
		})
	}
	return shared, max(total-shared, 0)
}
