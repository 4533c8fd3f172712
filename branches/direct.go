package branches

import (
	"context"
	"path/filepath"
	"strings"
	"time"

	"github.com/pgfork/pgfork/clone"
	"github.com/pgfork/pgfork/internal/errs"
	"github.com/pgfork/pgfork/pgbackup"
	"github.com/pgfork/pgfork/restore"
)

// A branch of a backup source that needs no recovery (no WAL archive, no
// recovery target) keeps no copy of the restored backups as its snapshot:
// the backups themselves are its reset point (Snapshot.Backups). Its data
// directory is restored from them directly, and restored again at each
// reset. On a filesystem that clones, the restored files of an
// incremental chain are made of one extent per run of changed blocks
// (53,740 for a pgbench scale 100 chain of 20% changes), and a reflink copy
// of them costs as much as restoring them (0.8-1.0 s against 1.2 s): a
// snapshot directory made the first query of restore --start wait for
// both, for a reset no faster. The backups must stay as they were: a
// reset proves each one's backup_manifest is the one recorded (its own
// SHA-256) before the branch's server is stopped, and refuses otherwise.
// A branch needing recovery, or a source shared by several creates
// (Options.SourceMaxAge), keeps its snapshot directory: its recovery, or
// its sharing, is what the snapshot saves.

// BackupRef is one backup a snapshot restores instead of holding a copy
// (Snapshot.Backups): its directory and its manifest's checksum when the
// snapshot was recorded.
type BackupRef struct {
	Dir              string `json:"dir"`
	ManifestChecksum string `json:"manifest_checksum"`
}

// directOrigin decides, for branch b reserved from source (its origin
// snapshot not shared), whether it is restored straight from the source's
// backups; if so it records b's origin snapshot as those backups, says
// whether the restore crosses filesystems, and reports true.
func (m *Manager) directOrigin(ctx context.Context, b *Branch, source string) (bool, error) {
	s, ok := m.source(source)
	if !ok || s.Kind != SourceBackup || s.WALDir != "" || s.recovery().Targeted() {
		return false, nil
	}
	dirs, err := s.backupDirs()
	if err != nil {
		return false, err
	}
	chain, err := pgbackup.OpenChain(dirs)
	if err != nil {
		return false, err
	}
	for p := range chain.Newest().Manifest.Files {
		if strings.HasPrefix(p, "pg_tblspc/") {
			return false, nil // tablespaces: the snapshot's copy says what it needs
		}
	}
	refs := make([]BackupRef, len(chain))
	for i, x := range chain {
		refs[i] = BackupRef{Dir: x.Dir, ManifestChecksum: x.Manifest.Checksum}
	}
	m.mu.Lock()
	delete(m.pending, b.Snapshot)
	m.st.Snapshots = append(m.st.Snapshots, &Snapshot{Name: b.Snapshot, From: "source:" + source, Owner: b.Owner,
		Created: time.Now().UTC(), Origin: true, Home: b.Home, Backups: refs})
	err = m.save()
	noStore := b.noStore
	m.mu.Unlock()
	if err != nil {
		return false, err
	}
	m.noticeCrossing(ctx, s, m.workDir(b), b.DataDir, noStore)
	return true, nil
}

// backupsOf is what branch b's snapshot restores (nil: a snapshot
// directory, copied). Under the lock.
func (m *Manager) backupsOf(b *Branch) []BackupRef {
	if s := m.snapshot(b.Snapshot); s != nil {
		return s.Backups
	}
	return nil
}

// checkBackups proves the backups of refs unchanged since they were
// recorded for branch name and returns their directories, full first.
func checkBackups(name string, refs []BackupRef) ([]string, error) {
	dirs := make([]string, len(refs))
	for i, r := range refs {
		dirs[i] = r.Dir
	}
	const hint = "a branch of backups goes back to them as they were when it was made: make a new branch of the backups as they are now (pgfork branch rm, then create it again)"
	chain, err := pgbackup.OpenChain(dirs)
	if err != nil {
		return nil, errs.Wrap(errs.NotFound, err, "branch %q cannot be reset: the backups it was made from cannot be read", name).WithHint(hint)
	}
	for i, x := range chain {
		if x.Manifest.Checksum != refs[i].ManifestChecksum {
			return nil, errs.New(errs.NotFound, "branch %q cannot be reset: backup %s changed since the branch was made from it (its backup_manifest is another)", name, x.Dir).
				WithPath(x.Dir).WithHint(hint)
		}
	}
	return dirs, nil
}

// fill makes work, a new data directory for branch b: a copy of its
// snapshot directory, or its backups restored again once proven
// unchanged.
func (m *Manager) fill(ctx context.Context, b *Branch, work string) error {
	m.mu.Lock()
	refs := m.backupsOf(b)
	m.mu.Unlock()
	if len(refs) == 0 {
		_, err := clone.Copy(ctx, m.snapOfBranch(b), work, clone.Options{Sync: clone.SyncFS})
		return err
	}
	dirs, err := checkBackups(b.Name, refs)
	if err != nil {
		return err
	}
	_, err = restore.Restore(ctx, dirs, work, m.restoreOptions(work))
	return err
}

// restoreOptions are how a backup source is restored into dst for a
// branch: owned by the servers' user, made durable by one syncfs on a
// filesystem that clones rather than an fsync of each file (about 1,000
// for a pgbench cluster): the same filesystem's syncfs follows anyway
// when a snapshot is copied, and a branch's server syncs its data
// directory by syncfs before recovery there (startSettings).
func (m *Manager) restoreOptions(dst string) restore.Options {
	ro := restore.Options{Owner: m.o.User.Owner()}
	if fs, err := clone.FSType(filepath.Dir(dst)); err == nil && clone.MayClone(fs) {
		ro.Sync = clone.SyncFS
	}
	return ro
}
