package restore

import (
	"context"
	"crypto/sha256"
	"fmt"
	"os"
	"path/filepath"
	"strings"
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
		// Archiving is on for the source, and also in its
		// postgresql.auto.conf, so the backups carry it: the branch must
		// not archive into the source's archive all the same (F21).
		_, in := e.newCluster(t, base, "src", map[string]string{"archive_mode": "on", "archive_command": "cp %p " + arch + "/%f"})
		url := in.ConnString("", "")
		pgtest.Exec(t, url, "ALTER SYSTEM SET archive_mode = on", "ALTER SYSTEM SET archive_command = 'cp %p "+arch+"/%f'")
		pgtest.Exec(t, url, "CREATE TABLE t(x int)")
		b0, b1 := filepath.Join(base, "b0"), filepath.Join(base, "b1")
		e.basebackup(t, in, b0, "")
		pgtest.Exec(t, url, "INSERT INTO t SELECT generate_series(1, 100)")
		e.basebackup(t, in, b1, b0)
		pgtest.Exec(t, url, "INSERT INTO t SELECT generate_series(101, 200)", "SELECT pg_create_restore_point('before\\tbad''change\\')",
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
			// A restore point named with a backslash and a quote (F8): its
			// name must reach postgresql.auto.conf quoted as ALTER SYSTEM does.
			Recovery: Recovery{WALDir: arch, TargetName: `before\tbad'change\`}, Source: b0 + " " + b1})
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
		// F21: the branch does not archive, whatever its settings say, and
		// the source's archive is untouched by the branch's WAL.
		before := dirDigest(t, arch)
		if got := pgtest.Query(t, st.URL, "SHOW archive_mode"); got != "off" {
			t.Errorf("the branch runs with archive_mode = %s, want off", got)
		}
		pgtest.Exec(t, st.URL, "INSERT INTO t SELECT generate_series(1, 1000)", "SELECT pg_switch_wal()", "CHECKPOINT",
			"INSERT INTO t SELECT generate_series(1, 1000)", "SELECT pg_switch_wal()")
		time.Sleep(2 * time.Second)
		if after := dirDigest(t, arch); after != before {
			t.Errorf("the branch wrote into its source's WAL archive:\nbefore %s\nafter  %s", before, after)
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
		// F9: a branch of a backup is the user's restore: down keeps it, as
		// restore --start and restore --help say.
		if _, err := os.Stat(filepath.Join(dst, "PG_VERSION")); err != nil {
			t.Errorf("down removed the restored data directory %s (%v); it must be kept unless asked", dst, err)
		}
		if list, _ := cluster.List(lay); len(list) != 0 {
			t.Errorf("registry still lists %+v", list)
		}
	})
}

// dirDigest is the names, sizes and SHA-256 of the files in dir.
func dirDigest(t *testing.T, dir string) string {
	t.Helper()
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var b strings.Builder
	for _, e := range ents {
		data, err := os.ReadFile(filepath.Join(dir, e.Name()))
		if err != nil {
			continue // archive_status and the like
		}
		fmt.Fprintf(&b, "%s:%d:%x ", e.Name(), len(data), sha256.Sum256(data))
	}
	return b.String()
}
