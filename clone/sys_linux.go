//go:build linux

package clone

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"syscall"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/pgfork/pgfork/internal/proc"
)

// sysInfo is what the copy needs from a stat beyond os.FileInfo.
type sysInfo struct {
	ok       bool
	dev      uint64
	uid, gid int
	blocks   int64 // 512-byte blocks allocated
	atime    time.Time
}

func statOf(fi fs.FileInfo) sysInfo {
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !ok {
		return sysInfo{}
	}
	return sysInfo{
		ok:     true,
		dev:    st.Dev,
		uid:    int(st.Uid),
		gid:    int(st.Gid),
		blocks: st.Blocks,
		atime:  time.Unix(st.Atim.Sec, st.Atim.Nsec),
	}
}

// devOf returns the device number of the filesystem holding path.
func devOf(path string) (uint64, error) {
	var st unix.Stat_t
	if err := unix.Stat(path, &st); err != nil {
		return 0, err
	}
	return st.Dev, nil
}

// fallbackable reports whether err means "this method cannot serve this
// pair of files" (so auto may try the next method) rather than a real failure.
func fallbackable(err error) bool {
	return errors.Is(err, unix.EXDEV) || errors.Is(err, unix.EOPNOTSUPP) || errors.Is(err, unix.ENOTSUP) ||
		errors.Is(err, unix.EINVAL) || errors.Is(err, unix.ENOSYS) || errors.Is(err, unix.ENOTTY)
}

// copyWith copies size bytes of src into dst (both at offset 0) by method m,
// keeping holes. prog is called with the number of bytes just copied.
func copyWith(ctx context.Context, m Method, src, dst *os.File, size int64, prog func(int64)) error {
	switch m {
	case Clone:
		if err := cloneFile(dst, src); err != nil {
			return err
		}
		prog(size)
		return nil
	case CopyFileRange:
		return copySegments(ctx, src, dst, size, prog, copyRangeSegment)
	case PlainCopy:
		return copySegments(ctx, src, dst, size, prog, rwSegment)
	}
	return fmt.Errorf("method %q: %w", m, unix.EINVAL)
}

// cloneFile makes dst share every block of src (ioctl FICLONE).
func cloneFile(dst, src *os.File) error {
	if err := unix.IoctlFileClone(int(dst.Fd()), int(src.Fd())); err != nil {
		return os.NewSyscallError("ioctl FICLONE", err)
	}
	return nil
}

const chunk = 64 << 20 // bytes per copy_file_range call / cancellation check

type segmentFunc func(ctx context.Context, src, dst *os.File, off, end int64, prog func(int64)) (eof bool, err error)

// copySegments copies the data segments of src (found with SEEK_DATA /
// SEEK_HOLE) and sets dst's size, so holes stay holes.
func copySegments(ctx context.Context, src, dst *os.File, size int64, prog func(int64), seg segmentFunc) error {
	sfd := int(src.Fd())
	off := int64(0)
	for off < size {
		if err := ctx.Err(); err != nil {
			return err
		}
		data, err := unix.Seek(sfd, off, unix.SEEK_DATA)
		if err != nil {
			if errors.Is(err, unix.ENXIO) { // no more data: the rest is a hole
				break
			}
			if errors.Is(err, unix.EINVAL) || errors.Is(err, unix.EOPNOTSUPP) {
				data = off // filesystem without SEEK_DATA: all data
			} else {
				return os.NewSyscallError("lseek SEEK_DATA", err)
			}
		}
		if data >= size {
			break
		}
		hole, err := unix.Seek(sfd, data, unix.SEEK_HOLE)
		if err != nil || hole > size {
			hole = size
		}
		eof, err := seg(ctx, src, dst, data, hole, prog)
		if err != nil {
			return err
		}
		if eof {
			break
		}
		off = hole
	}
	// Set the size only when a hole at the end left it short: on XFS a
	// truncate, even to the size the file has, writes back and waits for
	// the data beyond the on-disk size, which would make every copy
	// synchronous (and take the head start from the syncers).
	var st unix.Stat_t
	if err := unix.Fstat(int(dst.Fd()), &st); err != nil {
		return os.NewSyscallError("fstat", err)
	}
	if st.Size == size {
		return nil
	}
	return dst.Truncate(size)
}

func copyRangeSegment(ctx context.Context, src, dst *os.File, off, end int64, prog func(int64)) (bool, error) {
	roff, woff := off, off
	for roff < end {
		if err := ctx.Err(); err != nil {
			return false, err
		}
		n := end - roff
		if n > chunk {
			n = chunk
		}
		w, err := unix.CopyFileRange(int(src.Fd()), &roff, int(dst.Fd()), &woff, int(n), 0)
		if err != nil {
			if errors.Is(err, unix.EINTR) {
				continue
			}
			return false, os.NewSyscallError("copy_file_range", err)
		}
		if w == 0 { // the source shrank under us
			return true, nil
		}
		prog(int64(w))
	}
	return false, nil
}

func rwSegment(ctx context.Context, src, dst *os.File, off, end int64, prog func(int64)) (bool, error) {
	bp := bufPool.Get().(*[]byte)
	defer bufPool.Put(bp)
	buf := *bp
	since := int64(0)
	for off < end {
		if since >= chunk {
			if err := ctx.Err(); err != nil {
				return false, err
			}
			since = 0
		}
		n := end - off
		if n > int64(len(buf)) {
			n = int64(len(buf))
		}
		r, err := src.ReadAt(buf[:n], off)
		if r > 0 {
			if _, werr := dst.WriteAt(buf[:r], off); werr != nil {
				return false, werr
			}
			off += int64(r)
			since += int64(r)
			prog(int64(r))
		}
		if err != nil {
			if r == 0 || errors.Is(err, errEOF) {
				return true, nil
			}
			return false, err
		}
	}
	return false, nil
}

func prefetch(f *os.File) {
	_ = unix.Fadvise(int(f.Fd()), 0, 0, unix.FADV_WILLNEED)
}

// startWriteback asks the kernel to start writing f's dirty pages to the
// device without waiting (sync_file_range SYNC_FILE_RANGE_WRITE). It is
// only a head start for the fsync that follows, never a durability
// guarantee by itself, so errors are ignored: the fsync reports them.
func startWriteback(f *os.File) {
	_ = unix.SyncFileRange(int(f.Fd()), 0, 0, unix.SYNC_FILE_RANGE_WRITE)
}

// maxPendingSyncs is how many copied files may stay open waiting for their
// fsync: half the process's open-file limit (Go raises the soft limit to
// the hard one at start), at most 16384.
func maxPendingSyncs() int {
	var rl unix.Rlimit
	if err := unix.Getrlimit(unix.RLIMIT_NOFILE, &rl); err != nil || rl.Cur < 256 {
		return 64
	}
	return int(min(rl.Cur/2, 16384))
}

// lutimes sets the times of path without following a symlink.
func lutimes(path string, atime, mtime time.Time) error {
	ts := []unix.Timespec{unix.NsecToTimespec(atime.UnixNano()), unix.NsecToTimespec(mtime.UnixNano())}
	if err := unix.UtimesNanoAt(unix.AT_FDCWD, path, ts, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		return &os.PathError{Op: "utimensat", Path: path, Err: err}
	}
	return nil
}

func mkfifo(path string, mode fs.FileMode) error {
	if err := unix.Mkfifo(path, uint32(mode.Perm())); err != nil {
		return &os.PathError{Op: "mkfifo", Path: path, Err: err}
	}
	return nil
}

func pidAlive(pid int) bool { return proc.Alive(pid) }

// freeBytes returns the space available to unprivileged users at path.
func freeBytes(path string) (int64, error) {
	var s unix.Statfs_t
	if err := unix.Statfs(path, &s); err != nil {
		return 0, err
	}
	return int64(s.Bavail) * s.Bsize, nil
}

var fsMagic = map[int64]string{
	0x58465342: "xfs",
	0xEF53:     "ext4",
	0x01021994: "tmpfs",
	0x9123683E: "btrfs",
	0x2FC12FC1: "zfs",
	0x6969:     "nfs",
	0x794c7630: "overlayfs",
	0xF2F52010: "f2fs",
	0xca451a4e: "bcachefs",
	0x858458f6: "ramfs",
	0x65735546: "fuse",
	0xFF534D42: "cifs",
	0xFE534D42: "smb2",
	0x73717368: "squashfs",
	0x4d44:     "vfat",
	0x5346544e: "ntfs",
	0x01021997: "9p",
	0x62656572: "sysfs",
	0x9fa0:     "proc",
}

// FSType returns the type of the filesystem holding path: "xfs", "ext4"
// (also ext2/ext3, which share its magic number), "tmpfs", "btrfs", ...
func FSType(path string) (string, error) {
	var s unix.Statfs_t
	if err := unix.Statfs(path, &s); err != nil {
		return "", &os.PathError{Op: "statfs", Path: path, Err: err}
	}
	if n, ok := fsMagic[int64(s.Type)]; ok {
		return n, nil
	}
	return fmt.Sprintf("0x%x", uint64(s.Type)), nil
}

// FIEMAP, from linux/fiemap.h (not wrapped by x/sys).
const (
	fsIocFiemap        = 0xC020660B // _IOWR('f', 11, struct fiemap)
	fiemapExtentLast   = 0x1
	fiemapExtentShared = 0x2000
	fiemapBatch        = 128
)

type fiemapExtent struct {
	Logical, Physical, Length uint64
	_                         [2]uint64
	Flags                     uint32
	_                         [3]uint32
}

type fiemapHdr struct {
	Start, Length                        uint64
	Flags, MappedExtents, ExtentCount, _ uint32
}

type fiemapBuf struct {
	hdr     fiemapHdr
	extents [fiemapBatch]fiemapExtent
}

// SharedBytes returns how many bytes of the file at path are in extents the
// filesystem marks as shared with another file (FIEMAP_EXTENT_SHARED): the
// bytes a reflink clone saved. It is 0 on filesystems that cannot share.
// It follows no symbolic link at path's end, never blocks on a FIFO and
// refuses anything but a regular file.
func SharedBytes(path string) (int64, error) {
	fd, err := unix.Open(path, unix.O_RDONLY|unix.O_NOFOLLOW|unix.O_NONBLOCK|unix.O_CLOEXEC, 0)
	if err != nil {
		return 0, &os.PathError{Op: "open", Path: path, Err: err}
	}
	f := os.NewFile(uintptr(fd), path)
	defer f.Close()
	return SharedBytesOf(f)
}

// SharedBytesOf is SharedBytes of an open file (0 for anything but a
// regular file).
func SharedBytesOf(f *os.File) (int64, error) {
	var shared int64
	_, err := Extents(f, func(x Extent) {
		if x.Shared {
			shared += int64(x.Length)
		}
	})
	return shared, err
}

func sharedBytesFd(fd int) (int64, error) {
	var shared int64
	_, err := extentsFd(fd, func(x Extent) {
		if x.Shared {
			shared += int64(x.Length)
		}
	})
	return shared, err
}

// FIEMAP extent flags meaning the physical range is not a plain one of its
// own: not known yet (delayed allocation), encoded, packed with others'.
const fiemapExtentNotPlain = 0x2 | 0x4 | 0x8 | 0x80 | 0x100 | 0x200 | 0x400

// Extents calls fn with each extent of the regular file f (FIEMAP), in
// file order. ok is false (and fn never called) where the filesystem
// cannot map its files, or f is not a regular file.
func Extents(f *os.File, fn func(Extent)) (ok bool, err error) {
	fi, err := f.Stat()
	if err != nil || !fi.Mode().IsRegular() {
		return false, err
	}
	return extentsFd(int(f.Fd()), fn)
}

func extentsFd(fd int, fn func(Extent)) (bool, error) {
	var b fiemapBuf
	start := uint64(0)
	for {
		b.hdr = fiemapHdr{Start: start, Length: ^uint64(0) - start, ExtentCount: fiemapBatch}
		_, _, e := unix.Syscall(unix.SYS_IOCTL, uintptr(fd), fsIocFiemap, uintptr(unsafe.Pointer(&b)))
		if e != 0 {
			if e == unix.EOPNOTSUPP || e == unix.ENOTTY {
				return false, nil
			}
			return false, os.NewSyscallError("ioctl FIEMAP", e)
		}
		n := int(b.hdr.MappedExtents)
		if n == 0 {
			return true, nil
		}
		for i := 0; i < n; i++ {
			x := b.extents[i]
			fn(Extent{Logical: x.Logical, Physical: x.Physical, Length: x.Length,
				Shared: x.Flags&fiemapExtentShared != 0, Placed: x.Flags&fiemapExtentNotPlain == 0})
			if x.Flags&fiemapExtentLast != 0 {
				return true, nil
			}
			start = x.Logical + x.Length
		}
	}
}

// probeCopyRange copies the first n bytes of src to dst with copy_file_range.
func probeCopyRange(ctx context.Context, src, dst *os.File, n int64) error {
	_, err := copyRangeSegment(ctx, src, dst, 0, n, func(int64) {})
	return err
}

// openFile opens a regular file without registering it with Go's poller
// (which regular files do not use) and in blocking mode, saving a few
// syscalls per file on trees of many small files.
func openFile(path string, flag int, perm os.FileMode) (*os.File, error) {
	for {
		fd, err := unix.Open(path, flag|unix.O_CLOEXEC, uint32(perm.Perm()))
		if err == nil {
			return os.NewFile(uintptr(fd), path), nil
		}
		if err != unix.EINTR {
			return nil, &os.PathError{Op: "open", Path: path, Err: err}
		}
	}
}
