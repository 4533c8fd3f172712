package main

import (
	"runtime"
	"strconv"
	"testing"
)

// TestUpgradeJobsDefault: pgfork upgrade runs twice as many pg_upgrade
// jobs as there are cores unless -j says otherwise (issue 25: more jobs
// than cores beat jobs = cores with many databases; docs/upgrade.md).
func TestUpgradeJobsDefault(t *testing.T) {
	c, _, err := newRootCmd(streams{}).Find([]string{"upgrade"})
	if err != nil {
		t.Fatal(err)
	}
	f := c.Flags().Lookup("jobs")
	if f == nil {
		t.Fatal("pgfork upgrade has no --jobs")
	}
	if want := strconv.Itoa(2 * runtime.NumCPU()); f.DefValue != want {
		t.Errorf("--jobs defaults to %s, want %s (twice the cores)", f.DefValue, want)
	}
}
