package main

import (
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"unsafe"

	"golang.org/x/sys/unix"
)

// uniqueBytes is the disk the regular files under dirs use, each physical
// block counted once however many files share it by reflink (the union of
// their FIEMAP extents): what the tree costs the volume, whoever else
// writes on it.
func uniqueBytes(dirs ...string) int64 {
	type span struct{ a, b uint64 }
	var spans []span
	var unknown int64
	const (
		fiemapIoc     = 0xC020660B // FS_IOC_FIEMAP
		fiemapSync    = 0x1        // FIEMAP_FLAG_SYNC
		extentLast    = 0x1
		extentUnknown = 0x2 // no physical address yet (delayed allocation)
		batch         = 128
	)
	type extent struct {
		Logical, Physical, Length uint64
		_                         [2]uint64
		Flags                     uint32
		_                         [3]uint32
	}
	type buf struct {
		Start, Length                        uint64
		Flags, MappedExtents, ExtentCount, _ uint32
		Extents                              [batch]extent
	}
	walk := func(p string, d fs.DirEntry, err error) error {
		if err != nil || !d.Type().IsRegular() {
			return nil
		}
		f, err := os.Open(p)
		if err != nil {
			return nil
		}
		defer f.Close()
		var b buf
		start := uint64(0)
		for {
			b.Start, b.Length, b.Flags, b.ExtentCount, b.MappedExtents = start, ^uint64(0)-start, fiemapSync, batch, 0
			if _, _, e := unix.Syscall(unix.SYS_IOCTL, f.Fd(), fiemapIoc, uintptr(unsafe.Pointer(&b))); e != 0 {
				return nil
			}
			n := int(b.MappedExtents)
			if n == 0 {
				return nil
			}
			for _, x := range b.Extents[:n] {
				if x.Flags&extentUnknown != 0 {
					unknown += int64(x.Length)
				} else {
					spans = append(spans, span{x.Physical, x.Physical + x.Length})
				}
				start = x.Logical + x.Length
				if x.Flags&extentLast != 0 {
					return nil
				}
			}
		}
	}
	for _, dir := range dirs {
		_ = filepath.WalkDir(dir, walk)
	}
	sort.Slice(spans, func(i, j int) bool { return spans[i].a < spans[j].a })
	var total uint64
	var end uint64
	for _, s := range spans {
		if s.a > end {
			end = s.a
		}
		if s.b > end {
			total += s.b - end
			end = s.b
		}
	}
	return int64(total) + unknown
}
