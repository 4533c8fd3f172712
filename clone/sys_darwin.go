//go:build darwin

package clone

import (
	"errors"
	"os"

	"golang.org/x/sys/unix"
)

// cloneFile makes dst share every block of src with clonefile(2) (APFS).
// clonefile creates its destination, so the clone is made beside dst and
// renamed over it, and dst's descriptor is then pointed at the clone with
// dup2: callers keep using dst (metadata, fsync) as with FICLONE on Linux.
func cloneFile(dst, src *os.File) error {
	tmp := dst.Name() + ".pgfork-clonefile"
	if err := unix.Fclonefileat(int(src.Fd()), unix.AT_FDCWD, tmp, unix.CLONE_NOFOLLOW|unix.CLONE_NOOWNERCOPY); err != nil {
		return os.NewSyscallError("fclonefileat", err)
	}
	if err := os.Rename(tmp, dst.Name()); err != nil {
		_ = os.Remove(tmp)
		return err
	}
	nf, err := os.OpenFile(dst.Name(), os.O_WRONLY, 0)
	if err != nil {
		return err
	}
	defer nf.Close()
	return unix.Dup2(int(nf.Fd()), int(dst.Fd()))
}

// cloneUnsupported: clonefile answers ENOTSUP off APFS and EXDEV across volumes.
func cloneUnsupported(err error) bool {
	return errors.Is(err, unix.ENOTSUP) || errors.Is(err, unix.EXDEV) || errors.Is(err, unix.EINVAL) ||
		errors.Is(err, unix.ENOSYS)
}

func freeBytes(path string) (int64, error) {
	var s unix.Statfs_t
	if err := unix.Statfs(path, &s); err != nil {
		return 0, err
	}
	return int64(s.Bavail) * int64(s.Bsize), nil
}
