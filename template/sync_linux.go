package template

import (
	"bytes"
	"errors"
	"io"
	"os"

	"golang.org/x/sys/unix"
)

// sparsifyWAL punches holes where the WAL segments in dataDir/pg_wal hold
// only zeros. After a clean shutdown a fresh segment is mostly its zeroed
// tail (16 MB of a ~40 MB cluster); PostgreSQL reads holes as the zeros it
// wrote, and copies keep holes, so every clone copies that much less.
func sparsifyWAL(dataDir string) error {
	wal := dataDir + "/pg_wal"
	ents, err := os.ReadDir(wal)
	if err != nil {
		return err
	}
	buf := make([]byte, 64<<10)
	for _, e := range ents {
		if !e.Type().IsRegular() || len(e.Name()) != 24 {
			continue
		}
		if err := punchZeros(wal+"/"+e.Name(), buf); err != nil {
			return err
		}
	}
	return nil
}

func punchZeros(p string, buf []byte) error {
	f, err := os.OpenFile(p, os.O_RDWR, 0)
	if err != nil {
		return err
	}
	defer f.Close()
	const blk = 8192 // XLOG_BLCKSZ, a multiple of the filesystem block
	var off, runStart int64 = 0, -1
	punch := func(end int64) error {
		if runStart >= 0 && end > runStart {
			err := unix.Fallocate(int(f.Fd()), unix.FALLOC_FL_PUNCH_HOLE|unix.FALLOC_FL_KEEP_SIZE, runStart, end-runStart)
			if errors.Is(err, unix.EOPNOTSUPP) {
				return errStop
			}
			if err != nil {
				return os.NewSyscallError("fallocate", err)
			}
		}
		runStart = -1
		return nil
	}
	for {
		n, rerr := io.ReadFull(f, buf)
		for i := 0; i+blk <= n; i += blk {
			if allZero(buf[i : i+blk]) {
				if runStart < 0 {
					runStart = off + int64(i)
				}
			} else if err := punch(off + int64(i)); err != nil {
				return ignoreStop(err)
			}
		}
		off += int64(n)
		if rerr != nil {
			break
		}
	}
	return ignoreStop(punch(off - off%blk))
}

var errStop = errors.New("holes not supported")

func ignoreStop(err error) error {
	if errors.Is(err, errStop) {
		return nil
	}
	return err
}

var zeroBlock [8192]byte

func allZero(b []byte) bool { return bytes.Equal(b, zeroBlock[:len(b)]) }

// fsSpace returns the bytes available to unprivileged users and the size
// of the filesystem holding path.
func fsSpace(path string) (free, total int64, err error) {
	var s unix.Statfs_t
	if err := unix.Statfs(path, &s); err != nil {
		return 0, 0, err
	}
	return int64(s.Bavail) * s.Bsize, int64(s.Blocks) * s.Bsize, nil
}
