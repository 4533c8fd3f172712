//go:build !linux

package clone

import (
	"context"
	"errors"
	"io/fs"
	"os"
	"time"
)

// errNotHere means the method is not implemented on this platform; auto
// falls back to a plain copy.
var errNotHere = errors.New("not available on this platform")

type sysInfo struct {
	ok       bool
	dev      uint64
	uid, gid int
	blocks   int64
	atime    time.Time
}

func statOf(fi fs.FileInfo) sysInfo { return sysInfo{atime: fi.ModTime()} }

func devOf(string) (uint64, error) { return 0, nil }

func fallbackable(err error) bool { return errors.Is(err, errNotHere) || cloneUnsupported(err) }

func copyWith(ctx context.Context, m Method, src, dst *os.File, size int64, prog func(int64)) error {
	switch m {
	case Clone:
		if err := cloneFile(dst, src); err != nil {
			return err
		}
		prog(size)
		return nil
	case PlainCopy:
	default:
		return errNotHere
	}
	bp := bufPool.Get().(*[]byte)
	defer bufPool.Put(bp)
	buf := *bp
	for off := int64(0); off < size; {
		if err := ctx.Err(); err != nil {
			return err
		}
		r, err := src.ReadAt(buf, off)
		if r > 0 {
			if _, werr := dst.WriteAt(buf[:r], off); werr != nil {
				return werr
			}
			off += int64(r)
			prog(int64(r))
		}
		if err != nil {
			if errors.Is(err, errEOF) {
				break
			}
			return err
		}
	}
	return dst.Truncate(size)
}

func prefetch(*os.File) {}

func startWriteback(*os.File) {}

func maxPendingSyncs() int { return 256 }

func lutimes(path string, atime, mtime time.Time) error {
	fi, err := os.Lstat(path)
	if err != nil || fi.Mode()&fs.ModeSymlink != 0 {
		return err
	}
	return os.Chtimes(path, atime, mtime)
}

func mkfifo(path string, _ fs.FileMode) error {
	return &os.PathError{Op: "mkfifo", Path: path, Err: errNotHere}
}

// pidAlive is conservative here: without flock or kill(pid, 0) a staging
// dir is never assumed abandoned, so CleanStale leaves it.
func pidAlive(int) bool { return true }

// FSType returns the type of the filesystem holding path; unknown here.
func FSType(path string) (string, error) {
	if _, err := os.Stat(path); err != nil {
		return "", err
	}
	return "unknown", nil
}

// SharedBytes returns 0: this platform has no way to ask.
func SharedBytes(path string) (int64, error) {
	_, err := os.Stat(path)
	return 0, err
}

func sharedBytesFd(int) (int64, error) { return 0, nil }

// SharedBytesOf returns 0: this platform has no way to ask.
func SharedBytesOf(*os.File) (int64, error) { return 0, nil }

// Extents reports ok false: this platform cannot map files.
func Extents(*os.File, func(Extent)) (ok bool, err error) { return false, nil }

func probeCopyRange(context.Context, *os.File, *os.File, int64) error { return errNotHere }

func openFile(path string, flag int, perm os.FileMode) (*os.File, error) {
	return os.OpenFile(path, flag, perm)
}
