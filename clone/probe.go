package clone

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"math/rand/v2"
	"os"

	"github.com/pgfork/pgfork/internal/errs"
)

// ProbeResult says which copy methods work from one directory to another,
// found by copying a real file.
type ProbeResult struct {
	// FSType is the destination filesystem's type ("xfs", "ext4", ...).
	FSType string `json:"fs_type"`
	// SrcFSType is the source filesystem's type.
	SrcFSType string `json:"src_fs_type"`
	// Clone, CopyFileRange and Copy say whether each method worked.
	Clone         bool `json:"clone"`
	CopyFileRange bool `json:"copy_file_range"`
	Copy          bool `json:"copy"`
	// SharesBlocks says whether the copy shares blocks with its source
	// (FIEMAP reports the copy's extents as shared).
	SharesBlocks bool `json:"shares_blocks"`
	// Best is the method auto uses for this pair.
	Best Method `json:"best"`
	// Errors holds why each method that failed did so.
	Errors map[Method]string `json:"errors,omitempty"`
}

func (p *ProbeResult) works(m Method) bool {
	switch m {
	case Clone:
		return p.Clone
	case CopyFileRange:
		return p.CopyFileRange
	case PlainCopy:
		return p.Copy
	}
	return false
}

const probeBytes = 256 << 10

// Probe finds which methods work for copying files from srcDir to dstDir by
// writing a real test file in srcDir and copying it into dstDir by each
// method (the test files are removed). srcDir and dstDir may be the same.
func Probe(ctx context.Context, srcDir, dstDir string) (*ProbeResult, error) {
	f, err := os.CreateTemp(srcDir, ".pgfork-probe-src-*")
	if err != nil {
		return nil, errs.FromOS(err, srcDir, "cannot create a probe file")
	}
	defer os.Remove(f.Name())
	defer f.Close()
	data := make([]byte, probeBytes)
	r := rand.New(rand.NewPCG(1, 2))
	for i := range data {
		data[i] = byte(r.Uint32())
	}
	if _, err := f.Write(data); err != nil {
		return nil, errs.FromOS(err, f.Name(), "cannot write the probe file")
	}
	if err := f.Sync(); err != nil {
		return nil, errs.FromOS(err, f.Name(), "cannot sync the probe file")
	}
	res, err := probeFile(ctx, f.Name(), dstDir)
	if err != nil {
		return nil, errs.FromOS(err, dstDir, "probe failed")
	}
	res.SrcFSType, _ = FSType(srcDir)
	return res, nil
}

// probeFile copies (part of) the existing file srcPath into a temporary file
// in dstDir by each method and checks the result. It returns an error only
// for failures that are not "this method cannot serve this pair" (EIO,
// ENOSPC, EACCES...).
func probeFile(ctx context.Context, srcPath, dstDir string) (*ProbeResult, error) {
	res := &ProbeResult{Errors: map[Method]string{}, Best: PlainCopy}
	res.FSType, _ = FSType(dstDir)
	sf, err := os.Open(srcPath)
	if err != nil {
		return nil, err
	}
	defer sf.Close()
	fi, err := sf.Stat()
	if err != nil {
		return nil, err
	}
	n := min(fi.Size(), probeBytes)
	want := make([]byte, n)
	if _, err := io.ReadFull(io.NewSectionReader(sf, 0, n), want); err != nil {
		return nil, err
	}
	try := func(m Method) (bool, error) {
		df, err := os.CreateTemp(dstDir, ".pgfork-probe-*")
		if err != nil {
			return false, err
		}
		defer os.Remove(df.Name())
		defer df.Close()
		switch m {
		case Clone:
			err = copyWith(ctx, Clone, sf, df, fi.Size(), func(int64) {})
		case CopyFileRange:
			err = probeCopyRange(ctx, sf, df, n)
		default:
			err = copyWith(ctx, PlainCopy, sf, df, n, func(int64) {})
		}
		if err != nil {
			if fallbackable(err) {
				res.Errors[m] = err.Error()
				return false, nil
			}
			return false, fmt.Errorf("probe %s: %w", m, err)
		}
		got := make([]byte, n)
		if _, err := io.ReadFull(io.NewSectionReader(df, 0, n), got); err != nil {
			return false, fmt.Errorf("probe %s: reading back: %w", m, err)
		}
		if !bytes.Equal(got, want) {
			res.Errors[m] = "the copy differs from the source"
			return false, nil
		}
		if m != PlainCopy && !res.SharesBlocks {
			if s, err := sharedBytesFd(int(df.Fd())); err == nil && s > 0 {
				res.SharesBlocks = true
			}
		}
		return true, nil
	}
	for _, m := range []Method{Clone, CopyFileRange, PlainCopy} {
		ok, err := try(m)
		if err != nil {
			return nil, err
		}
		switch m {
		case Clone:
			res.Clone = ok
		case CopyFileRange:
			res.CopyFileRange = ok
		case PlainCopy:
			res.Copy = ok
		}
	}
	switch {
	case res.Clone:
		res.Best = Clone
	case res.CopyFileRange:
		res.Best = CopyFileRange
	case res.Copy:
		res.Best = PlainCopy
	default:
		return nil, errs.New(errs.Internal, "no copy method works from %s to %s", srcPath, dstDir)
	}
	return res, nil
}
