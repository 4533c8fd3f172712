package clone

import (
	"context"
	"errors"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/pgfork/pgfork/internal/errs"
	"github.com/pgfork/pgfork/internal/flock"
	"github.com/pgfork/pgfork/internal/testenv"
)

type fsCase struct {
	name  string
	dir   func(testing.TB) string
	clone bool // can the filesystem clone (reflink)?
}

var filesystems = []fsCase{
	{"ext4", testenv.Dir, false},
	{"xfs", testenv.XFSDir, true},
	{"tmpfs", testenv.TmpfsDir, false},
}

// TestConformance runs the same copy checks for every method on every
// filesystem. A method the filesystem cannot do must fail with Unsupported,
// leaving nothing behind.
func TestConformance(t *testing.T) {
	for _, fc := range filesystems {
		t.Run(fc.name, func(t *testing.T) {
			base := fc.dir(t)
			src := filepath.Join(base, "src")
			makeTree(t, src)
			wantFS := fc.name
			if got, err := FSType(base); err != nil || got != wantFS {
				t.Fatalf("FSType(%s) = %q, %v; want %q", base, got, err, wantFS)
			}
			for _, m := range []Method{Auto, Clone, CopyFileRange, PlainCopy, Link} {
				t.Run(string(m), func(t *testing.T) {
					dst := filepath.Join(base, "dst-"+string(m))
					var last Progress
					sum, err := Copy(context.Background(), src, dst, Options{Method: m, Jobs: 3,
						OnProgress: func(p Progress) { last = p }})
					if m == Clone && !fc.clone {
						if errs.KindOf(err) != errs.Unsupported {
							t.Fatalf("--method clone on %s: want Unsupported, got %v", fc.name, err)
						}
						if !hasAll(err.Error(), fc.name, "clone") || !strings.Contains(errs.CLIHintOf(err), "--method auto") {
							t.Errorf("error should name the filesystem and hint at auto: %v (hint %q)", err, errs.HintOf(err))
						}
						if _, serr := os.Lstat(dst); !errors.Is(serr, fs.ErrNotExist) {
							t.Errorf("dst exists after a failed copy")
						}
						noLeftovers(t, base, "src", "dst-auto")
						return
					}
					if err != nil {
						t.Fatalf("Copy: %v", err)
					}
					compareTrees(t, src, dst, m == Link)
					wantFiles := int64(9)
					if sum.Files != wantFiles || sum.Symlinks != 3 || sum.Dirs != 6 {
						t.Errorf("summary: %d files, %d symlinks, %d dirs; want %d, 3, 6", sum.Files, sum.Symlinks, sum.Dirs, wantFiles)
					}
					if last.Files != wantFiles || last.TotalFiles != wantFiles || last.Bytes != last.TotalBytes || last.Bytes != sum.Bytes {
						t.Errorf("last progress %+v, summary bytes %d", last, sum.Bytes)
					}
					want := m
					if m == Auto {
						want = CopyFileRange
						if fc.clone {
							want = Clone
						}
					}
					if sum.Methods[want] != wantFiles || len(sum.Methods) != 1 {
						t.Errorf("methods %v, want all %d files by %s", sum.Methods, wantFiles, want)
					}
					if fc.clone && (want == Clone || want == CopyFileRange) && sum.SharedBytes < 3<<20 {
						t.Errorf("on XFS %s shared only %d bytes", want, sum.SharedBytes)
					}
					if !fc.clone && sum.SharedBytes != 0 {
						t.Errorf("%s reports %d shared bytes", fc.name, sum.SharedBytes)
					}
					noLeftovers(t, base, "src", "dst-auto", "dst-clone", "dst-copy-file-range", "dst-copy", "dst-link")
				})
			}
		})
	}
}

// TestCrossFilesystem copies between filesystems with auto: clone and
// copy_file_range fail with EXDEV and the fallback must kick in.
func TestCrossFilesystem(t *testing.T) {
	for _, c := range []struct {
		name     string
		src, dst func(testing.TB) string
	}{
		{"ext4-to-xfs", testenv.Dir, testenv.XFSDir},
		{"xfs-to-tmpfs", testenv.XFSDir, testenv.TmpfsDir},
	} {
		t.Run(c.name, func(t *testing.T) {
			src := filepath.Join(c.src(t), "src")
			dst := filepath.Join(c.dst(t), "dst")
			makeTree(t, src)
			sum, err := Copy(context.Background(), src, dst, Options{})
			if err != nil {
				t.Fatal(err)
			}
			compareTrees(t, src, dst, false)
			if sum.Methods[PlainCopy] != 9 || len(sum.Methods) != 1 {
				t.Errorf("methods %v: want the 9 files by plain copy", sum.Methods)
			}
			// A forced clone across filesystems is refused, naming both.
			_, err = Copy(context.Background(), src, dst+"2", Options{Method: Clone})
			if errs.KindOf(err) != errs.Unsupported || !strings.Contains(err.Error(), "filesystem") {
				t.Errorf("forced clone across filesystems: %v", err)
			}
		})
	}
}

// TestCloneSharesBlocks checks that on XFS a clone really shares blocks:
// FIEMAP marks the copy's extents shared and free space barely changes.
func TestCloneSharesBlocks(t *testing.T) {
	base := testenv.XFSDir(t)
	src := filepath.Join(base, "src")
	must(t, os.Mkdir(src, 0o755))
	const size = 64 << 20
	writeRandom(t, filepath.Join(src, "big"), size, 42)
	unix.Sync()
	before, err := freeBytes(base)
	must(t, err)
	sum, err := Copy(context.Background(), src, filepath.Join(base, "dst"), Options{Method: Clone})
	must(t, err)
	unix.Sync()
	after, err := freeBytes(base)
	must(t, err)
	shared, err := SharedBytes(filepath.Join(base, "dst", "big"))
	must(t, err)
	if shared < size {
		t.Errorf("FIEMAP: %d of %d bytes of the clone are shared", shared, size)
	}
	if sum.SharedBytes < size {
		t.Errorf("summary shared bytes %d < %d", sum.SharedBytes, size)
	}
	// Other test packages write to this filesystem at the same time (and
	// the sync allocates their delayed writes), so free space is only a
	// coarse check: a plain copy would take all 64 MiB, a clone none.
	// FIEMAP above is the exact one.
	if used := before - after; used > size/2 {
		t.Errorf("cloning a %d-byte file used %d bytes of free space", size, used)
	}
	// And a plain copy does not share.
	_, err = Copy(context.Background(), src, filepath.Join(base, "dst2"), Options{Method: PlainCopy})
	must(t, err)
	if n, _ := SharedBytes(filepath.Join(base, "dst2", "big")); n != 0 {
		t.Errorf("plain copy shares %d bytes", n)
	}
}

// TestLargeSparse copies a 5 GiB sparse file (data at start, middle, end):
// past 4 GiB offsets must be right and holes must stay holes.
func TestLargeSparse(t *testing.T) {
	const size = 5 << 30
	offs := []int64{0, size / 2, size - 1<<20}
	for _, c := range []struct {
		name string
		dir  func(testing.TB) string
		m    Method
	}{
		{"ext4-copy-file-range", testenv.Dir, CopyFileRange},
		{"ext4-copy", testenv.Dir, PlainCopy},
		{"xfs-auto", testenv.XFSDir, Auto},
		{"tmpfs-copy", testenv.TmpfsDir, PlainCopy},
	} {
		t.Run(c.name, func(t *testing.T) {
			base := c.dir(t)
			src := filepath.Join(base, "src")
			must(t, os.Mkdir(src, 0o755))
			writeSparse(t, filepath.Join(src, "seg"), size, offs...)
			dst := filepath.Join(base, "dst")
			sum, err := Copy(context.Background(), src, dst, Options{Method: c.m, Sync: SyncNone})
			must(t, err)
			fi, err := os.Stat(filepath.Join(dst, "seg"))
			must(t, err)
			if fi.Size() != size || sum.Bytes != size {
				t.Errorf("size %d, summary bytes %d; want %d", fi.Size(), sum.Bytes, int64(size))
			}
			for _, off := range offs {
				sameBytes(t, filepath.Join(src, "seg"), filepath.Join(dst, "seg"), off, 1<<20)
			}
			sameBytes(t, filepath.Join(src, "seg"), filepath.Join(dst, "seg"), size/4, 4096) // a hole reads as zeros in both
			var st unix.Stat_t
			must(t, unix.Stat(filepath.Join(dst, "seg"), &st))
			if st.Blocks*512 > 16<<20 {
				t.Errorf("the copy allocates %d bytes for 3 MiB of data", st.Blocks*512)
			}
		})
	}
}

// TestNoSpace fills a small filesystem: NoSpace, saying how much was
// needed, and nothing left behind.
func TestNoSpace(t *testing.T) {
	small := testenv.SmallFSDir(t)
	src := filepath.Join(testenv.Dir(t), "src")
	must(t, os.Mkdir(src, 0o755))
	for i := range 4 {
		writeRandom(t, filepath.Join(src, "f"+string(rune('a'+i))), 24<<20, uint64(i))
	}
	dst := filepath.Join(small, "dst")
	_, err := Copy(context.Background(), src, dst, Options{})
	if errs.KindOf(err) != errs.NoSpace {
		t.Fatalf("want NoSpace, got %v", err)
	}
	if !hasAll(err.Error(), "needs about 96.0 MiB", "available") || errs.HintOf(err) == "" {
		t.Errorf("message should say needed vs available: %v (hint %q)", err, errs.HintOf(err))
	}
	noLeftovers(t, small)
}

// TestCancel cancels a copy through its context: Interrupted, no dst, no
// staging dir.
func TestCancel(t *testing.T) {
	base := testenv.Dir(t)
	src := filepath.Join(base, "src")
	must(t, os.Mkdir(src, 0o755))
	for i := range 20 {
		writeRandom(t, filepath.Join(src, "f"+string(rune('a'+i))), 8<<20, uint64(i))
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var calls atomic.Int32
	_, err := Copy(ctx, src, filepath.Join(base, "dst"), Options{Method: PlainCopy, Jobs: 1, Sync: SyncFsync,
		OnProgress: func(p Progress) {
			if p.Bytes > 0 && calls.Add(1) == 1 {
				cancel()
			}
		}})
	if errs.KindOf(err) != errs.Interrupted || !errors.Is(err, context.Canceled) {
		t.Fatalf("want Interrupted wrapping context.Canceled, got %v", err)
	}
	noLeftovers(t, base, "src")
}

func TestBadInput(t *testing.T) {
	base := testenv.Dir(t)
	src := filepath.Join(base, "src")
	must(t, os.MkdirAll(filepath.Join(src, "sub"), 0o755))
	must(t, os.WriteFile(filepath.Join(src, "file"), []byte("x"), 0o644))
	must(t, os.Mkdir(filepath.Join(base, "taken"), 0o755))
	must(t, os.WriteFile(filepath.Join(base, "taken", "old"), []byte("old"), 0o644))
	for _, c := range []struct {
		name     string
		src, dst string
		opts     Options
		kind     errs.Kind
		hint     string
	}{
		{"src missing", filepath.Join(base, "nope"), filepath.Join(base, "d1"), Options{}, errs.NotFound, "path"},
		{"src is a file", filepath.Join(src, "file"), filepath.Join(base, "d2"), Options{}, errs.Usage, ""},
		{"dst exists", src, filepath.Join(base, "taken"), Options{}, errs.Exists, "--force"},
		{"dst inside src", src, filepath.Join(src, "sub", "copy"), Options{}, errs.Usage, "outside"},
		{"dst is src", src, src, Options{Force: true}, errs.Usage, ""},
		{"src inside dst with force", filepath.Join(src, "sub"), src, Options{Force: true}, errs.Usage, ""},
		{"dst parent missing", src, filepath.Join(base, "no", "such", "dst"), Options{}, errs.NotFound, "mkdir -p"},
		{"bad method", src, filepath.Join(base, "d3"), Options{Method: "teleport"}, errs.Usage, "auto"},
		{"bad sync", src, filepath.Join(base, "d4"), Options{Sync: "maybe"}, errs.Usage, "fsync"},
		{"link with owner", src, filepath.Join(base, "d5"), Options{Method: Link, Owner: &Owner{1, 1}}, errs.Usage, ""},
	} {
		t.Run(c.name, func(t *testing.T) {
			_, err := Copy(context.Background(), c.src, c.dst, c.opts)
			if err == nil || errs.KindOf(err) != c.kind {
				t.Fatalf("want %v, got %v", c.kind, err)
			}
			// The advice as the CLI prints it: the hint, then the flags.
			if advice := errs.HintOf(err) + "; " + errs.CLIHintOf(err); !strings.Contains(advice, c.hint) || errs.HintOf(err) == "" {
				t.Errorf("hint %q should mention %q (error %v)", advice, c.hint, err)
			}
		})
	}
	// Nothing was damaged or left behind.
	noLeftovers(t, base, "src", "taken")
	noLeftovers(t, filepath.Join(base, "taken"), "old")
	noLeftovers(t, src, "sub", "file")
}

func TestForceReplaces(t *testing.T) {
	base := testenv.Dir(t)
	src := filepath.Join(base, "src")
	makeTree(t, src)
	dst := filepath.Join(base, "dst")
	must(t, os.Mkdir(dst, 0o755))
	must(t, os.WriteFile(filepath.Join(dst, "stale"), []byte("old"), 0o644))
	_, err := Copy(context.Background(), src, dst, Options{Force: true})
	must(t, err)
	compareTrees(t, src, dst, false)
	noLeftovers(t, base, "src", "dst")
	// A file in the way is replaced too.
	must(t, os.RemoveAll(dst))
	must(t, os.WriteFile(dst, []byte("file"), 0o644))
	_, err = Copy(context.Background(), src, dst, Options{Force: true})
	must(t, err)
	compareTrees(t, src, dst, false)
	noLeftovers(t, base, "src", "dst")
}

func TestCleanStale(t *testing.T) {
	base := testenv.Dir(t)
	src := filepath.Join(base, "src")
	makeTree(t, src)
	dst := filepath.Join(base, "dst")
	// A dead process's staging dir, with content.
	cmd := exec.Command("true")
	must(t, cmd.Run())
	dead := cmd.Process.Pid
	stale := filepath.Join(base, ".dst"+stagingTag+itoa(dead)+"-123")
	must(t, os.MkdirAll(filepath.Join(stale, "half"), 0o755))
	// A live copy's staging dir (this process holds its lock).
	live := filepath.Join(base, ".dst"+stagingTag+itoa(os.Getpid())+"-456")
	must(t, os.Mkdir(live, 0o700))
	release, err := flock.LockDir(live)
	must(t, err)
	// Someone else's dot-dir that merely looks similar.
	other := filepath.Join(base, ".dstx"+stagingTag+itoa(dead)+"-1")
	must(t, os.Mkdir(other, 0o700))

	_, err = Copy(context.Background(), src, dst, Options{})
	must(t, err)
	noLeftovers(t, base, "src", "dst", filepath.Base(live), filepath.Base(other))
	release()
	must(t, CleanStale(dst))
	noLeftovers(t, base, "src", "dst", filepath.Base(other))
}

func itoa(i int) string { return strconv.Itoa(i) }

func TestFilterOwnerVanished(t *testing.T) {
	base := testenv.Dir(t)
	src := filepath.Join(base, "src")
	makeTree(t, src)
	filter := func(rel string, d fs.DirEntry) Action {
		switch rel {
		case "base":
			return EmptyDir
		case "PG_VERSION", "link-abs":
			return Skip
		}
		return Include
	}
	dst := filepath.Join(base, "dst")
	opts := Options{Filter: filter}
	if isRoot {
		opts.Owner = &Owner{UID: 4321, GID: 4322}
	}
	sum, err := Copy(context.Background(), src, dst, opts)
	must(t, err)
	for _, p := range []string{"PG_VERSION", "link-abs", "base/1"} {
		if _, err := os.Lstat(filepath.Join(dst, p)); !errors.Is(err, fs.ErrNotExist) {
			t.Errorf("%s should have been left out", p)
		}
	}
	if fi, err := os.Stat(filepath.Join(dst, "base")); err != nil || !fi.IsDir() {
		t.Errorf("base should be an empty dir: %v", err)
	}
	if sum.Files != 5 {
		t.Errorf("copied %d files, want 5", sum.Files)
	}
	if isRoot {
		must(t, filepath.WalkDir(dst, func(p string, d fs.DirEntry, err error) error {
			var st unix.Stat_t
			must(t, unix.Lstat(p, &st))
			if st.Uid != 4321 || st.Gid != 4322 {
				t.Errorf("%s: owner %d:%d, want 4321:4322", p, st.Uid, st.Gid)
			}
			return err
		}))
	}

	// A file that vanishes between listing and copying.
	vanish := func(rel string, d fs.DirEntry) Action {
		if rel == "script.sh" {
			_ = os.Remove(filepath.Join(src, rel))
		}
		return Include
	}
	_, err = Copy(context.Background(), src, filepath.Join(base, "v1"), Options{Filter: vanish})
	if errs.KindOf(err) != errs.NotFound || !strings.Contains(err.Error(), "script.sh") {
		t.Errorf("vanished file without TolerateVanished: %v", err)
	}
	must(t, os.WriteFile(filepath.Join(src, "script.sh"), nil, 0o755))
	sum, err = Copy(context.Background(), src, filepath.Join(base, "v2"), Options{Filter: vanish, TolerateVanished: true})
	must(t, err)
	if sum.Vanished != 1 {
		t.Errorf("vanished = %d, want 1", sum.Vanished)
	}
	noLeftovers(t, base, "src", "dst", "v2")
}

func TestCopyInto(t *testing.T) {
	base := testenv.Dir(t)
	src := filepath.Join(base, "src")
	makeTree(t, src)
	dst := filepath.Join(base, "into")
	must(t, os.Mkdir(dst, 0o700))
	_, err := CopyInto(context.Background(), src, dst, Options{Sync: SyncFS})
	must(t, err)
	compareTrees(t, src, dst, false)
	_, err = CopyInto(context.Background(), src, dst, Options{})
	if errs.KindOf(err) != errs.Exists {
		t.Errorf("CopyInto a non-empty dir: %v", err)
	}
}

func TestProbe(t *testing.T) {
	for _, fc := range filesystems {
		t.Run(fc.name, func(t *testing.T) {
			d := fc.dir(t)
			res, err := Probe(context.Background(), d, d)
			must(t, err)
			if res.Clone != fc.clone || res.SharesBlocks != fc.clone || !res.Copy || !res.CopyFileRange {
				t.Errorf("probe %+v", res)
			}
			want := CopyFileRange
			if fc.clone {
				want = Clone
			}
			if res.Best != want || res.FSType != fc.name {
				t.Errorf("best %s on %s, want %s on %s", res.Best, res.FSType, want, fc.name)
			}
			if !fc.clone && res.Errors[Clone] == "" {
				t.Errorf("no reason given for clone failing")
			}
			noLeftovers(t, d)
		})
	}
}
