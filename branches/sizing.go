package branches

import (
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"syscall"

	"github.com/pgfork/pgfork/clone"
	"github.com/pgfork/pgfork/internal/fsutil"
	"github.com/pgfork/pgfork/internal/safefs"
)

// Sizing reads trees another user writes: a branch's data directory
// belongs to the servers' OS user, which a branch's clients may drive. So
// it is never done under the Manager's lock (List and Get take what they
// size under it, then measure without it: a slow or hostile tree delays
// only the request that sizes it), and every file is opened through
// safefs.Walk (relative to its parent's descriptor, no symlink followed,
// non-blocking, regular files only): a FIFO or a symlink to a root-only
// file planted in a data directory is skipped, never waited on or counted.
//
// What a branch owns (MaxOwnBytes): the disk blocks its files use that its
// snapshot's files do not. Both are mapped with FIEMAP into physical
// ranges; the branch's ranges are merged (a block two of its files share,
// as after CREATE DATABASE ... STRATEGY FILE_COPY on a reflink filesystem,
// counts once, and as its own), and what of them lies in the snapshot's
// ranges is shared; the rest is its own, even when the filesystem marks it
// shared with something else (a snapshot made of the branch, which exists
// only because of it). The FIEMAP "shared" flag alone cannot tell sharing
// with the snapshot from sharing among the branch's own files. The cost is
// one FIEMAP pass over the branch's files per sizing and one over the
// snapshot's, kept while the snapshot lives (a snapshot never changes),
// with memory for their extents. Where a filesystem maps no files (tmpfs)
// a file's allocated blocks are all its own, as on a filesystem without
// reflinks, where a branch's copy shares nothing.

// span is a range of physical bytes [start, end).
type span struct{ start, end uint64 }

// spans is a set of physical ranges, sorted and merged.
type spans []span

// mergeSpans sorts xs and merges the ranges that overlap or touch.
func mergeSpans(xs []span) spans {
	sort.Slice(xs, func(i, j int) bool { return xs[i].start < xs[j].start })
	var out spans
	for _, x := range xs {
		if x.end <= x.start {
			continue
		}
		if n := len(out); n > 0 && x.start <= out[n-1].end {
			if x.end > out[n-1].end {
				out[n-1].end = x.end
			}
			continue
		}
		out = append(out, x)
	}
	return out
}

func (s spans) bytes() int64 {
	var n int64
	for _, x := range s {
		n += int64(x.end - x.start)
	}
	return n
}

// common is how many bytes s and t (both merged) have in common.
func (s spans) common(t spans) int64 {
	var n int64
	for i, j := 0, 0; i < len(s) && j < len(t); {
		lo, hi := max(s[i].start, t[j].start), min(s[i].end, t[j].end)
		if lo < hi {
			n += int64(hi - lo)
		}
		if s[i].end < t[j].end {
			i++
		} else {
			j++
		}
	}
	return n
}

// blocksOf is the disk a file's stat says it has allocated.
func blocksOf(fi os.FileInfo) int64 {
	if st, ok := fi.Sys().(*syscall.Stat_t); ok {
		return st.Blocks * 512
	}
	return fi.Size()
}

// tree is a directory to size: rel below base, both opened without
// following a link below base.
type tree struct{ base, rel string }

// walkFiles calls fn with every regular file below the trees (each
// opened below its base without following a link), each open
// (safefs.Walk); missing ones are skipped.
func (m *Manager) walkFiles(trees []tree, fn func(f *os.File, fi os.FileInfo)) {
	for _, t := range trees {
		root, err := safefs.OpenDir(t.base)
		if err != nil {
			continue
		}
		d, err := root.Sub(t.rel)
		root.Close()
		if err != nil {
			continue
		}
		_ = d.Walk(func(_ string, f *os.File, fi os.FileInfo) error {
			if fi.Mode().IsRegular() {
				fn(f, fi)
			}
			return nil
		})
		d.Close()
	}
}

// branchTrees is what a branch's files are: its data directory and the
// targets of its tablespace links (pg_tblspc/OID) where copies put a
// branch's tablespaces (tblspc/NAME, tablespaces.go; or its snapshot's: a
// branch's role, not a superuser, cannot make a tablespace elsewhere; a
// link elsewhere is not followed), all in the branch's home (or, for the
// data directory the user named, below its parent).
func (m *Manager) branchTrees(j sizeJob) []tree {
	store := m.store(j.home)
	data := tree{store, "data/" + j.name}
	if j.dataDir != "" {
		data = tree{filepath.Dir(j.dataDir), filepath.Base(j.dataDir)}
	}
	trees := []tree{data}
	places := []string{filepath.Join(store, "tblspc", j.name), filepath.Join(store, "snap", j.snap+".tblspc")}
	root, err := safefs.OpenDir(data.base)
	if err != nil {
		return trees
	}
	defer root.Close()
	f, err := root.Open(data.rel + "/pg_tblspc")
	if err != nil {
		return trees
	}
	ents, _ := f.ReadDir(-1)
	f.Close()
	for _, e := range ents {
		if e.Type()&os.ModeSymlink == 0 {
			continue // an in-place tablespace: in the data directory's walk
		}
		t, err := root.Readlink(data.rel + "/pg_tblspc/" + e.Name())
		if err != nil || !filepath.IsAbs(t) {
			continue
		}
		t = filepath.Clean(t)
		for _, p := range places {
			if rel, err := filepath.Rel(store, t); err == nil && fsutil.Within(t, p) && t != p {
				trees = append(trees, tree{store, filepath.ToSlash(rel)})
				break
			}
		}
	}
	return trees
}

// snapshotTrees is what a snapshot's files are: its data directory and
// the tablespaces its clone copied beside it, in its home.
func (m *Manager) snapshotTrees(home, name string, backups []string) []tree {
	if len(backups) > 0 { // what it restores (direct.go): its branch shares their blocks
		trees := make([]tree, len(backups))
		for i, d := range backups {
			trees[i] = tree{filepath.Dir(d), filepath.Base(d)}
		}
		return trees
	}
	store := m.store(home)
	return []tree{{store, "snap/" + name}, {store, "snap/" + name + ".tblspc"}}
}

// extentsOf maps the files below rels: their physical ranges (merged),
// and the bytes that have no comparable range (delayed allocation, inline
// data, a filesystem without FIEMAP).
func (m *Manager) extentsOf(trees []tree) (spans, int64) {
	var xs []span
	var loose int64
	m.walkFiles(trees, func(f *os.File, fi os.FileInfo) {
		var part []span
		var partLoose int64
		ok, err := clone.Extents(f, func(x clone.Extent) {
			if x.Placed {
				part = append(part, span{x.Physical, x.Physical + x.Length})
			} else {
				partLoose += int64(x.Length)
			}
		})
		switch {
		case err != nil: // changed meanwhile: measured next time
		case !ok:
			loose += blocksOf(fi)
		default:
			xs = append(xs, part...)
			loose += partLoose
		}
	})
	return mergeSpans(xs), loose
}

// snapKey names a snapshot's extents in the cache: its name and creation
// time (a name may be used again once its snapshot is removed).
func snapKey(s *Snapshot) string {
	if s == nil {
		return ""
	}
	return s.Name + "@" + strconv.FormatInt(s.Created.UnixNano(), 10)
}

// snapshotExtents is the physical ranges of a snapshot's files, mapped
// once per snapshot: a snapshot's files never change.
func (m *Manager) snapshotExtents(home, name, key string, backups []string) spans {
	if key == "" {
		return nil
	}
	m.sizeMu.Lock()
	s, ok := m.snapExtents[key]
	m.sizeMu.Unlock()
	if ok {
		return s
	}
	s, _ = m.extentsOf(m.snapshotTrees(home, name, backups))
	m.sizeMu.Lock()
	if m.snapExtents == nil {
		m.snapExtents = map[string]spans{}
	}
	m.snapExtents[key] = s
	m.sizeMu.Unlock()
	return s
}

// forgetExtents drops the cached extents of snapshots not in live.
func (m *Manager) forgetExtents(live map[string]bool) {
	m.sizeMu.Lock()
	defer m.sizeMu.Unlock()
	for k := range m.snapExtents {
		if !live[k] {
			delete(m.snapExtents, k)
		}
	}
}

// branchUsage is the disk branch name uses (each block once) and how much
// of it is shared with its snapshot: size-shared is its own. Called
// without the Manager's lock.
func (m *Manager) branchUsage(j sizeJob) (size, shared int64) {
	own, loose := m.extentsOf(m.branchTrees(j))
	shared = own.common(m.snapshotExtents(j.home, j.snap, j.snapKey, j.backups))
	return own.bytes() + loose, shared
}

// snapshotUsage is the disk a snapshot's files use and how much of it the
// filesystem marks shared with other files. Called without the lock.
func (m *Manager) snapshotUsage(home, name string) (size, shared int64) {
	m.walkFiles(m.snapshotTrees(home, name, nil), func(f *os.File, fi os.FileInfo) {
		size += blocksOf(fi)
		if n, err := clone.SharedBytesOf(f); err == nil {
			shared += n
		}
	})
	return size, shared
}

// sizeJob is a branch to size once the lock is released.
type sizeJob struct {
	name, snap, snapKey string
	home, dataDir       string
	backups             []string // what its snapshot restores (direct.go)
}

// job is what sizing branch b needs, taken under the lock.
func (m *Manager) job(b *Branch) sizeJob {
	j := sizeJob{name: b.Name, snap: b.Snapshot, snapKey: snapKey(m.snapshot(b.Snapshot)), home: b.Home, dataDir: b.DataDir}
	for _, r := range m.backupsOf(b) {
		j.backups = append(j.backups, r.Dir)
	}
	return j
}

// ownUse is what the caller's branches use of their own, for the disk
// quota (0 without one or for an admin): the branches are taken under the
// lock, sized without it.
func (m *Manager) ownUse(c Caller) int64 {
	if m.o.MaxOwnBytes <= 0 || m.admin(c) {
		return 0
	}
	owner := Owner(c.Token)
	m.mu.Lock()
	var jobs []sizeJob
	for _, b := range m.st.Branches {
		if b.Owner == owner {
			jobs = append(jobs, m.job(b))
		}
	}
	m.mu.Unlock()
	var n int64
	for _, j := range jobs {
		size, shared := m.branchUsage(j)
		n += size - shared
	}
	return n
}
