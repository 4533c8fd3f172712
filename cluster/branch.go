package cluster

import (
	"context"
	"os"
	"path/filepath"

	"github.com/pgfork/pgfork/internal/errs"
	"github.com/pgfork/pgfork/internal/statedir"
)

// CreateBranch claims name for a branch: a cluster whose data directory
// was made elsewhere (dataDir, e.g. by `pgfork restore`) and stays there.
// The registry's data entry is a symlink to it, so List, Reap and Down
// find its server like any other; Down stops the server and removes the
// record and socket directory but not dataDir, which the user named.
func CreateBranch(ctx context.Context, lay statedir.Layout, name, dataDir string) (*Pending, error) {
	abs, err := filepath.Abs(dataDir)
	if err != nil {
		return nil, errs.Wrap(errs.Usage, err, "bad data directory path").WithPath(dataDir)
	}
	p, err := Create(ctx, lay, name)
	if err != nil {
		return nil, err
	}
	if err := os.Symlink(abs, p.DataDir()); err != nil {
		p.lock.Unlock()
		_ = os.RemoveAll(p.Dir)
		return nil, errs.Wrap(errs.Permission, err, "cannot record the branch").WithPath(p.Dir)
	}
	return p, nil
}
