package pgbackup

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestManifestRoundTrip writes a manifest as PostgreSQL does (escaped and
// non-UTF-8 paths included) and reads it back through the checksum check;
// a changed byte must then be refused.
func TestManifestRoundTrip(t *testing.T) {
	w := NewManifestWriter(2, 7441234567890123456)
	mt := time.Date(2026, 11, 23, 3, 4, 5, 0, time.UTC)
	w.Add("base/1/1259", 8192, mt, "CRC32C", []byte{1, 2, 3, 4})
	w.Add("odd \"name\"\n", 3, mt, "", nil)
	w.Add("latin1-\xe9", 0, mt, "CRC32C", []byte{0, 0, 0, 0})
	b := w.Finish([]WALRange{{Timeline: 1, Start: 0x3000028, End: 0x3000100}})
	if !strings.Contains(string(b), `"Last-Modified": "2026-11-23 03:04:05 GMT"`) || !strings.Contains(string(b), `"Encoded-Path": "6c6174696e312de9"`) {
		t.Fatalf("unexpected manifest text:\n%s", b)
	}
	p := filepath.Join(t.TempDir(), "backup_manifest")
	if err := os.WriteFile(p, b, 0o600); err != nil {
		t.Fatal(err)
	}
	m, err := ReadManifest(p)
	if err != nil {
		t.Fatal(err)
	}
	if m.SystemID != 7441234567890123456 || len(m.Files) != 3 || m.Files["odd \"name\"\n"] == nil || m.Files["latin1-\xe9"] == nil ||
		m.Files["base/1/1259"].Size != 8192 || len(m.WAL) != 1 || m.WAL[0].Start.String() != "0/3000028" {
		t.Fatalf("read back %+v", m)
	}
	b[20] ^= 1
	_ = os.WriteFile(p, b, 0o600)
	if _, err := ReadManifest(p); err == nil {
		t.Fatal("a damaged manifest was accepted")
	}
}
