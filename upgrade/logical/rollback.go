package logical

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/pgfork/pgfork/instance"
	"github.com/pgfork/pgfork/internal/errs"
	"github.com/pgfork/pgfork/pgdata"
)

// RollbackResult says what Rollback did.
type RollbackResult struct {
	OldDir string   `json:"old_dir"`
	NewDir string   `json:"new_dir"`
	Port   int      `json:"port"`
	Did    []string `json:"did"`
}

// Rollback goes back to the old cluster after a finished logical upgrade
// (o.OldDir, o.NewDir, o.Old, o.New, o.User, o.Superuser are used): it
// stops the new cluster, starts the old one again where the hand-over
// stopped it (its own configuration and the command line it ran with, so
// at its address), and gives writes back to it. Writes made on the new
// cluster since the cutover are not carried back. NEW_DATADIR is kept.
func Rollback(ctx context.Context, o Options) (*RollbackResult, error) {
	for _, p := range []*string{&o.OldDir, &o.NewDir} {
		a, err := filepath.Abs(*p)
		if err != nil || *p == "" {
			return nil, errs.New(errs.Usage, "a data directory is missing or bad: %q", *p)
		}
		*p = a
	}
	res := &RollbackResult{OldDir: o.OldDir, NewDir: o.NewDir}
	if _, err := os.Stat(statePath(o.NewDir)); err == nil {
		return nil, errs.New(errs.Busy, "an upgrade of this cluster did not finish (its state file %s is there)", statePath(o.NewDir)).
			WithHint("run the upgrade again: it cleans up after a killed run and gives writes back to the old cluster")
	}
	if _, running, _ := pgdata.Running(o.NewDir); running {
		inst, err := instance.Attach(o.NewDir)
		if err != nil {
			return nil, errs.Wrap(errs.Busy, err, "a server runs on the new data directory, but cannot be proven to be its postmaster").WithPath(o.NewDir)
		}
		if err := inst.Stop(ctx, instance.Fast); err != nil {
			return nil, errs.Wrap(errs.Busy, err, "cannot stop the new cluster").WithPath(o.NewDir)
		}
		res.Did = append(res.Did, "stopped the new cluster")
	}
	r := &run{o: o, res: &Result{}}
	if _, running, _ := pgdata.Running(o.OldDir); !running {
		b, err := os.ReadFile(filepath.Join(o.OldDir, "postmaster.opts"))
		if err != nil {
			return nil, errs.FromOS(err, o.OldDir, "cannot read how the old cluster ran (postmaster.opts)")
		}
		if _, opts, ok := strings.Cut(strings.TrimSpace(string(b)), ` "`); ok {
			r.oldOpts = `"` + opts
		}
		sctx, cancel := context.WithTimeout(ctx, 5*time.Minute)
		err = pgCtlStart(sctx, o.Old, o.User, o.OldDir, r.oldOpts)
		cancel()
		if err != nil {
			return nil, errs.Wrap(errs.Internal, err, "cannot start the old cluster again").WithPath(o.OldDir).
				WithHint("its log: %s", filepath.Join(o.OldDir, instance.LogFileName))
		}
		res.Did = append(res.Did, "started the old cluster as it ran")
	}
	if err := r.connectOld(ctx); err != nil {
		return nil, err
	}
	defer r.closeAll()
	res.Port = r.oldPort
	for _, q := range []string{"ALTER SYSTEM RESET default_transaction_read_only", "SELECT pg_reload_conf()"} {
		if _, err := r.control.Exec(ctx, q); err != nil {
			return nil, errs.Wrap(errs.Internal, err, "cannot give writes back to the old cluster")
		}
	}
	res.Did = append(res.Did, fmt.Sprintf("gave writes back to the old cluster (port %d); writes made on the new cluster since the cutover are not on it, and %s is kept", r.oldPort, o.NewDir))
	return res, nil
}
