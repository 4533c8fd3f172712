package branches

import (
	"context"
	"fmt"
	"path/filepath"

	"github.com/pgfork/pgfork/clone"
	"github.com/pgfork/pgfork/internal/units"
	"github.com/pgfork/pgfork/restore"
)

// Notice is said (Options.OnNotice) before a source's data is copied into
// the state directory byte by byte although the source's filesystem
// clones: the state directory is on another filesystem, so the snapshot
// a branch starts from is a full copy, which takes time and space in
// proportion to the source's size (docs/branches.md, "Where the data
// goes"). The fix is to keep the state directory on the source's
// filesystem (or the source on the state directory's).
type Notice struct {
	Source string `json:"source"` // the source's name
	From   string `json:"from"`   // its data directory, or its backup chain
	To     string `json:"to"`     // the state directory, or DataDir's parent
	// DataDir is the branch's data directory the user named
	// (CreateOptions.DataDir): its filesystem is the one the source is
	// copied to, not the state directory's.
	DataDir string `json:"data_dir,omitempty"`
	clone.Crossing
	Bytes int64 `json:"bytes"` // about how much is copied
	// NoStore, when set, says why the branch was not put in a branch
	// store beside the source (store.go), where it would have been a
	// clone: the store's parent is not safe to write in as root, cannot
	// be written, or is not on a filesystem that clones from the source.
	NoStore string `json:"no_store,omitempty"`
}

// String is the notice in one line, for a log.
func (n Notice) String() string {
	if n.DataDir != "" {
		return fmt.Sprintf("source %s is copied, not cloned: about %s from %s (%s) into %s (%s), another filesystem; "+
			"give a data directory on the filesystem of %s to clone it", n.Source, units.Bytes(n.Bytes), n.From, n.SrcFS,
			n.DataDir, n.DstFS, n.From)
	}
	store := ""
	if n.NoStore != "" {
		store = "; not in a branch store beside the source: " + n.NoStore
	}
	return fmt.Sprintf("source %s is copied, not cloned: about %s from %s (%s) into %s (%s), another filesystem%s; "+
		"keep the state directory on the filesystem of %s to clone it", n.Source, units.Bytes(n.Bytes), n.From, n.SrcFS,
		n.To, n.DstFS, store, n.From)
}

// noticeCrossing tells Options.OnNotice, before source s's data is copied
// into the snapshot directory dst, that the copy is not a clone though
// s's filesystem clones (clone.CrossesFS), with about how many bytes it
// copies. Every snapshot of a source made outside the state directory
// (a cluster's, a backup chain's) calls it first; a standby lives in the
// state directory. Nothing is said when it cannot tell.
//
// dataDir is the data directory the user named for the branch ("" for
// none: the snapshot goes to the state directory); noStore, why no branch
// store was used (Notice.NoStore).
func (m *Manager) noticeCrossing(ctx context.Context, s Source, dst, dataDir, noStore string) {
	if m.o.OnNotice == nil || s.Kind == SourceStandby {
		return
	}
	// A backup source's full backup holds most of the data.
	from, sample, dirs, err := s.sample()
	if err != nil {
		return
	}
	c, err := clone.CrossesFS(ctx, sample, filepath.Dir(dst))
	if err != nil || c == nil {
		return
	}
	n := Notice{Source: s.Name, From: from, To: m.o.Layout.Root, Crossing: *c, NoStore: noStore}
	if dataDir != "" {
		n.To, n.DataDir = filepath.Dir(dataDir), dataDir
	}
	if dirs == nil {
		n.Bytes = clone.TreeBytes(s.DataDir)
	} else if d, err := restore.PlanOnly(dirs, dst, restore.Options{}); err == nil {
		n.Bytes = d.NeedBytes
	} else {
		n.Bytes = clone.TreeBytes(dirs[0])
	}
	m.o.OnNotice(n)
}
