package pgdata

import "testing"

func TestParseLSN(t *testing.T) {
	for in, want := range map[string]uint64{
		"1/2A000028":  1<<32 | 0x2A000028,
		"0/3000028":   0x3000028,
		" 0/0\n":      0,
		"ff/ffffffff": 0xff<<32 | 0xffffffff,
		"0/00000060":  0x60, // a zero-padded low half is the same LSN
	} {
		l, err := ParseLSN(in)
		if err != nil || uint64(l) != want {
			t.Errorf("ParseLSN(%q) = %X, %v; want %X", in, uint64(l), err, want)
		}
	}
	if l, _ := ParseLSN("1/2a000028"); l.String() != "1/2A000028" {
		t.Errorf("String = %s, want 1/2A000028", l)
	}
	for _, bad := range []string{"", "12", "x/1", "1/", "/1", "100000000/0", "0/100000000", "-1/0", "+1/0", "0/1/2"} {
		if _, err := ParseLSN(bad); err == nil {
			t.Errorf("ParseLSN(%q) accepted", bad)
		}
	}
}

func TestSegmentName(t *testing.T) {
	const seg = 16 << 20
	l, _ := ParseLSN("1/2A000028")
	if got := SegmentName(1, uint64(l)/seg, seg); got != "00000001000000010000002A" {
		t.Errorf("SegmentName = %s", got)
	}
	if tli, segno, ok := ParseSegmentName("00000002000000010000002A", seg); !ok || tli != 2 || segno != uint64(l)/seg {
		t.Errorf("ParseSegmentName: %d %d %v", tli, segno, ok)
	}
	// 1 GB segments: 4 per "log id".
	if got := SegmentName(3, 9, 1<<30); got != "000000030000000200000001" {
		t.Errorf("SegmentName(1GB) = %s", got)
	}
	if tli, segno, ok := ParseSegmentName("000000030000000200000001", 1<<30); !ok || tli != 3 || segno != 9 {
		t.Errorf("ParseSegmentName(1GB): %d %d %v", tli, segno, ok)
	}
	for _, bad := range []string{"00000002.history", "000000010000000000000005.00000028.backup", "00000001000000000000000a", "0000000100000000000000050", "junk", ""} {
		if _, _, ok := ParseSegmentName(bad, seg); ok {
			t.Errorf("ParseSegmentName(%q) accepted", bad)
		}
	}
}
