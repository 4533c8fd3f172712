package clone

import (
	"bytes"
	"crypto/sha256"
	"io"
	"io/fs"
	"math/rand/v2"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

var isRoot = os.Geteuid() == 0

// Owners given to parts of the test tree when tests run as root.
const (
	otherUID = 1234
	otherGID = 2345
)

func writeRandom(t testing.TB, p string, size int64, seed uint64) {
	t.Helper()
	f, err := os.Create(p)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	r := rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
	buf := make([]byte, 1<<20)
	for left := size; left > 0; {
		n := min(left, int64(len(buf)))
		for i := 0; i < int(n); i += 8 {
			v := r.Uint64()
			for j := 0; j < 8 && i+j < int(n); j++ {
				buf[i+j] = byte(v >> (8 * j))
			}
		}
		if _, err := f.Write(buf[:n]); err != nil {
			t.Fatal(err)
		}
		left -= n
	}
	if err := f.Sync(); err != nil {
		t.Fatal(err)
	}
}

// writeSparse writes a file of the given size with 1 MiB of random data at
// each offset and holes elsewhere.
func writeSparse(t testing.TB, p string, size int64, offsets ...int64) {
	t.Helper()
	f, err := os.Create(p)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	r := rand.New(rand.NewPCG(uint64(size), 7))
	buf := make([]byte, 1<<20)
	for _, off := range offsets {
		for i := range buf {
			buf[i] = byte(r.Uint32() | 1)
		}
		if _, err := f.WriteAt(buf, off); err != nil {
			t.Fatal(err)
		}
	}
	if err := f.Truncate(size); err != nil {
		t.Fatal(err)
	}
	if err := f.Sync(); err != nil {
		t.Fatal(err)
	}
}

func must(t testing.TB, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

var baseTime = time.Date(2021, 3, 4, 5, 6, 7, 123456789, time.UTC)

// makeTree builds a source tree with every kind of entry the engine must
// keep: contents of various sizes, modes, empty and read-only directories,
// symlinks (relative, absolute, dangling), a fifo, a sparse file, distinct
// mtimes, and (as root) files owned by another user.
func makeTree(t testing.TB, root string) {
	t.Helper()
	must(t, os.MkdirAll(filepath.Join(root, "base", "1"), 0o755))
	must(t, os.MkdirAll(filepath.Join(root, "global"), 0o700))
	must(t, os.MkdirAll(filepath.Join(root, "empty", "nested-empty"), 0o750))
	must(t, os.MkdirAll(filepath.Join(root, "ro"), 0o755))
	writeRandom(t, filepath.Join(root, "base", "1", "1259"), 8192, 1)
	writeRandom(t, filepath.Join(root, "base", "1", "16384"), 3<<20+17, 2)
	writeRandom(t, filepath.Join(root, "base", "1", "one-byte"), 1, 3)
	writeRandom(t, filepath.Join(root, "global", "pg_control"), 8192, 4)
	writeRandom(t, filepath.Join(root, "ro", "inside"), 100_000, 5)
	must(t, os.WriteFile(filepath.Join(root, "empty-file"), nil, 0o600))
	must(t, os.WriteFile(filepath.Join(root, "PG_VERSION"), []byte("15\n"), 0o640))
	must(t, os.WriteFile(filepath.Join(root, "script.sh"), []byte("#!/bin/sh\necho hi\n"), 0o755))
	writeSparse(t, filepath.Join(root, "sparse"), 20<<20, 0, 10<<20)
	must(t, os.Symlink("base/1", filepath.Join(root, "link-rel")))
	must(t, os.Symlink("/nonexistent/target", filepath.Join(root, "link-dangling")))
	must(t, os.Symlink(filepath.Join(root, "PG_VERSION"), filepath.Join(root, "link-abs")))
	must(t, unix.Mkfifo(filepath.Join(root, "fifo"), 0o620))
	must(t, os.Chmod(filepath.Join(root, "global", "pg_control"), 0o400))
	if isRoot {
		must(t, os.Lchown(filepath.Join(root, "base", "1", "1259"), otherUID, otherGID))
		must(t, os.Lchown(filepath.Join(root, "global"), otherUID, otherGID))
		must(t, os.Lchown(filepath.Join(root, "link-rel"), otherUID, otherGID))
		must(t, os.Chmod(filepath.Join(root, "script.sh"), 0o755|fs.ModeSetgid))
	}
	// Distinct mtimes, deepest first so directories keep theirs.
	var paths []string
	must(t, filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		paths = append(paths, p)
		return err
	}))
	sort.Slice(paths, func(i, j int) bool { return len(paths[i]) > len(paths[j]) })
	for i, p := range paths {
		ts := baseTime.Add(time.Duration(i) * 1_000_003 * time.Microsecond)
		must(t, lutimes(p, ts.Add(-time.Hour), ts))
	}
	must(t, os.Chmod(filepath.Join(root, "ro"), 0o555))
	must(t, lutimes(filepath.Join(root, "ro"), baseTime, baseTime.Add(time.Minute)))
}

type node struct {
	mode     fs.FileMode
	size     int64
	mtime    time.Time
	uid, gid uint32
	blocks   int64
	ino      uint64
	dev      uint64 // with ino, the file's identity: inode numbers repeat across filesystems
	sum      [32]byte
	target   string
}

func scan(t testing.TB, root string) map[string]node {
	t.Helper()
	out := map[string]node{}
	must(t, filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, p)
		fi, err := d.Info()
		if err != nil {
			return err
		}
		st := fi.Sys().(*syscall.Stat_t)
		n := node{mode: fi.Mode(), size: fi.Size(), mtime: fi.ModTime(), uid: st.Uid, gid: st.Gid, blocks: st.Blocks, ino: st.Ino, dev: uint64(st.Dev)}
		switch {
		case fi.Mode().IsRegular():
			f, err := os.Open(p)
			if err != nil {
				return err
			}
			h := sha256.New()
			_, err = io.Copy(h, f)
			f.Close()
			if err != nil {
				return err
			}
			copy(n.sum[:], h.Sum(nil))
		case fi.Mode()&fs.ModeSymlink != 0:
			n.target, _ = os.Readlink(p)
		}
		if fi.IsDir() {
			n.size = 0
		}
		out[rel] = n
		return nil
	}))
	return out
}

// compareTrees checks dst is a faithful copy of src.
func compareTrees(t testing.TB, src, dst string, link bool) {
	t.Helper()
	a, b := scan(t, src), scan(t, dst)
	for rel, x := range a {
		y, ok := b[rel]
		if !ok {
			t.Errorf("%s: missing from the copy", rel)
			continue
		}
		if x.mode != y.mode {
			t.Errorf("%s: mode %v, copy has %v", rel, x.mode, y.mode)
		}
		if x.size != y.size || x.sum != y.sum {
			t.Errorf("%s: content differs (size %d vs %d)", rel, x.size, y.size)
		}
		if x.target != y.target {
			t.Errorf("%s: symlink target %q, copy has %q", rel, x.target, y.target)
		}
		if rel != "." && !x.mtime.Equal(y.mtime) {
			t.Errorf("%s: mtime %v, copy has %v", rel, x.mtime, y.mtime)
		}
		if isRoot && (x.uid != y.uid || x.gid != y.gid) {
			t.Errorf("%s: owner %d:%d, copy has %d:%d", rel, x.uid, x.gid, y.uid, y.gid)
		}
		if x.mode.IsRegular() {
			if link && (x.ino != y.ino || x.dev != y.dev) {
				t.Errorf("%s: --method link made a new inode", rel)
			}
			if !link && x.ino == y.ino && x.dev == y.dev {
				t.Errorf("%s: copy shares the source's inode", rel)
			}
			// Sparse files stay sparse: the copy allocates no more than
			// the source (plus slack for XFS's speculative preallocation).
			if y.blocks > x.blocks+2048 {
				t.Errorf("%s: copy allocates %d blocks, source %d (holes filled?)", rel, y.blocks, x.blocks)
			}
		}
	}
	for rel := range b {
		if _, ok := a[rel]; !ok {
			t.Errorf("%s: in the copy but not in the source", rel)
		}
	}
	if x, y := a["sparse"], b["sparse"]; x.size > 0 && y.blocks*512 > 4<<20 {
		t.Errorf("sparse: the 20 MiB sparse file's copy allocates %d bytes", y.blocks*512)
	}
}

// noLeftovers checks that dir holds nothing but the names given.
func noLeftovers(t testing.TB, dir string, keep ...string) {
	t.Helper()
	ents, err := os.ReadDir(dir)
	must(t, err)
	for _, e := range ents {
		ok := false
		for _, k := range keep {
			ok = ok || e.Name() == k
		}
		if !ok {
			t.Errorf("leftover in %s: %s", dir, e.Name())
		}
	}
}

func hasAll(s string, subs ...string) bool {
	for _, x := range subs {
		if !strings.Contains(s, x) {
			return false
		}
	}
	return true
}

func sameBytes(t testing.TB, a, b string, off, n int64) {
	t.Helper()
	fa, err := os.Open(a)
	must(t, err)
	defer fa.Close()
	fb, err := os.Open(b)
	must(t, err)
	defer fb.Close()
	x, y := make([]byte, n), make([]byte, n)
	_, err = fa.ReadAt(x, off)
	must(t, err)
	_, err = fb.ReadAt(y, off)
	must(t, err)
	if !bytes.Equal(x, y) {
		t.Errorf("%s and %s differ at offset %d", a, b, off)
	}
}
