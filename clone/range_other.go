//go:build !linux

package clone

import (
	"fmt"
	"os"
)

// RangeCopier copies byte ranges between open files. Outside Linux it
// always reads and writes (PlainCopy). It is safe for concurrent use.
type RangeCopier struct {
	// NoClone and NoCopyRange are kept for the same API as on Linux.
	NoClone, NoCopyRange bool
}

// CopyRange copies n bytes of src at srcOff to dst at dstOff.
func (rc *RangeCopier) CopyRange(dst, src *os.File, dstOff, srcOff, n int64, buf []byte) (Method, error) {
	if len(buf) == 0 {
		buf = make([]byte, min(max(n, 1), 1<<20))
	}
	for n > 0 {
		k := min(n, int64(len(buf)))
		r, err := src.ReadAt(buf[:k], srcOff)
		if int64(r) < k {
			if err == nil {
				err = fmt.Errorf("short read")
			}
			return PlainCopy, fmt.Errorf("read %s at %d: %w", src.Name(), srcOff, err)
		}
		if _, err := dst.WriteAt(buf[:k], dstOff); err != nil {
			return PlainCopy, err
		}
		srcOff += k
		dstOff += k
		n -= k
	}
	return PlainCopy, nil
}

// Prefetch is a no-op outside Linux.
func Prefetch(*os.File, int64, int64) {}

// LinkOpen makes name in the directory dir a hard link to the open file
// src, by src's name (this platform cannot link an open file as such).
func LinkOpen(src, dir *os.File, name string) error {
	return os.Link(src.Name(), dir.Name()+"/"+name)
}
