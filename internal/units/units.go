// Package units formats quantities for people: sizes in binary units.
//
// It is the one place byte counts are formatted for people (binary units:
// never "MB" for MiB). It must not be used for --json output, which carries
// plain numbers (docs/cli.md).
package units

import (
	"fmt"
	"strconv"
	"strings"
)

// Bytes formats n bytes in binary units: "512 B", "1.5 KiB", "3.1 GiB".
func Bytes(n int64) string {
	const unit = 1024
	if n < unit {
		return fmt.Sprintf("%d B", n)
	}
	div, exp := int64(unit), 0
	for m := n / unit; m >= unit; m /= unit {
		div *= unit
		exp++
	}
	return fmt.Sprintf("%.1f %ciB", float64(n)/float64(div), "KMGTPE"[exp])
}

// ParseBytes reads a size given by a person: a number of bytes, or a number
// followed by K, M, G or T (binary: 1K = 1024), optionally "iB"/"B" after.
func ParseBytes(s string) (int64, error) {
	t := strings.TrimSpace(s)
	t = strings.TrimSuffix(strings.TrimSuffix(t, "B"), "i")
	mult := int64(1)
	if n := len(t); n > 0 {
		if i := strings.IndexByte("KMGT", t[n-1]&^0x20); i >= 0 {
			mult = int64(1) << (10 * (i + 1))
			t = t[:n-1]
		}
	}
	v, err := strconv.ParseFloat(strings.TrimSpace(t), 64)
	if err != nil || v <= 0 || v*float64(mult) > 1<<62 {
		return 0, fmt.Errorf("bad size %q: give a positive number with an optional K, M, G or T suffix", s)
	}
	return int64(v * float64(mult)), nil
}
