package restore

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/pgfork/pgfork/clone"
	"github.com/pgfork/pgfork/cluster"
	"github.com/pgfork/pgfork/internal/pgtest"
	"github.com/pgfork/pgfork/internal/statedir"
	"github.com/pgfork/pgfork/internal/testenv"
)

// TestRestorePITRToRestorePoint restores a chain, starts it with a WAL
// archive and a named restore point as target, and checks that exactly
// the rows committed before the restore point are there; the branch is
// in the cluster registry while it runs and Down stops it and removes its
// socket directory.
func TestRestorePITRToRestorePoint(t *testing.T) {
	forEachPG(t, func(t *testing.T, e pgEnv) {
		base := testenv.XFSDir(t)
		arch := filepath.Join(base, "archive")
		if err := e.User.MkdirOwned(arch, 0o755); err != nil {
			t.Fatal(err)
		}
		_, in := e.newCluster(t, base, "src", map[string]string{"archive_mode": "on", "archive_command": "cp %p " + arch + "/%f"})
		url := in.ConnString("", "")
		pgtest.Exec(t, url, "CREATE TABLE t(x int)")
		b0, b1 := filepath.Join(base, "b0"), filepath.Join(base, "b1")
		e.basebackup(t, in, b0, "")
		pgtest.Exec(t, url, "INSERT INTO t SELECT generate_series(1, 100)")
		e.basebackup(t, in, b1, b0)
		pgtest.Exec(t, url, "INSERT INTO t SELECT generate_series(101, 200)", "SELECT pg_create_restore_point('before_bad_change')",
			"INSERT INTO t SELECT generate_series(201, 300)", "DELETE FROM t WHERE x <= 50")
		seg := pgtest.Query(t, url, "SELECT pg_walfile_name(pg_switch_wal())")
		deadline := time.Now().Add(2 * time.Minute)
		for pgtest.Query(t, url, "SELECT coalesce(last_archived_wal, '') FROM pg_stat_archiver") < seg {
			if time.Now().After(deadline) {
				t.Fatalf("WAL segment %s was not archived", seg)
			}
			time.Sleep(100 * time.Millisecond)
		}
		pgtest.Stop(t, in)

		dst := filepath.Join(base, "branch")
		if _, err := Restore(context.Background(), []string{b0, b1}, dst, Options{Sync: clone.SyncNone, Owner: e.owner()}); err != nil {
			t.Fatal(err)
		}
		lay := statedir.Layout{Root: filepath.Join(testenv.Dir(t), "state")}
		st, err := Start(context.Background(), dst, StartOptions{Layout: lay, Installation: e.Inst, User: e.User,
			Recovery: Recovery{WALDir: arch, TargetName: "before_bad_change"}, Source: b0 + " " + b1})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			_ = cluster.Down(context.Background(), lay, st.Name, cluster.DownOptions{Timeout: time.Second})
		})
		if got := pgtest.Query(t, st.URL, "SELECT count(*)::text || ' ' || min(x) || '-' || max(x) FROM t"); got != "200 1-200" {
			t.Errorf("after recovery to the restore point t has %q, want \"200 1-200\"", got)
		}
		if got := pgtest.Query(t, st.URL, "SELECT pg_is_in_recovery()::text"); got != "false" {
			t.Errorf("the branch is still in recovery")
		}
		list, err := cluster.List(lay)
		if err != nil {
			t.Fatal(err)
		}
		if len(list) != 1 || list[0].Name != "branch" || list[0].State != cluster.Running || list[0].Kind != "restore" || list[0].DataDir != dst {
			t.Fatalf("registry lists %+v, want the running branch", list)
		}
		if err := cluster.Down(context.Background(), lay, st.Name, cluster.DownOptions{Timeout: 30 * time.Second}); err != nil {
			t.Fatal(err)
		}
		if _, err := os.Stat(st.SocketDir); err == nil {
			t.Errorf("socket directory %s left behind", st.SocketDir)
		}
		if _, err := os.Stat(filepath.Join(dst, "postmaster.pid")); err == nil {
			t.Errorf("the branch still runs after down")
		}
		if _, err := os.Stat(dst); !os.IsNotExist(err) {
			t.Errorf("down left the branch's data directory %s (%v)", dst, err)
		}
		if list, _ := cluster.List(lay); len(list) != 0 {
			t.Errorf("registry still lists %+v", list)
		}
	})
}
