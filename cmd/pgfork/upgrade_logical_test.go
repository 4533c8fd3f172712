package main

import (
	"strings"
	"testing"
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
