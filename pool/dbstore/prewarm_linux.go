package dbstore

import (
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// firstNormalOID is PostgreSQL's FirstNormalObjectId: files of a database
// directory named below it are the system catalogs' (and their indexes').
const firstNormalOID = 16384

// prewarmAllMax is the largest database whose files prewarmDatabase reads
// ahead whole; a bigger one gets its catalogs only. Measured on
// PostgreSQL 18 with file_copy_method = clone on the XFS image (a 15 MB
// template: a 100,000-row table and its index; medians of 20), a test's
// first transaction (create a table, fill it, update 49 rows) took 11.0 ms
// on a fresh clone, 6.1 ms once its files were read (20 ms to read them,
// off the test's path), 3.7 ms on a database used before. At this bound a
// pool of hundreds of ready databases stays within a few GiB of cache.
const prewarmAllMax = 32 << 20

// prewarmDatabase asks the kernel to read the files of database directory
// dir (DataDir/base/<oid>) into the page cache, without waiting
// (posix_fadvise WILLNEED): every file when they total at most
// prewarmAllMax, else the system catalogs' only. A clone on XFS or btrfs is
// a new inode whose pages are not cached even though its blocks are the
// template's: measured on PostgreSQL 18 with file_copy_method = clone on
// the XFS image (issue 33), a test's first transaction on a fresh clone
// (create a table, fill it, update 49 rows of a 180 MB table) took 15.0 ms,
// 10.8 ms with its catalogs read ahead, 5.5 ms on a database used before
// (medians of 12). It reads nothing itself and opens the directory and its
// files without following links; errors are ignored (a server whose files
// this process may not open stays cold).
func prewarmDatabase(dir string) {
	d, err := unix.Open(dir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return
	}
	defer unix.Close(d)
	names, err := readDirNames(d)
	if err != nil {
		return
	}
	var total int64
	for _, n := range names {
		var st unix.Stat_t
		if unix.Fstatat(d, n, &st, unix.AT_SYMLINK_NOFOLLOW) == nil && st.Mode&unix.S_IFMT == unix.S_IFREG {
			total += st.Size
		}
	}
	all := total <= prewarmAllMax
	for _, n := range names {
		if !all && !catalogFile(n) {
			continue
		}
		f, err := unix.Openat(d, n, unix.O_RDONLY|unix.O_NOFOLLOW|unix.O_NONBLOCK|unix.O_CLOEXEC, 0)
		if err != nil {
			continue
		}
		_ = unix.Fadvise(f, 0, 0, unix.FADV_WILLNEED)
		_ = unix.Close(f)
	}
}

// readDirNames lists the directory open at fd.
func readDirNames(fd int) ([]string, error) {
	var names []string
	buf := make([]byte, 32<<10)
	for {
		n, err := unix.Getdents(fd, buf)
		if err != nil {
			return nil, err
		}
		if n <= 0 {
			return names, nil
		}
		_, _, names = unix.ParseDirent(buf[:n], -1, names)
	}
}

// catalogFile says whether name is a file of a system catalog: a
// relfilenode below firstNormalOID, with an optional fork (_fsm, _vm,
// _init) and segment (.N).
func catalogFile(name string) bool {
	base := name
	if i := strings.IndexAny(base, "._"); i >= 0 {
		base = base[:i]
	}
	n, err := strconv.Atoi(base)
	return err == nil && n > 0 && n < firstNormalOID
}
