// Package fsutil owns pgfork's durability rules for files it writes itself:
// syncing a directory or a whole filesystem, and replacing a small file
// atomically (WriteFileAtomic). Every package that writes a state file, a
// marker or a configuration file it must not lose goes through here, so the
// rule ("temp file beside it, write, fsync, rename, fsync the directory") is
// written once.
//
// fsutil imports nothing of pgfork's and returns the operating system's
// errors as they are (*fs.PathError): callers classify them with
// errs.FromOS, naming what they were doing.
package fsutil

import (
	"crypto/rand"
	"encoding/hex"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
)

// SyncDir fsyncs the directory dir, so that the entries created, renamed or
// removed in it survive a crash of the machine.
func SyncDir(dir string) error {
	f, err := os.Open(dir)
	if err != nil {
		return err
	}
	err = f.Sync()
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return &fs.PathError{Op: "fsync", Path: dir, Err: unwrapPath(err)}
	}
	return nil
}

// WriteFileAtomic replaces path with data (mode perm) so that a reader, and
// the file after a crash of the machine, holds either the old content or the
// new one, never a part: a temporary file beside path, written and fsynced,
// renamed over path, then path's directory fsynced. The temporary file is
// removed when anything fails.
func WriteFileAtomic(path string, data []byte, perm fs.FileMode) error {
	return writeAtomic(path, data, perm, true)
}

// ReplaceFile is WriteFileAtomic without the fsyncs: readers never see a
// part of the file, but a crash of the machine may lose the new content.
// For files that do not outlive a crash anyway (records of test clusters).
func ReplaceFile(path string, data []byte, perm fs.FileMode) error {
	return writeAtomic(path, data, perm, false)
}

func writeAtomic(path string, data []byte, perm fs.FileMode, durable bool) error {
	dir, base := filepath.Split(path)
	if dir == "" {
		dir = "."
	}
	f, err := os.CreateTemp(dir, "."+base+".tmp-*")
	if err != nil {
		return err
	}
	tmp := f.Name()
	ok := false
	defer func() {
		if !ok {
			_ = os.Remove(tmp)
		}
	}()
	_, err = f.Write(data)
	if err == nil {
		err = f.Chmod(perm)
	}
	if err == nil && durable {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return &fs.PathError{Op: "write", Path: path, Err: unwrapPath(err)}
	}
	if err := os.Rename(tmp, path); err != nil {
		return err
	}
	ok = true
	if durable {
		return SyncDir(dir)
	}
	return nil
}

func unwrapPath(err error) error {
	if pe, ok := err.(*fs.PathError); ok {
		return pe.Err
	}
	return err
}

// Within reports whether path p is dir or below it, by their names (both
// absolute and clean; resolve symlinks first where that matters). The one
// "is this inside that" check of pgfork's packages.
func Within(p, dir string) bool {
	if p == dir {
		return true
	}
	rel, err := filepath.Rel(dir, p)
	return err == nil && rel != ".." && !filepath.IsAbs(rel) && !strings.HasPrefix(rel, "../")
}

// WithinByID reports whether the directory p is dir or below it, whatever
// the spelling: p is resolved (symlinks, "..") and each of its ancestors
// compared with dir by device and inode, so a symlinked path or a bind
// mount of dir is caught too. A p or dir that cannot be read is not within.
func WithinByID(p, dir string) bool {
	abs, err := filepath.Abs(p)
	if err != nil {
		return false
	}
	want, err := os.Stat(dir)
	if err != nil {
		return false
	}
	if real, err := filepath.EvalSymlinks(abs); err == nil {
		abs = real
	}
	for q := abs; ; q = filepath.Dir(q) {
		if fi, err := os.Stat(q); err == nil && os.SameFile(fi, want) {
			return true
		}
		if q == filepath.Dir(q) {
			return false
		}
	}
}

// RandomTag is 8 random hex digits, for names that must not be guessed
// (staging and trash directories beside a destination).
func RandomTag() string {
	var b [4]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}
