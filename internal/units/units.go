// Package units formats quantities for people: sizes in binary units.
//
// It is the one place byte counts are formatted for people (binary units:
// never "MB" for MiB). It must not be used for --json output, which carries
// plain numbers (docs/cli.md).
package units

import "fmt"

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
