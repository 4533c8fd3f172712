package clone

import (
	"errors"
	"fmt"
	"os"
	"sync/atomic"

	"golang.org/x/sys/unix"
)

// RangeCopier copies byte ranges between open files by the best method the
// filesystems allow: a reflink of the range (FICLONERANGE), else
// copy_file_range(2), else pread/pwrite. It remembers a method the kernel
// refused for every range (another filesystem, no reflink support) so that
// later calls do not pay for the failed attempt again; a refusal of one
// range only (offsets not aligned to the filesystem block) falls back for
// that range alone. It is safe for concurrent use.
type RangeCopier struct {
	// NoClone never tries FICLONERANGE (measurements, or a caller that
	// wants private copies).
	NoClone bool
	// NoCopyRange never tries copy_file_range.
	NoCopyRange bool

	cloneOff, rangeOff atomic.Bool
}

// CopyRange copies n bytes of src at srcOff to dst at dstOff and returns
// the method that did it: Clone (the bytes are shared with src),
// CopyFileRange or PlainCopy. buf, when not nil, is scratch space for a
// plain copy (any size; one is allocated when nil).
func (rc *RangeCopier) CopyRange(dst, src *os.File, dstOff, srcOff, n int64, buf []byte) (Method, error) {
	if n <= 0 {
		return PlainCopy, nil
	}
	if !rc.NoClone && !rc.cloneOff.Load() {
		err := unix.IoctlFileCloneRange(int(dst.Fd()), &unix.FileCloneRange{
			Src_fd: int64(src.Fd()), Src_offset: uint64(srcOff), Src_length: uint64(n), Dest_offset: uint64(dstOff)})
		if err == nil {
			return Clone, nil
		}
		switch {
		case errors.Is(err, unix.EINVAL):
			// unaligned range (or a filesystem that says EINVAL for all):
			// fall back for this range only.
		case errors.Is(err, unix.EOPNOTSUPP), errors.Is(err, unix.EXDEV), errors.Is(err, unix.ENOTTY),
			errors.Is(err, unix.ENOSYS), errors.Is(err, unix.EBADF), errors.Is(err, unix.EPERM):
			rc.cloneOff.Store(true)
		default:
			return Clone, os.NewSyscallError("ioctl FICLONERANGE", err)
		}
	}
	if !rc.NoCopyRange && !rc.rangeOff.Load() {
		roff, woff, left := srcOff, dstOff, n
		for left > 0 {
			w, err := unix.CopyFileRange(int(src.Fd()), &roff, int(dst.Fd()), &woff, int(min(left, chunk)), 0)
			if err != nil {
				if errors.Is(err, unix.EINTR) {
					continue
				}
				if left == n && (errors.Is(err, unix.EXDEV) || errors.Is(err, unix.EINVAL) ||
					errors.Is(err, unix.ENOSYS) || errors.Is(err, unix.EOPNOTSUPP)) {
					rc.rangeOff.Store(true)
					break
				}
				return CopyFileRange, os.NewSyscallError("copy_file_range", err)
			}
			if w == 0 {
				return CopyFileRange, fmt.Errorf("copy_file_range: %s is shorter than expected (offset %d)", src.Name(), roff)
			}
			left -= int64(w)
		}
		if left == 0 {
			return CopyFileRange, nil
		}
		// the first call was refused: plain copy below
	}
	return PlainCopy, plainRange(dst, src, dstOff, srcOff, n, buf)
}

// plainRange copies with pread/pwrite.
func plainRange(dst, src *os.File, dstOff, srcOff, n int64, buf []byte) error {
	if len(buf) == 0 {
		buf = make([]byte, min(n, 1<<20))
	}
	for n > 0 {
		k := min(n, int64(len(buf)))
		r, err := src.ReadAt(buf[:k], srcOff)
		if int64(r) < k {
			if err == nil {
				err = fmt.Errorf("short read")
			}
			return fmt.Errorf("read %s at %d: %w", src.Name(), srcOff, err)
		}
		if _, err := dst.WriteAt(buf[:k], dstOff); err != nil {
			return err
		}
		srcOff += k
		dstOff += k
		n -= k
	}
	return nil
}

// Prefetch asks the kernel to read n bytes of f at off ahead of use
// (posix_fadvise WILLNEED); a hint only, errors are ignored.
func Prefetch(f *os.File, off, n int64) {
	_ = unix.Fadvise(int(f.Fd()), off, n, unix.FADV_WILLNEED)
}

// LinkOpen makes name in the directory dir a hard link to the open file
// src: the file that was opened, whatever its path names now (linkat of
// /proc/self/fd/N, which needs no privilege, unlike AT_EMPTY_PATH). Both
// must be on one filesystem (EXDEV otherwise).
func LinkOpen(src, dir *os.File, name string) error {
	p := fmt.Sprintf("/proc/self/fd/%d", src.Fd())
	if err := unix.Linkat(unix.AT_FDCWD, p, int(dir.Fd()), name, unix.AT_SYMLINK_FOLLOW); err != nil {
		return &os.LinkError{Op: "link", Old: src.Name(), New: dir.Name() + "/" + name, Err: err}
	}
	return nil
}
