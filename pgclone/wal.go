package pgclone

import (
	"context"
	"errors"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"sort"

	"github.com/pgfork/pgfork/clone"

	"github.com/pgfork/pgfork/internal/errs"
	"github.com/pgfork/pgfork/internal/fsutil"
	"github.com/pgfork/pgfork/pgdata"
)

// historyFileRe matches a timeline history file name (00000002.history).
var historyFileRe = regexp.MustCompile(`^[0-9A-F]{8}\.history$`)

// walPlan lists the WAL files an online clone needs.
type walPlan struct {
	Segments []string // segment file names, in order
	History  []string // timeline history files
}

// planWAL picks, in srcWAL (the source's pg_wal), every segment from the
// one holding start through the one holding stop (the last byte before it),
// on the start timeline or a later one, and every timeline history file.
// A missing segment is an error that says how to keep WAL longer.
func planWAL(srcWAL string, startTLI uint32, start, stop pgdata.LSN, segSize int64) (*walPlan, error) {
	ents, err := os.ReadDir(srcWAL)
	if err != nil {
		return nil, errs.FromOS(err, srcWAL, "cannot list the source's WAL directory")
	}
	// For each segment number, the file of the highest timeline >= startTLI.
	best := map[uint64]uint32{}
	p := &walPlan{}
	for _, e := range ents {
		name := e.Name()
		if historyFileRe.MatchString(name) {
			p.History = append(p.History, name)
			continue
		}
		tli, segno, ok := pgdata.ParseSegmentName(name, segSize)
		if !ok || tli < startTLI {
			continue
		}
		if t, seen := best[segno]; !seen || tli > t {
			best[segno] = tli
		}
	}
	first := uint64(start) / uint64(segSize)
	last := first
	if stop > start {
		last = uint64(stop-1) / uint64(segSize)
	}
	var missing []string
	for s := first; s <= last; s++ {
		tli, ok := best[s]
		if !ok {
			missing = append(missing, pgdata.SegmentName(startTLI, s, segSize))
			continue
		}
		p.Segments = append(p.Segments, pgdata.SegmentName(tli, s, segSize))
	}
	// The segment holding the stop LSN itself, when the stop LSN is exactly
	// on a segment boundary, is not needed; take it anyway when present.
	if tli, ok := best[uint64(stop)/uint64(segSize)]; ok && uint64(stop)/uint64(segSize) > last {
		p.Segments = append(p.Segments, pgdata.SegmentName(tli, uint64(stop)/uint64(segSize), segSize))
	}
	sort.Strings(p.History)
	if len(missing) > 0 {
		return nil, errs.New(errs.Internal, "the WAL between the backup's start (%s) and stop (%s) is no longer complete in the source: %d segment(s) missing, first %s (recycled or removed by a checkpoint during the copy)",
			start, stop, len(missing), missing[0]).WithPath(srcWAL).
			WithHint("keep more WAL on the source while cloning (e.g. ALTER SYSTEM SET wal_keep_size = '4GB'; SELECT pg_reload_conf();) or allow a replication slot (max_replication_slots > 0), then clone again")
	}
	return p, nil
}

// copyWAL copies the planned files from srcWAL into dstWAL, sharing blocks
// where the filesystem can. Ownership follows owner when set.
func copyWAL(ctx context.Context, srcWAL, dstWAL string, p *walPlan, owner *uidgid, sync bool) (int64, error) {
	if err := os.MkdirAll(dstWAL, 0o700); err != nil {
		if errs.OSKind(err) == errs.NoSpace {
			return 0, walNoSpace(err, dstWAL)
		}
		return 0, errs.FromOS(err, dstWAL, "cannot create the clone's WAL directory")
	}
	if afterWALDir != nil {
		afterWALDir(dstWAL)
	}
	// Files are created relative to the data directory's descriptor by
	// os.Root, which refuses a path that leaves it: a pg_wal swapped for a
	// symlink by the run-as user (who may own the staging tree's
	// directories by now) is never written through (issue 19 F4b).
	root, err := os.OpenRoot(filepath.Dir(dstWAL))
	if err != nil {
		return 0, errs.FromOS(err, dstWAL, "cannot open the clone's data directory")
	}
	defer root.Close()
	walRel := filepath.Base(dstWAL)
	var total int64
	names := append(append([]string(nil), p.History...), p.Segments...)
	for _, name := range names {
		if err := ctx.Err(); err != nil {
			return total, errs.Wrap(errs.Interrupted, err, "clone interrupted while copying WAL")
		}
		n, err := copyFileShared(filepath.Join(srcWAL, name), root, filepath.Join(walRel, name), owner, sync)
		if err != nil {
			if errors.Is(err, fs.ErrNotExist) {
				return total, errs.New(errs.Internal, "WAL file %s disappeared from the source while it was being copied", name).WithPath(srcWAL).
					WithHint("keep more WAL on the source while cloning (e.g. ALTER SYSTEM SET wal_keep_size = '4GB'), then clone again")
			}
			if errs.OSKind(err) == errs.NoSpace {
				return total, walNoSpace(err, dstWAL)
			}
			return total, errs.FromOS(err, dstWAL, "cannot copy WAL file %s from %s", name, srcWAL)
		}
		total += n
	}
	if sync {
		if err := fsutil.SyncDir(dstWAL); err != nil {
			return total, errs.FromOS(err, dstWAL, "cannot sync the clone's WAL directory")
		}
	}
	return total, nil
}

// walNoSpace is the error of a full destination while WAL is copied: it
// names the clone's pg_wal (where the space is missing), not the source's.
func walNoSpace(err error, dstWAL string) error {
	return errs.Wrap(errs.NoSpace, err, "no space left for the WAL of the clone").WithPath(dstWAL).
		WithHint("free space on the destination's filesystem (the WAL needs up to a few segments of 16 MB), or clone to another filesystem")
}

type uidgid struct{ uid, gid int }

// afterWALDir, when set (by tests), runs once copyWAL has made the clone's
// pg_wal and before it writes into it.
var afterWALDir func(dstWAL string)

// copyFileShared copies one regular file: by reflink (FICLONE) when the
// filesystem can, else with copy_file_range (which io.Copy uses between
// files), never overwriting dst, which is created under root (never outside
// it). The source is opened read-only.
func copyFileShared(src string, root *os.Root, dst string, owner *uidgid, sync bool) (int64, error) {
	sf, err := os.Open(src)
	if err != nil {
		return 0, err
	}
	defer sf.Close()
	fi, err := sf.Stat()
	if err != nil {
		return 0, err
	}
	df, err := root.OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_EXCL, fi.Mode().Perm())
	if err != nil {
		return 0, err
	}
	ok := false
	defer func() {
		if !ok {
			df.Close()
			_ = root.Remove(dst)
		}
	}()
	if err := clone.CloneFile(df, sf); err != nil {
		if _, err := df.Seek(0, io.SeekStart); err != nil {
			return 0, err
		}
		if err := df.Truncate(0); err != nil {
			return 0, err
		}
		if _, err := io.Copy(df, sf); err != nil {
			return 0, err
		}
	}
	if owner != nil {
		if err := df.Chown(owner.uid, owner.gid); err != nil {
			return 0, err
		}
	}
	if sync {
		if err := df.Sync(); err != nil {
			return 0, err
		}
	}
	ok = true
	return fi.Size(), df.Close()
}
