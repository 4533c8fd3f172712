package clone

import (
	"context"
	"io/fs"
	"os"
	"path/filepath"
)

// Crossing is a copy that cannot clone although its source's filesystem
// can: its destination is on another filesystem (CrossesFS).
type Crossing struct {
	// SrcFS and DstFS are the two filesystems' types, as FSType names
	// them.
	SrcFS string `json:"src_fs_type"`
	DstFS string `json:"dst_fs_type"`
}

// SameFS reports whether paths a and b (both existing) are on one
// filesystem: one device. Where the platform cannot tell, it says so.
func SameFS(a, b string) (bool, error) {
	da, err := devOf(a)
	if err != nil {
		return false, err
	}
	db, err := devOf(b)
	if err != nil {
		return false, err
	}
	return da == db, nil
}

// CrossesFS reports whether files copied from the regular file src (only
// read) into the directory dstDir lose the clones src's filesystem could
// give: src's filesystem may clone (MayClone) and dstDir is on another
// one, so every byte is copied. On two devices of one type (btrfs
// subvolumes, which clone into each other; two XFS mounts, which do not)
// one clone of src into dstDir is tried (the trial file is removed). It
// returns nil when the copy clones, or when src's filesystem never would
// (nothing is lost then); it writes nothing but the trial.
func CrossesFS(ctx context.Context, src, dstDir string) (*Crossing, error) {
	sfs, err := FSType(src)
	if err != nil {
		return nil, err
	}
	if !MayClone(sfs) {
		return nil, nil
	}
	same, err := SameFS(src, dstDir)
	if err != nil || same {
		return nil, err
	}
	dfs, err := FSType(dstDir)
	if err != nil {
		return nil, err
	}
	if dfs == sfs && cloneTrial(ctx, src, dstDir) {
		return nil, nil
	}
	return &Crossing{SrcFS: sfs, DstFS: dfs}, nil
}

// cloneTrial says whether src clones into a new file in dstDir.
func cloneTrial(ctx context.Context, src, dstDir string) bool {
	sf, err := os.Open(src)
	if err != nil {
		return false
	}
	defer sf.Close()
	fi, err := sf.Stat()
	if err != nil || !fi.Mode().IsRegular() {
		return false
	}
	df, err := os.CreateTemp(dstDir, ".pgfork-probe-*")
	if err != nil {
		return false
	}
	defer os.Remove(df.Name())
	defer df.Close()
	return copyWith(ctx, Clone, sf, df, fi.Size(), func(int64) {}) == nil
}

// TreeBytes is the sum of the sizes of the regular files under root (no
// symbolic link followed; what cannot be read is left out): what a copy
// of root writes where it cannot clone.
func TreeBytes(root string) int64 {
	var n int64
	_ = filepath.WalkDir(root, func(_ string, d fs.DirEntry, err error) error {
		if err != nil || !d.Type().IsRegular() {
			return nil
		}
		if fi, err := d.Info(); err == nil {
			n += fi.Size()
		}
		return nil
	})
	return n
}
