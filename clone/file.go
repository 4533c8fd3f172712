package clone

import "os"

// CloneFile makes dst (an empty regular file open for writing) share all of
// src's blocks: FICLONE on Linux, clonefile(2) on macOS. It fails with an
// error for which [Unsupported] is true where the filesystem pair cannot
// share blocks; callers then copy the data another way.
func CloneFile(dst, src *os.File) error { return cloneFile(dst, src) }

// Unsupported reports whether err says that a copy method cannot serve a
// pair of files (another filesystem, no reflink support, not implemented on
// this platform), as opposed to a real I/O error.
func Unsupported(err error) bool { return fallbackable(err) }

// FreeBytes returns the bytes available to unprivileged users on the
// filesystem holding path.
func FreeBytes(path string) (int64, error) { return freeBytes(path) }
