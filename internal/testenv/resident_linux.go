package testenv

import (
	"os"
	"path/filepath"
	"testing"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Resident is the fraction of the pages of the files in dir whose names
// keep accepts that are in the page cache (mincore). It fails the test
// when they have no pages at all.
func Resident(t testing.TB, dir string, keep func(name string) bool) float64 {
	t.Helper()
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var in, all int
	for _, e := range ents {
		if !e.Type().IsRegular() || !keep(e.Name()) {
			continue
		}
		f, err := os.Open(filepath.Join(dir, e.Name()))
		if err != nil {
			t.Fatal(err)
		}
		st, _ := f.Stat()
		if st.Size() > 0 {
			m, err := unix.Mmap(int(f.Fd()), 0, int(st.Size()), unix.PROT_READ, unix.MAP_SHARED)
			if err != nil {
				t.Fatal(err)
			}
			vec := make([]byte, (st.Size()+int64(os.Getpagesize())-1)/int64(os.Getpagesize()))
			if _, _, e := unix.Syscall(unix.SYS_MINCORE, uintptr(unsafe.Pointer(&m[0])), uintptr(len(m)), uintptr(unsafe.Pointer(&vec[0]))); e != 0 {
				t.Fatal(e)
			}
			for _, v := range vec {
				all++
				if v&1 != 0 {
					in++
				}
			}
			_ = unix.Munmap(m)
		}
		f.Close()
	}
	if all == 0 {
		t.Fatalf("no pages in the files kept of %s", dir)
	}
	return float64(in) / float64(all)
}
