package pgbackup

import (
	"encoding/binary"
	"fmt"
	"io"
	"os"
	"strings"
)

// Block layout assumed by pgfork (PostgreSQL's defaults; pg_combinebackup
// is built with the same constants as its server).
const (
	BlockSize = 8192
	// RelSegBlocks is the number of blocks in a 1 GiB relation segment.
	RelSegBlocks = 131072
	// IncrementalPrefix starts the name of an incremental file.
	IncrementalPrefix = "INCREMENTAL."
	incrementalMagic  = 0xd3ae1f0d
)

// Incremental is the header of an INCREMENTAL.* file: which blocks it
// holds, where their data starts, and how long the relation segment was
// (in blocks) when the backup was taken.
type Incremental struct {
	Blocks []uint32 // relative block numbers, in file order
	// TruncationBlocks is the truncation block length: blocks at or
	// beyond it are not taken from older backups.
	TruncationBlocks uint32
	// HeaderLen is where block data starts: the header rounded up to
	// BlockSize when the file holds blocks (since PostgreSQL 17's
	// alignment of incremental files).
	HeaderLen int64
}

// DataOffset is the offset in the file of its i-th block.
func (h *Incremental) DataOffset(i int) int64 { return h.HeaderLen + int64(i)*BlockSize }

// OutputBlocks is the length in blocks of the file rebuilt with this as
// its newest version: the truncation length, or further if it holds
// blocks beyond it.
func (h *Incremental) OutputBlocks() uint32 {
	n := h.TruncationBlocks
	for _, b := range h.Blocks {
		if b >= n {
			n = b + 1
		}
	}
	return n
}

// ReadIncremental reads and checks the header of an incremental file
// (also that the file is long enough for the blocks it announces).
func ReadIncremental(f *os.File) (*Incremental, error) {
	var hdr [12]byte
	if _, err := io.ReadFull(io.NewSectionReader(f, 0, 12), hdr[:]); err != nil {
		return nil, fmt.Errorf("%s: incremental header: %w", f.Name(), err)
	}
	magic := binary.LittleEndian.Uint32(hdr[0:])
	n := binary.LittleEndian.Uint32(hdr[4:])
	trunc := binary.LittleEndian.Uint32(hdr[8:])
	if magic != incrementalMagic {
		return nil, fmt.Errorf("%s: bad incremental magic number 0x%x", f.Name(), magic)
	}
	if n > RelSegBlocks {
		return nil, fmt.Errorf("%s: block count %d exceeds the segment size %d", f.Name(), n, RelSegBlocks)
	}
	if trunc > RelSegBlocks {
		return nil, fmt.Errorf("%s: truncation block length %d exceeds the segment size %d", f.Name(), trunc, RelSegBlocks)
	}
	h := &Incremental{TruncationBlocks: trunc, HeaderLen: 12 + 4*int64(n)}
	if n > 0 {
		raw := make([]byte, 4*int64(n))
		if _, err := f.ReadAt(raw, 12); err != nil {
			return nil, fmt.Errorf("%s: incremental block list: %w", f.Name(), err)
		}
		h.Blocks = make([]uint32, n)
		for i := range h.Blocks {
			h.Blocks[i] = binary.LittleEndian.Uint32(raw[4*i:])
			if h.Blocks[i] >= RelSegBlocks {
				return nil, fmt.Errorf("%s: block number %d beyond the segment size", f.Name(), h.Blocks[i])
			}
		}
		if r := h.HeaderLen % BlockSize; r != 0 {
			h.HeaderLen += BlockSize - r
		}
		st, err := f.Stat()
		if err != nil {
			return nil, err
		}
		if want := h.DataOffset(int(n)); st.Size() < want {
			return nil, fmt.Errorf("%s: file is too short: %d bytes, its header announces %d", f.Name(), st.Size(), want)
		}
	}
	return h, nil
}

// IsIncrementalDir reports whether rel (a directory relative to the data
// directory, '/' separated) may hold incremental files, by
// pg_combinebackup's rule: base/*, global and pg_tblspc/*. Elsewhere an
// INCREMENTAL.* name is an ordinary file.
func IsIncrementalDir(rel string) bool {
	return strings.HasPrefix(rel, "base/") || rel == "global" || strings.HasPrefix(rel, "pg_tblspc/")
}
