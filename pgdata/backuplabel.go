package pgdata

import (
	"bytes"
	"strconv"
	"strings"

	"github.com/pgfork/pgfork/internal/errs"
)

// BackupLabel is what a backup_label file says about a base backup: the
// labelfile pg_backup_stop returns, or the file pg_basebackup writes
// (with INCREMENTAL FROM lines for an incremental backup, PostgreSQL 17+).
type BackupLabel struct {
	// StartLSN and StartFile are the START WAL LOCATION line: where
	// recovery starts and the WAL file holding it ("" when the line does
	// not name it).
	StartLSN  LSN
	StartFile string
	// StartTLI is the START TIMELINE line (PostgreSQL 11+); for an older
	// label without it, the timeline of StartFile.
	StartTLI uint32
	// Checkpoint is the CHECKPOINT LOCATION line, zero when absent.
	Checkpoint LSN
	// PrevLSN and PrevTLI are the INCREMENTAL FROM lines: the start of the
	// backup this one is incremental to. Zero for a full backup.
	PrevLSN LSN
	PrevTLI uint32
	// StartTime, Label and BackupMethod are the START TIME, LABEL and
	// BACKUP METHOD lines, as written.
	StartTime    string
	Label        string
	BackupMethod string
	// Raw is the file as read.
	Raw []byte
}

// Incremental reports whether the label is of an incremental backup.
func (l *BackupLabel) Incremental() bool { return l.PrevTLI != 0 }

// CombinedLabel is the label of the backup that combining this one with
// the backups it is incremental to gives: this label without its
// INCREMENTAL FROM lines (as pg_combinebackup writes it).
func (l *BackupLabel) CombinedLabel() []byte {
	var out bytes.Buffer
	for _, line := range bytes.SplitAfter(l.Raw, []byte("\n")) {
		if bytes.HasPrefix(line, []byte("INCREMENTAL FROM LSN: ")) || bytes.HasPrefix(line, []byte("INCREMENTAL FROM TLI: ")) {
			continue
		}
		out.Write(line)
	}
	return out.Bytes()
}

// ParseBackupLabel parses the backup_label b; path names it in errors ("" for
// a label not read from a file). It applies the rules of PostgreSQL's
// readers: START WAL LOCATION is required; START TIMELINE too (PostgreSQL
// 11 and later always write it), except that a label without it takes the
// timeline from the start WAL file name, as the server does; when both are
// there they must agree. The INCREMENTAL FROM LSN and TLI lines come both
// or neither (pg_combinebackup's rule). A line that is there must parse.
// Every error is errs.Usage and names the line.
func ParseBackupLabel(path string, b []byte) (*BackupLabel, error) {
	bad := func(format string, args ...any) error {
		return errs.New(errs.Usage, "backup_label: "+format, args...).WithPath(path).
			WithHint("the backup_label is damaged or was not written by PostgreSQL; take a new backup")
	}
	lsnLine := func(k, v string) (LSN, error) {
		lsn, err := ParseLSN(v)
		if err != nil {
			return 0, bad("bad %s %q: want an LSN such as 0/2000028", k, v)
		}
		return lsn, nil
	}
	tliLine := func(k, v string) (uint32, error) {
		t, ok := parseTLI(v)
		if !ok {
			return 0, bad("bad %s %q: want a timeline number of 1 or more", k, v)
		}
		return t, nil
	}
	l := &BackupLabel{Raw: b}
	var haveStart, haveTLI, havePrevLSN, havePrevTLI bool
	for _, line := range strings.Split(string(b), "\n") {
		k, v, ok := strings.Cut(strings.TrimSuffix(line, "\r"), ": ")
		if !ok {
			continue
		}
		var err error
		switch k {
		case "START WAL LOCATION":
			lsn, file, ok := parseStartWAL(v)
			if !ok {
				return nil, bad("bad START WAL LOCATION %q: want an LSN such as 0/2000028, then optionally (file <24 hexadecimal digits>)", v)
			}
			l.StartLSN, l.StartFile, haveStart = lsn, file, true
		case "START TIMELINE":
			l.StartTLI, err = tliLine(k, v)
			haveTLI = true
		case "CHECKPOINT LOCATION":
			l.Checkpoint, err = lsnLine(k, v)
		case "INCREMENTAL FROM LSN":
			l.PrevLSN, err = lsnLine(k, v)
			havePrevLSN = true
		case "INCREMENTAL FROM TLI":
			l.PrevTLI, err = tliLine(k, v)
			havePrevTLI = true
		case "START TIME":
			l.StartTime = strings.TrimSpace(v)
		case "LABEL":
			l.Label = v
		case "BACKUP METHOD":
			l.BackupMethod = strings.TrimSpace(v)
		}
		if err != nil {
			return nil, err
		}
	}
	if !haveStart {
		return nil, bad("no START WAL LOCATION line")
	}
	fileTLI := uint32(0)
	if l.StartFile != "" {
		t, _ := strconv.ParseUint(l.StartFile[:8], 16, 32)
		fileTLI = uint32(t)
	}
	switch {
	case !haveTLI && fileTLI == 0:
		return nil, bad("no START TIMELINE line (and no start WAL file name to take the timeline from)")
	case !haveTLI:
		l.StartTLI = fileTLI
	case fileTLI != 0 && fileTLI != l.StartTLI:
		return nil, bad("START TIMELINE %d does not match the timeline %d of the start WAL file %s", l.StartTLI, fileTLI, l.StartFile)
	}
	if havePrevLSN != havePrevTLI {
		missing := "INCREMENTAL FROM TLI"
		if !havePrevLSN {
			missing = "INCREMENTAL FROM LSN"
		}
		return nil, bad("no %s line: an incremental backup's label has both INCREMENTAL FROM LSN and INCREMENTAL FROM TLI", missing)
	}
	return l, nil
}

// parseStartWAL parses the value of a START WAL LOCATION line:
// "0/2000028 (file 000000010000000000000002)"; the file part is optional.
func parseStartWAL(v string) (LSN, string, bool) {
	lsnText, rest, _ := strings.Cut(strings.TrimSpace(v), " ")
	lsn, err := ParseLSN(lsnText)
	if err != nil {
		return 0, "", false
	}
	rest = strings.TrimSpace(rest)
	if rest == "" {
		return lsn, "", true
	}
	file, ok := strings.CutPrefix(rest, "(file ")
	if !ok {
		return 0, "", false
	}
	file, ok = strings.CutSuffix(file, ")")
	if !ok || !isSegmentName(file) || file[:8] == "00000000" {
		return 0, "", false
	}
	return lsn, file, true
}

// parseTLI parses a timeline number (decimal, 1 or more).
func parseTLI(v string) (uint32, bool) {
	t, err := strconv.ParseUint(strings.TrimSpace(v), 10, 32)
	if err != nil || t == 0 {
		return 0, false
	}
	return uint32(t), true
}
