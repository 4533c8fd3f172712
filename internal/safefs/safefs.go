// Package safefs opens files below a directory without following symbolic
// links anywhere on the way, for root reading trees that another user can
// write (a backup someone else made, a data directory the PostgreSQL user
// owns): a symlink planted in such a tree must never make root read (and
// hand over) a file outside it. It imports nothing of pgfork's; callers
// classify its errors with errs.FromOS (ErrSymlink and ErrNotRegular are
// its own).
package safefs

import (
	"errors"
	"fmt"
	"os"
	"strings"
)

// ErrSymlink is returned when a path below the directory has a symbolic
// link in it (the last component or a directory on the way).
var ErrSymlink = errors.New("a symbolic link is in the path")

// ErrNotRegular is returned by OpenRegular for anything but a regular file
// (a directory, a FIFO, a device, a socket).
var ErrNotRegular = errors.New("not a regular file")

// Dir is an open directory below which files are opened without
// following symlinks.
type Dir struct {
	f    *os.File
	path string
}

// OpenDir opens dir itself (following symlinks in its own path: that is
// the caller's choice) for opening files below it.
func OpenDir(dir string) (*Dir, error) {
	f, err := openDirectory(dir)
	if err != nil {
		return nil, err
	}
	return &Dir{f: f, path: dir}, nil
}

// Close releases the directory.
func (d *Dir) Close() error { return d.f.Close() }

// Stat describes the directory itself.
func (d *Dir) Stat() (os.FileInfo, error) { return d.f.Stat() }

// Path is the directory's path as it was opened.
func (d *Dir) Path() string { return d.path }

// Open opens rel (slash-separated, relative, no "..") below d for reading,
// refusing a symlink anywhere in it (ErrSymlink) and never blocking on a
// FIFO. The file may be of any type.
func (d *Dir) Open(rel string) (*os.File, error) {
	if err := checkRel(rel); err != nil {
		return nil, err
	}
	return openBeneath(d, rel)
}

// OpenRegular is Open that also refuses anything but a regular file
// (ErrNotRegular), checked on the opened descriptor.
func (d *Dir) OpenRegular(rel string) (*os.File, error) {
	f, err := d.Open(rel)
	if err != nil {
		return nil, err
	}
	fi, err := f.Stat()
	if err != nil {
		f.Close()
		return nil, err
	}
	if !fi.Mode().IsRegular() {
		f.Close()
		return nil, &os.PathError{Op: "open", Path: d.join(rel), Err: fmt.Errorf("%w (%s)", ErrNotRegular, TypeName(fi.Mode()))}
	}
	return f, nil
}

// ReadFile reads the regular file rel below d, refusing one larger than
// max bytes: metadata files (a manifest, a label, PG_VERSION) are read
// whole, and a planted /dev/zero or a huge file must not fill the memory.
func (d *Dir) ReadFile(rel string, max int64) ([]byte, error) {
	f, err := d.OpenRegular(rel)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return nil, err
	}
	if fi.Size() > max {
		return nil, &os.PathError{Op: "read", Path: d.join(rel), Err: fmt.Errorf("%w: %d bytes, at most %d expected", ErrTooLarge, fi.Size(), max)}
	}
	b := make([]byte, fi.Size())
	n, err := f.ReadAt(b, 0)
	if err != nil && n != len(b) {
		return nil, err
	}
	return b[:n], nil
}

// Readlink returns the target of the symbolic link rel below d; the
// directories on the way to it are opened without following links.
func (d *Dir) Readlink(rel string) (string, error) {
	if err := checkRel(rel); err != nil {
		return "", err
	}
	parts := splitSlash(rel)
	parent := d.f
	if len(parts) > 1 {
		f, err := d.Open(strings.Join(parts[:len(parts)-1], "/"))
		if err != nil {
			return "", err
		}
		defer f.Close()
		parent = f
	}
	t, err := readlinkAt(parent, parts[len(parts)-1])
	if err != nil {
		return "", &os.PathError{Op: "readlink", Path: d.join(rel), Err: err}
	}
	return t, nil
}

// ErrTooLarge is returned by ReadFile for a file over its limit.
var ErrTooLarge = errors.New("file too large")

func (d *Dir) join(rel string) string { return d.path + "/" + rel }

func checkRel(rel string) error {
	if rel == "" || rel[0] == '/' {
		return fmt.Errorf("safefs: %q is not a relative path", rel)
	}
	for _, part := range splitSlash(rel) {
		if part == ".." {
			return fmt.Errorf("safefs: %q leaves its directory", rel)
		}
	}
	return nil
}

func splitSlash(s string) []string {
	var parts []string
	start := 0
	for i := 0; i <= len(s); i++ {
		if i == len(s) || s[i] == '/' {
			if i > start {
				parts = append(parts, s[start:i])
			}
			start = i + 1
		}
	}
	return parts
}

// TypeName names the kind of file m describes, for messages ("a FIFO",
// "a symbolic link", …).
func TypeName(m os.FileMode) string {
	switch {
	case m.IsDir():
		return "a directory"
	case m&os.ModeNamedPipe != 0:
		return "a FIFO"
	case m&os.ModeDevice != 0:
		return "a device"
	case m&os.ModeSocket != 0:
		return "a socket"
	case m&os.ModeSymlink != 0:
		return "a symbolic link"
	case m.IsRegular():
		return "a file"
	}
	return "a special file"
}

// Sub opens the directory rel below d as a Dir of its own, refusing a
// symlink anywhere in rel (ErrSymlink) and anything but a directory.
func (d *Dir) Sub(rel string) (*Dir, error) {
	f, err := d.Open(rel)
	if err != nil {
		return nil, err
	}
	fi, err := f.Stat()
	if err != nil {
		f.Close()
		return nil, err
	}
	if !fi.IsDir() {
		f.Close()
		return nil, &os.PathError{Op: "open", Path: d.join(rel), Err: fmt.Errorf("not a directory (%s)", TypeName(fi.Mode()))}
	}
	return &Dir{f: f, path: d.join(rel)}, nil
}

// maxWalkDepth bounds how deep Walk goes (and so how many directories it
// holds open at once): a data directory is a few levels deep.
const maxWalkDepth = 32

// Walk calls fn for every directory and regular file below d (not d
// itself), depth first, for measuring a tree another user can change while
// it is walked: each entry is opened relative to its parent directory's
// descriptor, never following a symbolic link and never blocking (a FIFO
// swapped in is opened non-blocking and seen for what it is), and fn gets
// it open with its Stat of the open descriptor, so that what it measures
// is what was opened, not what a path names later. Symbolic links, FIFOs,
// devices and sockets are skipped, as are entries that vanish or change
// kind meanwhile and directories deeper than 32 levels. f is closed after
// fn returns; an error from fn stops the walk and is returned.
func (d *Dir) Walk(fn func(rel string, f *os.File, fi os.FileInfo) error) error {
	return d.walk("", 0, fn)
}

func (d *Dir) walk(prefix string, depth int, fn func(rel string, f *os.File, fi os.FileInfo) error) error {
	if depth >= maxWalkDepth {
		return nil
	}
	for {
		ents, err := d.f.ReadDir(256)
		for _, e := range ents {
			t := e.Type()
			if !t.IsDir() && !t.IsRegular() {
				continue // a symlink, FIFO, device or socket: not opened at all
			}
			if err := d.walkEntry(prefix, e.Name(), depth, fn); err != nil {
				return err
			}
		}
		if err != nil || len(ents) == 0 {
			return nil // the end, or a directory that went away
		}
	}
}

func (d *Dir) walkEntry(prefix, name string, depth int, fn func(rel string, f *os.File, fi os.FileInfo) error) error {
	f, err := d.Open(name)
	if err != nil {
		return nil
	}
	fi, err := f.Stat()
	if err != nil {
		f.Close()
		return nil
	}
	rel := prefix + name
	switch {
	case fi.Mode().IsRegular():
		err = fn(rel, f, fi)
		f.Close()
		return err
	case fi.IsDir():
		sub := &Dir{f: f, path: d.join(name)}
		defer sub.Close()
		if err := fn(rel, f, fi); err != nil {
			return err
		}
		return sub.walk(rel+"/", depth+1, fn)
	}
	f.Close() // swapped for a FIFO, device or socket meanwhile
	return nil
}
