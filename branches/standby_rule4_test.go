package branches

import (
	"context"
	"os"
	"path/filepath"
	"syscall"
	"testing"

	"github.com/pgfork/pgfork/internal/pgtest"
	"github.com/pgfork/pgfork/internal/testenv"
)

// TestStandbyRunsNoPrimaryCommand (issue 57, rule 4, G12): the primary's
// administrator sets archive_cleanup_command, recovery_end_command and
// restore_command by ALTER SYSTEM before the standby source is made
// (pg_basebackup copies postgresql.auto.conf). The standby on the branch
// host runs with all three empty, and its restartpoint (a checkpoint of
// the primary replayed, then CHECKPOINT on the standby, where
// archive_cleanup_command runs) and a branch of it run none. Before, the
// standby kept them: archive_cleanup_command ran as the run-as user at the
// standby's first restartpoint.
func TestStandbyRunsNoPrimaryCommand(t *testing.T) {
	t.Parallel() // see env
	ctx := context.Background()
	b := pgtest.Builds(t, 0)[0]
	dir := testenv.XFSDir(t)
	marks := filepath.Join(dir, "marks")
	if err := os.Mkdir(marks, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Chmod(marks, 0o1777); err != nil {
		t.Fatal(err)
	}
	p := startPrimary(t, b, dir, false, false)
	for _, s := range []string{"archive_cleanup_command", "recovery_end_command", "restore_command"} {
		pgtest.Exec(t, p.super, "ALTER SYSTEM SET "+s+" = 'touch "+filepath.Join(marks, s)+"'")
	}
	m, o := standbyManager(t, b, dir, p)
	sby := standbyURL(t, o)
	got := pgtest.Query(t, sby, "SELECT current_setting('archive_cleanup_command') || '|' || current_setting('recovery_end_command') || '|' || current_setting('restore_command')")
	if got != "||" {
		t.Errorf("the standby's archive_cleanup_command|recovery_end_command|restore_command: %q, want all empty", got)
	}
	// A restartpoint: the primary's checkpoint replayed, then one on the
	// standby.
	pgtest.Exec(t, p.super, "CHECKPOINT")
	lsn := pgtest.Query(t, p.super, "SELECT pg_current_wal_lsn()")
	testenv.WaitFor(t, "the standby to replay the primary's checkpoint", func() bool {
		return pgtest.Query(t, sby, "SELECT (pg_last_wal_replay_lsn() >= '"+lsn+"')::text") == "true"
	})
	pgtest.Exec(t, sby, "CHECKPOINT")
	br, err := m.Create(ctx, Caller{Token: "alice"}, CreateOptions{Name: "b1", Source: "replica"})
	if err != nil {
		t.Fatal(err)
	}
	if err := m.Delete(ctx, Caller{Token: "alice"}, br.Name); err != nil {
		t.Error(err)
	}
	ents, _ := os.ReadDir(marks)
	for _, e := range ents {
		t.Errorf("the primary's %s ran on the branch host", e.Name())
	}
}
