package pgdata

import (
	"fmt"
	"strconv"
	"strings"
)

// LSN is a PostgreSQL write-ahead log position (an XLogRecPtr).
type LSN uint64

// ParseLSN parses the text form PostgreSQL writes, "X/Y": two hexadecimal
// numbers of at most 32 bits each, such as "0/3000028" or "1/2A000028".
func ParseLSN(s string) (LSN, error) {
	hi, lo, ok := strings.Cut(strings.TrimSpace(s), "/")
	if !ok {
		return 0, fmt.Errorf("bad LSN %q: want X/Y, two hexadecimal numbers such as 0/3000028", s)
	}
	h, err1 := strconv.ParseUint(hi, 16, 32)
	l, err2 := strconv.ParseUint(lo, 16, 32)
	if err1 != nil || err2 != nil {
		return 0, fmt.Errorf("bad LSN %q: want X/Y, two hexadecimal numbers of at most 8 digits such as 0/3000028", s)
	}
	return LSN(h<<32 | l), nil
}

// String formats the LSN as PostgreSQL does ("0/3000028").
func (l LSN) String() string { return fmt.Sprintf("%X/%X", uint32(l>>32), uint32(l)) }

// SegmentName returns the WAL file name of segment number segno on
// timeline tli for a segment size of segSize bytes (as PostgreSQL's
// XLogFileName does). segSize is a power of two from 1 MB to 1 GB.
func SegmentName(tli uint32, segno uint64, segSize int64) string {
	perID := uint64(0x100000000) / uint64(segSize)
	return fmt.Sprintf("%08X%08X%08X", tli, segno/perID, segno%perID)
}

// ParseSegmentName is the inverse of SegmentName: ok is false when name is
// not a WAL segment file name (24 upper-case hexadecimal digits).
func ParseSegmentName(name string, segSize int64) (tli uint32, segno uint64, ok bool) {
	if !isSegmentName(name) {
		return 0, 0, false
	}
	t, _ := strconv.ParseUint(name[0:8], 16, 32)
	hi, _ := strconv.ParseUint(name[8:16], 16, 32)
	lo, _ := strconv.ParseUint(name[16:24], 16, 32)
	perID := uint64(0x100000000) / uint64(segSize)
	return uint32(t), hi*perID + lo, true
}

// isSegmentName reports whether name has the form of a WAL segment file
// name: 24 upper-case hexadecimal digits, as PostgreSQL's IsXLogFileName.
func isSegmentName(name string) bool {
	if len(name) != 24 {
		return false
	}
	for _, c := range []byte(name) {
		if (c < '0' || c > '9') && (c < 'A' || c > 'F') {
			return false
		}
	}
	return true
}
