package branches

import (
	"context"
	"time"

	"github.com/pgfork/pgfork/cluster"
	"github.com/pgfork/pgfork/pgbackup"
	"github.com/pgfork/pgfork/restore"
)

// testHookRecovered, when set (tests only), runs once a point-in-time
// snapshot's recovery server is up, before it is stopped.
var testHookRecovered func()

// restoreSource rebuilds a backup source's chain (up to s.Upto) into the
// data directory dst, left stopped. With a recovery target it starts the
// result as a temporary server registered under a tempServerName (WAL
// replayed to the target, promoted; the next Open stops one a crash left
// running), then shuts it down cleanly: the snapshot is the database as
// it was at the target, and branches of it start at once. The PostgreSQL
// build is the Manager's, or else one of the backups' major.
func (m *Manager) restoreSource(ctx context.Context, s Source, dst string) error {
	rec := restore.Recovery{WALDir: s.WALDir, TargetTime: s.TargetTime, TargetLSN: s.TargetLSN, TargetName: s.TargetName}
	if !rec.Targeted() {
		dirs, err := pgbackup.Discover(s.Chain, s.Upto)
		if err != nil {
			return err
		}
		_, err = restore.Restore(ctx, dirs, dst, restore.Options{Owner: m.o.User.Owner()})
		return err
	}
	res, err := restore.Run(ctx, restore.RunOptions{Backups: []string{s.Chain}, Upto: s.Upto, Dst: dst, Start: true,
		Layout: m.o.Layout, User: m.o.User, PGBin: m.o.Installation.BinDir, Name: tempServerName(), Recovery: rec})
	if err != nil {
		return err
	}
	if testHookRecovered != nil {
		testHookRecovered()
	}
	// A restore branch's data directory is kept by Down.
	return cluster.Down(ctx, m.o.Layout, res.Branch.Name, cluster.DownOptions{Timeout: time.Minute})
}
