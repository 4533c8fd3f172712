package upgrade

import (
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"syscall"

	"github.com/pgfork/pgfork/clone"
)

// devOf returns the device number of the filesystem holding path.
func devOf(path string) (uint64, error) {
	var st syscall.Stat_t
	if err := syscall.Stat(path, &st); err != nil {
		return 0, err
	}
	return uint64(st.Dev), nil
}

// freeBytes returns the bytes available to unprivileged users on path's fs.
func freeBytes(path string) (int64, error) { return clone.FreeBytes(path) }

// sizeOf returns the bytes allocated by the regular files under root
// (following no symlinks) and the sum of their sizes.
func sizeOf(root string) (allocated, apparent int64) {
	_ = filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil || !d.Type().IsRegular() {
			return nil
		}
		fi, err := d.Info()
		if err != nil {
			return nil
		}
		apparent += fi.Size()
		if st, ok := fi.Sys().(*syscall.Stat_t); ok {
			allocated += st.Blocks * 512
		} else {
			allocated += fi.Size()
		}
		return nil
	})
	return allocated, apparent
}

// fileState is what a snapshot remembers of one entry.
type fileState struct {
	mode  fs.FileMode
	size  int64
	mtime int64
	link  string
}

// snapshot records every entry under the roots (path, type, size, mtime,
// symlink target): a cheap way to prove a tree was not written, without
// reading the data.
type snapshot map[string]fileState

func takeSnapshot(roots ...string) (snapshot, error) {
	s := snapshot{}
	for _, root := range roots {
		err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
			if err != nil {
				return err
			}
			fi, err := d.Info()
			if err != nil {
				return err
			}
			st := fileState{mode: fi.Mode()}
			if fi.Mode().IsRegular() {
				st.size, st.mtime = fi.Size(), fi.ModTime().UnixNano()
			}
			if fi.Mode()&fs.ModeSymlink != 0 {
				st.link, _ = os.Readlink(p)
			}
			s[p] = st
			return nil
		})
		if err != nil {
			return nil, err
		}
	}
	return s, nil
}

// diff lists up to max differences between two snapshots.
func (s snapshot) diff(t snapshot, max int) []string {
	var out []string
	for p, a := range s {
		b, ok := t[p]
		switch {
		case !ok:
			out = append(out, "removed "+p)
		case a != b:
			out = append(out, "changed "+p)
		}
	}
	for p := range t {
		if _, ok := s[p]; !ok {
			out = append(out, "added "+p)
		}
	}
	sort.Strings(out)
	if len(out) > max {
		out = append(out[:max], fmt.Sprintf("... and %d more", len(out)-max))
	}
	return out
}
