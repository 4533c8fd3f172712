package pgclone_test

import (
	"context"
	"os"
	"path/filepath"
	"testing"

	"github.com/pgfork/pgfork/internal/testenv"
	"github.com/pgfork/pgfork/pgclone"
)

// TestOnlineCloneStagingPrivate (issue 19, F4b): as root, an online clone
// writes the WAL, backup_label and configuration into its staging
// directory after the data is copied. The clone's OS user (the hostile
// "postgres") then tries to swap the staging pg_wal for a symlink to a
// root-only directory: the staging directory is still root's and 0700, so
// the swap fails and nothing is written outside. Before, the copy had
// already given the staging directory to that user: root wrote a WAL
// segment and archive_status/ where the symlink pointed.
func TestOnlineCloneStagingPrivate(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: the attack is on root cloning for another user")
	}
	forEachPG(t, func(t *testing.T, e pgEnv) {
		base := testenv.Dir(t)
		src := e.newCluster(t, base, "src")
		e.start(t, src, nil)
		etc := filepath.Join(base, "etc-standin")
		if err := os.Mkdir(etc, 0o700); err != nil {
			t.Fatal(err)
		}
		swapped := false
		pgclone.SetTestHookBeforeWAL(func(staging string) {
			p := filepath.Join(staging, "pg_wal")
			cmd := e.User.Command(context.Background(), nil, "/bin/sh", "-c", "mv '"+p+"' '"+p+".away' && ln -s '"+etc+"' '"+p+"'")
			swapped = cmd.Run() == nil
		})
		defer pgclone.SetTestHookBeforeWAL(nil)
		dst := filepath.Join(base, "dst")
		if _, err := pgclone.Clone(context.Background(), pgclone.Options{Src: src, Dst: dst, Installation: e.Inst, User: e.User, Online: true, Port: 5442}); err != nil {
			t.Fatal(err)
		}
		if swapped {
			t.Error("the clone's user replaced pg_wal in the staging directory while root filled it")
		}
		if ents, _ := os.ReadDir(etc); len(ents) != 0 {
			t.Errorf("root wrote into the root-only directory: %v", ents)
		}
		fi, err := os.Stat(dst)
		if err != nil {
			t.Fatal(err)
		}
		if fi.Mode().Perm()&0o077 != 0 {
			t.Errorf("the clone's mode is %v", fi.Mode().Perm())
		}
	})
}
