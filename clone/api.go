// Package clone copies a directory tree by the fastest method the source and
// destination filesystems allow: reflink clone (FICLONE), copy_file_range(2),
// a plain read/write copy that keeps holes, or hard links when asked. It knows
// nothing of PostgreSQL; callers shape a copy with a Filter.
//
// The destination is built in a staging directory beside it and renamed into
// place at the end, so a crash never leaves a half copy under the final name.
//
// clone owns the copy engine: methods, metadata, sparse files, workers,
// durability and staging. It must not know PostgreSQL (no pgdata, no SQL):
// what to leave out of a data directory is the caller's Filter.
package clone

import (
	"io/fs"
	"time"
)

// Method is a way to copy a file's contents.
type Method string

// Copy methods, best first. Auto probes once per (source fs, destination fs)
// pair and falls back per file when the kernel says a method cannot serve it.
const (
	Auto          Method = "auto"
	Clone         Method = "clone"
	CopyFileRange Method = "copy-file-range"
	// PlainCopy reads and writes with a large buffer, keeping holes. (Named
	// so because Copy is the function that copies a tree.)
	PlainCopy Method = "copy"
	Link      Method = "link"
)

// SyncMode is how the copy is made durable before it is renamed into place.
//
// With any mode but SyncNone, when Copy returns without error every file
// and directory of the copy is on stable storage, and so is its rename into
// place (the destination's parent directory is fsynced after the rename).
// CopyInto makes the same promise for everything inside dst; placing dst
// is the caller's business.
//
// SyncFsync (the default, as initdb) fsyncs each file through the
// descriptor that wrote it, so a write-back error always reaches the copy,
// and then each directory. The fsyncs start once every file is copied and
// run Options.SyncJobs at a time: on XFS one log force then covers many
// files, and concurrent fsyncs are committed together (1,000 clones on XFS:
// ~1.3 s fsynced one by one as they were copied; now about as fast as
// SyncFS, see bench/results/copy.md). Data copies start their write-back
// with sync_file_range while the copy goes on. pgfork uses fsync, not
// fdatasync: for new files fdatasync saves nothing measurable on XFS (it
// must log the size and extents anyway) and on ext4 it would not make
// ownership and modes durable, which PostgreSQL needs to open its files.
//
// SyncFS makes one syncfs(2) of the destination filesystem. It costs about
// the same as SyncFsync on an idle filesystem, but it also writes, and
// waits for, whatever else is dirty there (another cluster, a benchmark),
// and before Linux 5.8 it did not report write-back errors. There is no
// automatic choice between the two: which filesystems are shared with busy
// writers cannot be known from here, and fsync is never much slower.
type SyncMode string

// Durability modes, as initdb's --sync-method.
const (
	SyncNone  SyncMode = "none"
	SyncFsync SyncMode = "fsync"
	SyncFS    SyncMode = "syncfs"
)

// Action tells the copy what to do with one entry of the source tree.
type Action int

// Filter actions.
const (
	// Include copies the entry (a directory: with its contents).
	Include Action = iota
	// Skip leaves the entry out of the copy.
	Skip
	// EmptyDir copies a directory but none of its contents.
	EmptyDir
)

// Filter decides what to do with each entry. rel is the path relative to
// the source root, with '/' separators (never "." for the root itself).
type Filter func(rel string, d fs.DirEntry) Action

// Progress is reported while a copy runs. Bytes count file sizes (holes
// included), so Bytes reaches TotalBytes when the copy is done.
type Progress struct {
	Files, TotalFiles int64
	Bytes, TotalBytes int64
}

// Owner sets the ownership of everything copied (used when pgfork runs as
// root and the copy must belong to the PostgreSQL OS user).
type Owner struct{ UID, GID int }

// Summary describes a finished copy.
type Summary struct {
	Files       int64            `json:"files"`
	Dirs        int64            `json:"dirs"` // directories below the root
	Symlinks    int64            `json:"symlinks"`
	Bytes       int64            `json:"bytes"`        // total size of the files copied (holes included)
	SharedBytes int64            `json:"shared_bytes"` // bytes shared with the source by copy-on-write
	Methods     map[Method]int64 `json:"methods"`      // files copied per method
	Sync        SyncMode         `json:"sync"`
	Vanished    int64            `json:"vanished,omitempty"` // entries that disappeared mid-copy (TolerateVanished)
	Elapsed     time.Duration    `json:"elapsed_ns"`
}

// Extent is one range of a file's data on disk (FIEMAP on Linux).
type Extent struct {
	// Logical is the offset in the file, Physical on the device, both in
	// bytes, as Length.
	Logical, Physical, Length uint64
	// Shared: the filesystem says another file (or another range) uses
	// these blocks too (a reflink).
	Shared bool
	// Placed: Physical is a plain range of blocks of this extent's own
	// (not delayed allocation, inline or packed data): ranges that are
	// Placed may be compared between files.
	Placed bool
}
