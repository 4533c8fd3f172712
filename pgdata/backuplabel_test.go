package pgdata

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/pgfork/pgfork/internal/errs"
)

// fullLabel is the labelfile pg_backup_stop returns (PostgreSQL 15-18 write
// the same lines).
const fullLabel = `START WAL LOCATION: 0/5000028 (file 000000010000000000000005)
CHECKPOINT LOCATION: 0/5000060
BACKUP METHOD: streamed
BACKUP FROM: primary
START TIME: 2026-11-21 21:19:47 UTC
LABEL: pgfork clone to /x
START TIMELINE: 1
`

// incLabel is the backup_label pg_basebackup --incremental writes
// (PostgreSQL 17+), of a backup on timeline 2 taken from one on timeline 1.
const incLabel = `START WAL LOCATION: 0/9000028 (file 000000020000000000000009)
CHECKPOINT LOCATION: 0/9000080
BACKUP METHOD: streamed
BACKUP FROM: primary
START TIME: 2026-11-22 08:00:01 UTC
LABEL: pg_basebackup base backup
START TIMELINE: 2
INCREMENTAL FROM LSN: 0/5000028
INCREMENTAL FROM TLI: 1
`

func TestParseBackupLabelFull(t *testing.T) {
	l, err := ParseBackupLabel("", []byte(fullLabel))
	if err != nil {
		t.Fatal(err)
	}
	if l.StartLSN.String() != "0/5000028" || l.StartFile != "000000010000000000000005" || l.StartTLI != 1 ||
		l.Checkpoint.String() != "0/5000060" || l.Label != "pgfork clone to /x" || l.BackupMethod != "streamed" ||
		l.StartTime != "2026-11-21 21:19:47 UTC" || l.PrevLSN != 0 || l.PrevTLI != 0 || l.Incremental() || string(l.Raw) != fullLabel {
		t.Errorf("parsed %+v", l)
	}
	if got := string(l.CombinedLabel()); got != fullLabel {
		t.Errorf("combined label of a full backup changed: %q", got)
	}
}

func TestParseBackupLabelIncremental(t *testing.T) {
	l, err := ParseBackupLabel("/b/2/backup_label", []byte(incLabel))
	if err != nil {
		t.Fatal(err)
	}
	if !l.Incremental() || l.StartLSN.String() != "0/9000028" || l.StartTLI != 2 || l.PrevLSN.String() != "0/5000028" || l.PrevTLI != 1 ||
		l.Label != "pg_basebackup base backup" {
		t.Errorf("parsed %+v", l)
	}
	want := strings.Replace(incLabel, "INCREMENTAL FROM LSN: 0/5000028\nINCREMENTAL FROM TLI: 1\n", "", 1)
	if got := string(l.CombinedLabel()); got != want {
		t.Errorf("combined label %q, want %q", got, want)
	}
}

// TestParseBackupLabelTimelineFromFile: PostgreSQL 10 and older wrote no
// START TIMELINE line; the server then takes the timeline from the start
// WAL file name, and so does the parser.
func TestParseBackupLabelTimelineFromFile(t *testing.T) {
	old := strings.Replace(strings.Replace(fullLabel, "START TIMELINE: 1\n", "", 1), "(file 00000001", "(file 00000003", 1)
	l, err := ParseBackupLabel("", []byte(old))
	if err != nil || l.StartTLI != 3 {
		t.Errorf("label without START TIMELINE: %+v, %v; want timeline 3 from the file name", l, err)
	}
}

func TestParseBackupLabelBad(t *testing.T) {
	const path = "/b/1/backup_label"
	for _, c := range []struct{ label, names string }{
		{"", "START WAL LOCATION"},
		{"LABEL: x\nSTART TIMELINE: 1\n", "START WAL LOCATION"},
		{strings.Replace(fullLabel, "0/5000028", "zz", 1), "START WAL LOCATION"},
		{strings.Replace(fullLabel, "(file 000000010000000000000005)", "(file x)", 1), "START WAL LOCATION"},
		{strings.Replace(fullLabel, "(file 000000010000000000000005)", "file 000000010000000000000005", 1), "START WAL LOCATION"},
		{strings.Replace(fullLabel, "0/5000028 (file", "0/5000028 (fil", 1), "START WAL LOCATION"},
		{"START WAL LOCATION: 0/2000028\n", "START TIMELINE"},
		{strings.Replace(fullLabel, "START TIMELINE: 1", "START TIMELINE: one", 1), "START TIMELINE"},
		{strings.Replace(fullLabel, "START TIMELINE: 1", "START TIMELINE: 0", 1), "START TIMELINE"},
		{strings.Replace(fullLabel, "START TIMELINE: 1", "START TIMELINE: 2", 1), "START TIMELINE 2 does not match"},
		{strings.Replace(fullLabel, "CHECKPOINT LOCATION: 0/5000060", "CHECKPOINT LOCATION: 0/", 1), "CHECKPOINT LOCATION"},
		{fullLabel + "INCREMENTAL FROM LSN: 0/1000028\n", "no INCREMENTAL FROM TLI"},
		{fullLabel + "INCREMENTAL FROM TLI: 1\n", "no INCREMENTAL FROM LSN"},
		{strings.Replace(incLabel, "FROM LSN: 0/5000028", "FROM LSN: 5000028", 1), "INCREMENTAL FROM LSN"},
		{strings.Replace(incLabel, "FROM TLI: 1", "FROM TLI: -1", 1), "INCREMENTAL FROM TLI"},
	} {
		_, err := ParseBackupLabel(path, []byte(c.label))
		var e *errs.Error
		if err == nil || !errors.As(err, &e) || e.Kind != errs.Usage || e.Path != path || e.Hint == "" || !strings.Contains(err.Error(), c.names) {
			t.Errorf("label %q: error %v; want a Usage error naming %q with path and hint", c.label, err, c.names)
		}
	}
	// Without a path the error names no file.
	if _, err := ParseBackupLabel("", nil); err == nil || strings.HasPrefix(err.Error(), ":") || !strings.Contains(err.Error(), "START WAL LOCATION") {
		t.Errorf("no path: %v", err)
	}
}

// TestParseBackupLabelFromServer parses the labelfile real servers return
// from pg_backup_stop (what an online clone writes as backup_label). The
// backup_label of pg_basebackup --incremental is parsed from real chains by
// package restore's tests (through pgbackup.OpenChain).
func TestParseBackupLabelFromServer(t *testing.T) {
	for _, in := range builds(t) {
		t.Run(in.Version, func(t *testing.T) {
			srv := start(t, in, initdb(t, in, false))
			c := connect(t, srv)
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			defer cancel()
			var start, file, labelfile string
			if err := c.QueryRow(ctx, "SELECT pg_backup_start('pgfork label test', fast => true)::text").Scan(&start); err != nil {
				t.Fatal(err)
			}
			if err := c.QueryRow(ctx, "SELECT pg_walfile_name($1::pg_lsn)", start).Scan(&file); err != nil {
				t.Fatal(err)
			}
			if err := c.QueryRow(ctx, "SELECT labelfile FROM pg_backup_stop(wait_for_archive => false)").Scan(&labelfile); err != nil {
				t.Fatal(err)
			}
			l, err := ParseBackupLabel("", []byte(labelfile))
			if err != nil {
				t.Fatalf("%v\n%s", err, labelfile)
			}
			if l.StartLSN.String() != start || l.StartFile != file || l.StartTLI != 1 || l.Checkpoint == 0 || l.Checkpoint < l.StartLSN ||
				l.Label != "pgfork label test" || l.BackupMethod != "streamed" || l.StartTime == "" || l.Incremental() ||
				!strings.Contains(labelfile, "START TIMELINE: 1\n") {
				t.Errorf("parsed %+v from\n%s(start %s, file %s)", l, labelfile, start, file)
			}
		})
	}
}
