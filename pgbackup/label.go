// Package pgbackup reads what pg_basebackup writes: backup_label,
// backup_manifest and the INCREMENTAL.* files of incremental backups
// (PostgreSQL 17+), checks that a list of backups forms a chain that can be
// combined, finds chains in a directory and runs pg_basebackup to add to
// one. It knows the formats, not how to rebuild a data directory (package
// restore does that).
package pgbackup

import (
	"bytes"
	"fmt"
	"strconv"
	"strings"

	"github.com/pgfork/pgfork/internal/errs"
)

// LSN is a WAL location.
type LSN uint64

// String formats the LSN as PostgreSQL does ("0/3000028").
func (l LSN) String() string { return fmt.Sprintf("%X/%X", uint32(l>>32), uint32(l)) }

// ParseLSN parses "X/Y" (hexadecimal halves).
func ParseLSN(s string) (LSN, error) {
	hi, lo, ok := strings.Cut(strings.TrimSpace(s), "/")
	if !ok {
		return 0, fmt.Errorf("bad LSN %q", s)
	}
	h, err1 := strconv.ParseUint(hi, 16, 32)
	l, err2 := strconv.ParseUint(lo, 16, 32)
	if err1 != nil || err2 != nil {
		return 0, fmt.Errorf("bad LSN %q", s)
	}
	return LSN(h<<32 | l), nil
}

// Label is what a backup_label says about a backup.
type Label struct {
	StartLSN LSN
	StartTLI uint32
	// PrevLSN and PrevTLI are the INCREMENTAL FROM lines: the start of the
	// backup this one is incremental to. Zero for a full backup.
	PrevLSN LSN
	PrevTLI uint32
	// StartTime is the START TIME line, as written.
	StartTime string
	// Raw is the file as read.
	Raw []byte
}

// Incremental reports whether the label is of an incremental backup.
func (l *Label) Incremental() bool { return l.PrevTLI != 0 }

// ParseLabel parses a backup_label; name is used in errors. Like
// pg_combinebackup it requires START WAL LOCATION and START TIMELINE, and
// both INCREMENTAL FROM lines or neither.
func ParseLabel(name string, b []byte) (*Label, error) {
	l := &Label{Raw: b}
	found := 0
	bad := func(what string) error {
		return errs.New(errs.Usage, "backup_label: cannot parse %s", what).WithPath(name).
			WithHint("the backup is damaged or not made by pg_basebackup; take a new one")
	}
	for _, line := range strings.SplitAfter(string(b), "\n") {
		switch {
		case strings.HasPrefix(line, "START WAL LOCATION: "):
			f := strings.Fields(strings.TrimPrefix(line, "START WAL LOCATION: "))
			if len(f) == 0 {
				return nil, bad("START WAL LOCATION")
			}
			v, err := ParseLSN(f[0])
			if err != nil {
				return nil, bad("START WAL LOCATION")
			}
			l.StartLSN, found = v, found|1
		case strings.HasPrefix(line, "START TIMELINE: "):
			v, err := strconv.ParseUint(strings.TrimSpace(strings.TrimPrefix(line, "START TIMELINE: ")), 10, 32)
			if err != nil || v == 0 {
				return nil, bad("START TIMELINE")
			}
			l.StartTLI, found = uint32(v), found|2
		case strings.HasPrefix(line, "INCREMENTAL FROM LSN: "):
			v, err := ParseLSN(strings.TrimPrefix(line, "INCREMENTAL FROM LSN: "))
			if err != nil {
				return nil, bad("INCREMENTAL FROM LSN")
			}
			l.PrevLSN, found = v, found|4
		case strings.HasPrefix(line, "INCREMENTAL FROM TLI: "):
			v, err := strconv.ParseUint(strings.TrimSpace(strings.TrimPrefix(line, "INCREMENTAL FROM TLI: ")), 10, 32)
			if err != nil || v == 0 {
				return nil, bad("INCREMENTAL FROM TLI")
			}
			l.PrevTLI, found = uint32(v), found|8
		case strings.HasPrefix(line, "START TIME: "):
			l.StartTime = strings.TrimSpace(strings.TrimPrefix(line, "START TIME: "))
		}
	}
	switch {
	case found&1 == 0:
		return nil, bad("START WAL LOCATION (missing)")
	case found&2 == 0:
		return nil, bad("START TIMELINE (missing)")
	case (found&4 == 0) != (found&8 == 0):
		return nil, bad("INCREMENTAL FROM LSN/TLI (only one of the two)")
	}
	return l, nil
}

// CombinedLabel is the label of the combined backup: the newest backup's,
// without its INCREMENTAL FROM lines (as pg_combinebackup writes it).
func (l *Label) CombinedLabel() []byte {
	var out bytes.Buffer
	for _, line := range bytes.SplitAfter(l.Raw, []byte("\n")) {
		if bytes.HasPrefix(line, []byte("INCREMENTAL FROM LSN: ")) || bytes.HasPrefix(line, []byte("INCREMENTAL FROM TLI: ")) {
			continue
		}
		out.Write(line)
	}
	return out.Bytes()
}
