package clone

import (
	"bytes"
	"os"
	"path/filepath"
	"testing"

	"github.com/pgfork/pgfork/internal/testenv"
)

// TestRangeCopier copies block ranges between files on XFS (reflink),
// ext4 and tmpfs: aligned ranges are cloned where the filesystem can,
// unaligned ones fall back for that range only, and the bytes are right
// in every case.
func TestRangeCopier(t *testing.T) {
	for _, fsc := range []struct {
		name     string
		dir      func(testing.TB) string
		canClone bool
	}{
		{"xfs", testenv.XFSDir, true},
		{"ext4", testenv.Dir, false},
		{"tmpfs", testenv.TmpfsDir, false},
	} {
		t.Run(fsc.name, func(t *testing.T) {
			dir := fsc.dir(t)
			src := filepath.Join(dir, "src")
			writeRandom(t, src, 1<<20, 7)
			sf, err := os.Open(src)
			must(t, err)
			defer sf.Close()
			df, err := os.Create(filepath.Join(dir, "dst"))
			must(t, err)
			defer df.Close()
			rc := &RangeCopier{}
			// 16 blocks of 8 KiB from offset 64 KiB to offset 0, aligned.
			m, err := rc.CopyRange(df, sf, 0, 64<<10, 128<<10, nil)
			must(t, err)
			if fsc.canClone && m != Clone || !fsc.canClone && m == Clone {
				t.Errorf("aligned range copied by %s", m)
			}
			// Unaligned source offset: never a clone, still right.
			m2, err := rc.CopyRange(df, sf, 128<<10, 3000, 8192, nil)
			must(t, err)
			if m2 == Clone {
				t.Errorf("unaligned range reported as cloned")
			}
			// After an unaligned range, aligned ones still clone.
			m3, err := rc.CopyRange(df, sf, 256<<10, 512<<10, 64<<10, nil)
			must(t, err)
			if fsc.canClone && m3 != Clone {
				t.Errorf("aligned range after an unaligned one copied by %s (the fallback must be per range)", m3)
			}
			// Plain copy only.
			plain := &RangeCopier{NoClone: true, NoCopyRange: true}
			m4, err := plain.CopyRange(df, sf, 320<<10, 0, 4096, make([]byte, 1000))
			must(t, err)
			if m4 != PlainCopy {
				t.Errorf("NoClone+NoCopyRange used %s", m4)
			}
			all, err := os.ReadFile(src)
			must(t, err)
			got, err := os.ReadFile(df.Name())
			must(t, err)
			for _, c := range []struct{ dst, src, n int }{{0, 64 << 10, 128 << 10}, {128 << 10, 3000, 8192}, {256 << 10, 512 << 10, 64 << 10}, {320 << 10, 0, 4096}} {
				if !bytes.Equal(got[c.dst:c.dst+c.n], all[c.src:c.src+c.n]) {
					t.Errorf("bytes at %d differ from the source's at %d", c.dst, c.src)
				}
			}
			if fsc.canClone {
				if sh, _ := SharedBytes(df.Name()); sh < 128<<10 {
					t.Errorf("only %d bytes shared after cloning 192 KiB", sh)
				}
			}
		})
	}
}
