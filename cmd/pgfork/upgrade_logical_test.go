package main

import (
	"bytes"
	"strings"
	"testing"

	"github.com/pgfork/pgfork/upgrade/logical"
)

// TestUpgradeLogicalRefusesOtherPaths: --logical has a path of its own; the
// flags of the stop-and-upgrade path are refused with exit code 2, naming
// them, before anything is looked at.
func TestUpgradeLogicalRefusesOtherPaths(t *testing.T) {
	dir := t.TempDir()
	r := runInProcess(t, "upgrade", dir+"/old", dir+"/new", "--to", "18", "--logical", "--wait-analyze", "--mode", "link")
	if r.code != exitUsage || !strings.Contains(r.stderr, "--logical does not take") ||
		!strings.Contains(r.stderr, "--wait-analyze") || !strings.Contains(r.stderr, "--mode") {
		t.Errorf("exit %d, stderr %q: want exit %d naming --wait-analyze and --mode", r.code, r.stderr, exitUsage)
	}
	r = runInProcess(t, "upgrade", dir+"/old", dir+"/new", "--to", "18", "--rollback")
	if r.code != exitUsage || !strings.Contains(r.stderr, "go with --logical") {
		t.Errorf("exit %d, stderr %q: want exit %d for --rollback without --logical", r.code, r.stderr, exitUsage)
	}
	r = runInProcess(t, "upgrade", dir+"/old", dir+"/new", "--to", "18", "--logical", "--window", "0s")
	if r.code != exitUsage || !strings.Contains(r.stderr, "--window") {
		t.Errorf("exit %d, stderr %q: want exit %d for --window 0s", r.code, r.stderr, exitUsage)
	}
}

// TestLogicalSummarySaysWhatWasSubscribed: the human summary says how many
// databases got a subscription and why: the ones the WAL scan found
// written (some of them only in the window), or all of them without a scan.
func TestLogicalSummarySaysWhatWasSubscribed(t *testing.T) {
	dbs := []string{"postgres", "a", "b", "c"}
	for _, c := range []struct {
		r    logical.Result
		want string
	}{
		{logical.Result{Databases: dbs, WALScan: true, Subscribed: []string{"postgres"}}, "subscribed: 1 of 4 databases, the ones the WAL since R shows written\n"},
		{logical.Result{Databases: dbs, WALScan: true, Subscribed: []string{"postgres", "b"}, SubscribedInWindow: []string{"b"}}, "subscribed: 2 of 4 databases, the ones the WAL since R shows written (1 of them found in the window)"},
		{logical.Result{Databases: dbs, Subscribed: dbs}, "subscribed: all 4 databases (the WAL since R was not scanned"},
	} {
		var b bytes.Buffer
		printLogicalSummary(&b, &c.r)
		if !strings.Contains(b.String(), c.want) {
			t.Errorf("summary:\n%s\nwant %q in it", b.String(), c.want)
		}
	}
}
