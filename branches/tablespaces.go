package branches

import (
	"context"
	"errors"
	"io/fs"
	"os"
	"path/filepath"

	"github.com/pgfork/pgfork/clone"
	"github.com/pgfork/pgfork/internal/errs"
	"github.com/pgfork/pgfork/pgclone"
)

// A snapshot of a source with tablespaces keeps them beside its data
// directory (pgclone: snap/NAME.tblspc/OID, its pg_tblspc links pointing
// there). A copy of the snapshot's data directory alone would link the
// branch to the snapshot's tablespaces: every branch of the snapshot, and
// the snapshot itself, would then write the same files (another token's
// branch seeing yours, a reset that does not go back). So each branch gets
// reflink copies of its own, in tblspc/BRANCH/OID, and its links are
// pointed there before its server starts.

// copyTablespaces gives branch b (its data directory data just copied
// from its snapshot, its server not started) copies of its snapshot's
// tablespaces and points its links at them; what an earlier copy (before
// a reset) left is replaced.
func (m *Manager) copyTablespaces(ctx context.Context, b *Branch, data string) error {
	src := pgclone.TablespaceDir(m.snapOfBranch(b))
	_ = removeBelow(filepath.Dir(m.tblspcOf(b)), b.Name)
	ents, err := os.ReadDir(src)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return errs.FromOS(err, src, "cannot read the snapshot's tablespaces")
	}
	if err := mkdirPrivate(m.tblspcOf(b)); err != nil {
		return err
	}
	dataDir := data
	root, err := os.OpenRoot(dataDir)
	if err != nil {
		return errs.FromOS(err, dataDir, "cannot open the branch's data directory")
	}
	defer root.Close()
	for _, e := range ents {
		if !e.IsDir() {
			continue
		}
		dst := filepath.Join(m.tblspcOf(b), e.Name())
		if _, err := clone.Copy(ctx, filepath.Join(src, e.Name()), dst, clone.Options{Sync: clone.SyncFS}); err != nil {
			return err
		}
		// Replaced through the data directory's root (no link followed):
		// the directory belongs to the server's OS user.
		link := "pg_tblspc/" + e.Name()
		fi, err := root.Lstat(link)
		if err != nil || fi.Mode()&fs.ModeSymlink == 0 {
			continue // the snapshot's data directory does not use it
		}
		tmp := link + ".pgfork-new"
		_ = root.Remove(tmp)
		if err := root.Symlink(dst, tmp); err != nil {
			return errs.FromOS(err, filepath.Join(dataDir, tmp), "cannot link the branch to its tablespace")
		}
		if m.o.User != nil {
			if err := root.Lchown(tmp, m.o.User.UID, m.o.User.GID); err != nil {
				return errs.FromOS(err, filepath.Join(dataDir, tmp), "cannot set the owner of the tablespace link")
			}
		}
		if err := root.Rename(tmp, link); err != nil {
			return errs.FromOS(err, filepath.Join(dataDir, link), "cannot link the branch to its tablespace")
		}
	}
	return nil
}
