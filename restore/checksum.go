package restore

import (
	"crypto/sha256"
	"crypto/sha512"
	"encoding/binary"
	"hash"
	"hash/crc32"
	"strings"

	"github.com/pgfork/pgfork/internal/errs"
)

// ChecksumAlgorithms are the manifest checksum algorithms, as
// pg_combinebackup --manifest-checksums names them; CRC32C is the default.
var ChecksumAlgorithms = []string{"NONE", "CRC32C", "SHA224", "SHA256", "SHA384", "SHA512"}

// checksumAlgorithm returns the canonical name of a (case-insensitive)
// algorithm name, "" meaning CRC32C.
func checksumAlgorithm(s string) (string, error) {
	if s == "" {
		return "CRC32C", nil
	}
	for _, a := range ChecksumAlgorithms {
		if strings.EqualFold(s, a) {
			return a, nil
		}
	}
	return "", errs.New(errs.Usage, "unknown manifest checksum algorithm %q", s).
		WithHint("use one of %s", strings.Join(ChecksumAlgorithms, ", "))
}

// checksum is a running manifest checksum of one algorithm.
type checksum struct {
	hash.Hash
	crc bool
}

// newChecksum starts a checksum of algo (canonical); nil for NONE.
func newChecksum(algo string) *checksum {
	switch algo {
	case "CRC32C":
		return &checksum{Hash: crc32.New(crc32.MakeTable(crc32.Castagnoli)), crc: true}
	case "SHA224":
		return &checksum{Hash: sha256.New224()}
	case "SHA256":
		return &checksum{Hash: sha256.New()}
	case "SHA384":
		return &checksum{Hash: sha512.New384()}
	case "SHA512":
		return &checksum{Hash: sha512.New()}
	}
	return nil
}

// bytes is the checksum as backup_manifest writes it in hex: for CRC32C
// the uint32 in memory (little-endian) order, as pg_checksum_final copies
// it; for the SHA-2 family the digest.
func (c *checksum) bytes() []byte {
	if c.crc {
		var b [4]byte
		binary.LittleEndian.PutUint32(b[:], c.Hash.(hash.Hash32).Sum32())
		return b[:]
	}
	return c.Sum(nil)
}

// digestLen is the length in bytes of a checksum of algo.
func digestLen(algo string) int {
	if c := newChecksum(algo); c != nil {
		return len(c.bytes())
	}
	return 0
}
