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

// recovery is what a backup source's snapshots replay of its WAL archive.
func (s Source) recovery() *restore.Recovery {
	return &restore.Recovery{WALDir: s.WALDir, TargetTime: s.TargetTime, TargetLSN: s.TargetLSN, TargetName: s.TargetName}
}

// backupDirs are the backups a backup source restores, full first: its
// Backups, or its chain's up to Upto.
func (s Source) backupDirs() ([]string, error) {
	if len(s.Backups) > 0 {
		return s.Backups, nil
	}
	return pgbackup.Discover(s.Chain, s.Upto)
}

// restoreSource rebuilds a backup source's chain (up to s.Upto, or its
// Backups) into the data directory dst, left stopped. With a WAL archive
// (and a recovery target, or none: all the archive holds) it starts the
// result as a temporary server registered under a tempServerName (WAL
// replayed to the target, promoted; the next Open stops one a crash left
// running), then shuts it down cleanly: the snapshot is the database as
// it was at the target, and branches of it start at once. The PostgreSQL
// build is the one that runs the backups' major (installation).
func (m *Manager) restoreSource(ctx context.Context, s Source, dst string) error {
	rec := s.recovery()
	dirs, err := s.backupDirs()
	if err != nil {
		return err
	}
	ro := m.restoreOptions(dst)
	if !rec.Targeted() && rec.WALDir == "" {
		_, err := restore.Restore(ctx, dirs, dst, ro)
		return err
	}
	inst, err := m.installation(dirs[len(dirs)-1])
	if err != nil {
		return err
	}
	res, err := restore.Run(ctx, restore.RunOptions{Backups: dirs, Dst: dst, Start: true, Restore: ro,
		Layout: m.o.Layout, User: m.o.User, PGBin: inst.BinDir, Name: tempServerName(), Recovery: *rec})
	if err != nil {
		return err
	}
	if testHookRecovered != nil {
		testHookRecovered()
	}
	// A restore branch's data directory is kept by Down.
	return cluster.Down(ctx, m.o.Layout, res.Branch.Name, cluster.DownOptions{Timeout: time.Minute})
}
