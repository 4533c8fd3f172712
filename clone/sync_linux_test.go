package clone

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/pgfork/pgfork/internal/errs"
	"github.com/pgfork/pgfork/internal/testenv"
)

// What these tests cannot show: that a copy survives a power cut. That
// needs a crash of the machine (or of a VM) between Copy returning and the
// data reaching stable storage, which a test process cannot cause. They
// show what can be seen from inside: every mode is accepted and copies
// correctly; after a durable copy no page of any copied file is dirty or
// under writeback; and a write error that only fsync can see (the device
// fails after the data went into the page cache) fails the copy, whatever
// the number of syncers.

// makeDirtyTree builds files that a plain copy leaves as dirty page cache:
// 120 small files in a few directories and one 40 MiB file (more than
// writebackEvery, so the early writeback runs mid-file too).
func makeDirtyTree(t testing.TB, root string) {
	t.Helper()
	for i := range 120 {
		d := filepath.Join(root, "base", fmt.Sprint(16384+i%4))
		must(t, os.MkdirAll(d, 0o755))
		writeRandom(t, filepath.Join(d, fmt.Sprint(1000+i)), int64(8192*(1+i%16)), uint64(i))
	}
	must(t, os.MkdirAll(filepath.Join(root, "empty"), 0o700))
	writeRandom(t, filepath.Join(root, "base", "16384", "segment"), 40<<20, 999)
}

// pageState sums, over every regular file under root, the pages cachestat(2)
// reports dirty and under writeback.
func pageState(t testing.TB, root string) (files, dirty, writeback uint64) {
	t.Helper()
	must(t, filepath.WalkDir(root, func(p string, d os.DirEntry, err error) error {
		if err != nil || !d.Type().IsRegular() {
			return err
		}
		f, err := os.Open(p)
		if err != nil {
			return err
		}
		defer f.Close()
		var cs unix.Cachestat_t
		if err := unix.Cachestat(uint(f.Fd()), &unix.CachestatRange{}, &cs, 0); err != nil {
			if errors.Is(err, unix.ENOSYS) {
				t.Skipf("cachestat(2) is not available on this kernel: %v", err)
			}
			return fmt.Errorf("cachestat %s: %w", p, err)
		}
		files++
		dirty += cs.Dirty
		writeback += cs.Writeback
		return nil
	}))
	return files, dirty, writeback
}

// TestSyncModes copies with every sync mode (and fsync with 1 and many
// syncers) on every filesystem, plain copy and auto: the copy is complete
// and correct, and the summary says which mode ran.
func TestSyncModes(t *testing.T) {
	cases := []struct {
		mode     SyncMode
		syncJobs int
	}{{SyncNone, 0}, {SyncFsync, 1}, {SyncFsync, 0}, {SyncFsync, 64}, {SyncFS, 0}}
	for _, fc := range filesystems {
		t.Run(fc.name, func(t *testing.T) {
			base := fc.dir(t)
			src := filepath.Join(base, "src")
			makeTree(t, src)
			for _, m := range []Method{Auto, PlainCopy} {
				for _, tc := range cases {
					name := fmt.Sprintf("%s-%s-%d", m, tc.mode, tc.syncJobs)
					t.Run(name, func(t *testing.T) {
						dst := filepath.Join(base, "dst-"+name)
						sum, err := Copy(context.Background(), src, dst, Options{Method: m, Jobs: 2, Sync: tc.mode, SyncJobs: tc.syncJobs})
						if err != nil {
							t.Fatal(err)
						}
						if sum.Sync != tc.mode {
							t.Errorf("summary says sync %q, want %q", sum.Sync, tc.mode)
						}
						compareTrees(t, src, dst, false)
					})
				}
			}
		})
	}
	if _, err := Copy(context.Background(), t.TempDir(), filepath.Join(t.TempDir(), "x"), Options{SyncJobs: -1}); errs.KindOf(err) != errs.Usage {
		t.Errorf("SyncJobs -1: want a Usage error, got %v", err)
	}
	if _, err := ParseSyncMode("fdatasync"); errs.KindOf(err) != errs.Usage {
		t.Errorf("ParseSyncMode(fdatasync): want a Usage error, got %v", err)
	}
}

// TestSyncLeavesNoDirtyPages checks, with cachestat(2), that a durable copy
// has written back every page of every file before Copy returns, on ext4
// and XFS, with a plain copy (which dirties the page cache; a clone does
// not). A copy with --sync none is the control: right after it, its pages
// are usually still dirty, so the check can see the difference. It checks
// the end state, not the call that produced it: the early write-back
// (sync_file_range) alone also cleans the pages, so this test fails only
// when neither ran; that fsync runs and its errors count is what
// TestSyncErrorPropagates shows.
func TestSyncLeavesNoDirtyPages(t *testing.T) {
	for _, fc := range filesystems {
		if fc.name == "tmpfs" { // tmpfs pages never reach a device
			continue
		}
		t.Run(fc.name, func(t *testing.T) {
			base := fc.dir(t)
			src := filepath.Join(base, "src")
			makeDirtyTree(t, src)

			ctl := filepath.Join(base, "dst-none")
			if _, err := Copy(context.Background(), src, ctl, Options{Method: PlainCopy, Sync: SyncNone}); err != nil {
				t.Fatal(err)
			}
			if files, dirty, wb := pageState(t, ctl); dirty+wb == 0 {
				// Background writeback (other writers pushing the machine
				// over its dirty threshold) may have cleaned them already.
				t.Logf("control: after --sync none no page of %d files is dirty: the kernel or the filesystem wrote them back already", files)
			} else {
				t.Logf("control: after --sync none, %d dirty and %d writeback pages in %d files", dirty, wb, files)
			}

			for _, tc := range []struct {
				mode     SyncMode
				syncJobs int
			}{{SyncFsync, 1}, {SyncFsync, 0}, {SyncFS, 0}} {
				t.Run(fmt.Sprintf("%s-%d", tc.mode, tc.syncJobs), func(t *testing.T) {
					dst := filepath.Join(base, fmt.Sprintf("dst-%s-%d", tc.mode, tc.syncJobs))
					if _, err := Copy(context.Background(), src, dst, Options{Method: PlainCopy, Sync: tc.mode, SyncJobs: tc.syncJobs}); err != nil {
						t.Fatal(err)
					}
					files, dirty, wb := pageState(t, dst)
					if files != 121 {
						t.Fatalf("found %d files in the copy, want 121", files)
					}
					if dirty != 0 || wb != 0 {
						t.Errorf("after Copy with sync %s: %d dirty and %d writeback pages remain", tc.mode, dirty, wb)
					}
				})
			}
		})
	}
}

// failingFS mounts a fresh XFS filesystem whose device fails every write
// to a block not written before: it lives on a loop device over a sparse
// image kept on a tmpfs just big enough for what mkfs.xfs wrote (the
// superblocks, the 64 MiB log) plus 2 MiB. Metadata goes through the log,
// whose blocks exist, so creating files, setting their metadata and
// committing the log keep working; file data is written to new blocks and
// fails once the tmpfs is full, which happens on write-back, that is in
// fsync (XFS does not shut down on a data write error). Needs root,
// losetup, mkfs.xfs and mount.
func failingFS(t *testing.T) string {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("skipping: mounting a failing filesystem needs root")
	}
	for _, tool := range []string{"losetup", "mkfs.xfs", "mount", "umount", "truncate"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Skipf("skipping: %s not found (packages util-linux, xfsprogs, coreutils)", tool)
		}
	}
	run := func(args ...string) string {
		t.Helper()
		out, err := exec.Command(args[0], args[1:]...).CombinedOutput()
		if err != nil {
			t.Fatalf("%s: %v\n%s", strings.Join(args, " "), err, out)
		}
		return strings.TrimSpace(string(out))
	}
	dir := t.TempDir()
	back, mnt := filepath.Join(dir, "back"), filepath.Join(dir, "mnt")
	must(t, os.Mkdir(back, 0o700))
	must(t, os.Mkdir(mnt, 0o700))
	run("mount", "-t", "tmpfs", "-o", "size=128m", "pgfork-failing", back)
	t.Cleanup(func() { _ = exec.Command("umount", "-l", back).Run() })
	img := filepath.Join(back, "img")
	run("truncate", "-s", "320M", img)
	run("mkfs.xfs", "-q", "-f", "-K", img)
	var st unix.Stat_t
	must(t, unix.Stat(img, &st))
	run("mount", "-o", fmt.Sprintf("remount,size=%dk", st.Blocks/2+2048), back)
	loop := run("losetup", "-f", "--show", img)
	t.Cleanup(func() { _ = exec.Command("losetup", "-d", loop).Run() })
	run("mount", loop, mnt)
	t.Cleanup(func() { _ = exec.Command("umount", "-l", mnt).Run() })
	return mnt
}

func openFDs(t testing.TB) int {
	t.Helper()
	ents, err := os.ReadDir("/proc/self/fd")
	must(t, err)
	return len(ents)
}

// TestSyncErrorPropagates copies 40 MiB to a filesystem whose device fails
// data writes after ~2 MiB: the page cache takes the data, the write-back
// fails, and only fsync can tell. The copy must fail with that error (EIO,
// or ENOSPC from the full backing store), naming the destination, with 1
// syncer and with many, and close every file it opened. A copy that
// dropped an fsync error would succeed: everything else works on this
// filesystem.
func TestSyncErrorPropagates(t *testing.T) {
	src := filepath.Join(testenv.Dir(t), "src")
	must(t, os.Mkdir(src, 0o755))
	for i := range 40 {
		writeRandom(t, filepath.Join(src, fmt.Sprintf("f%02d", i)), 1<<20, uint64(i))
	}
	for _, syncJobs := range []int{1, 32} {
		t.Run(fmt.Sprint(syncJobs), func(t *testing.T) {
			mnt := failingFS(t)
			dst := filepath.Join(mnt, "dst")
			fds := openFDs(t)
			_, err := Copy(context.Background(), src, dst, Options{Method: PlainCopy, Sync: SyncFsync, SyncJobs: syncJobs})
			if err == nil {
				t.Fatal("Copy succeeded although the device failed every write-back")
			}
			if !errors.Is(err, unix.EIO) && !errors.Is(err, unix.ENOSPC) {
				t.Errorf("want an error wrapping EIO or ENOSPC, got %v", err)
			}
			if !strings.Contains(err.Error(), dst) {
				t.Errorf("the error should name the destination %s: %v", dst, err)
			}
			if _, serr := os.Lstat(dst); serr == nil {
				t.Errorf("dst %s exists after a failed copy", dst)
			}
			if n := openFDs(t); n != fds {
				t.Errorf("%d files open before the copy, %d after: the copy leaks descriptors", fds, n)
			}
			t.Logf("error: %v", err)
		})
	}
}
