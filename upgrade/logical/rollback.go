package logical

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/pgfork/pgfork/instance"
	"github.com/pgfork/pgfork/internal/errs"
	"github.com/pgfork/pgfork/internal/proc"
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
	r := &run{o: o, res: &Result{}}
	// A run whose hand-over was done but that was killed before its
	// clean-up ended leaves the old side's slots and publications (and the
	// new side's disabled subscriptions): the rollback drops them. Any
	// other state file is a run that did not finish.
	var carried *state
	if b, err := readOwnState(statePath(o.NewDir)); err == nil {
		var st state
		if err := json.Unmarshal(b, &st); err != nil || !st.OldCarries || st.OldDir != o.OldDir {
			return nil, errs.New(errs.Busy, "an upgrade of this cluster did not finish (its state file %s is there)", statePath(o.NewDir)).
				WithHint("run the upgrade again: it cleans up after a killed run and gives writes back to the old cluster")
		}
		if proc.Alive(st.Pid) && proc.StartTime(st.Pid) == st.PidStart {
			return nil, errs.New(errs.Busy, "the upgrade of this cluster still runs (pid %d)", st.Pid).WithHint("wait for it to end")
		}
		carried = &st
		r.appHost, r.appPort = st.OldHost, st.OldPort
		for name, slot := range st.Databases {
			r.dbs = append(r.dbs, &database{name: name, slot: slot, pub: true, slotMade: true})
		}
	} else if !errors.Is(err, os.ErrNotExist) {
		return nil, err
	}
	if _, running, _ := pgdata.Running(o.NewDir); running {
		if carried != nil {
			if err := r.markSubscriptions(ctx); err == nil {
				if left := r.dropSubscriptions(ctx); left == "" {
					res.Did = append(res.Did, "dropped the run's subscriptions on the new cluster")
				}
			}
		}
		inst, err := instance.Attach(o.NewDir)
		if err != nil {
			return nil, errs.Wrap(errs.Busy, err, "a server runs on the new data directory, but cannot be proven to be its postmaster").WithPath(o.NewDir)
		}
		if err := inst.Stop(ctx, instance.Fast); err != nil {
			return nil, errs.Wrap(errs.Busy, err, "cannot stop the new cluster").WithPath(o.NewDir)
		}
		res.Did = append(res.Did, "stopped the new cluster")
	}
	if _, running, _ := pgdata.Running(o.OldDir); !running {
		b, err := os.ReadFile(filepath.Join(o.OldDir, "postmaster.opts"))
		if err != nil {
			return nil, errs.FromOS(err, o.OldDir, "cannot read how the old cluster ran (postmaster.opts)")
		}
		if _, opts, ok := strings.Cut(strings.TrimSpace(string(b)), ` "`); ok {
			r.oldOpts = `"` + opts
		}
		// Its log goes to NEW_DATADIR, which the rollback keeps (the old
		// data directory is the user's), or, where that is gone, to a
		// directory of its own.
		log := r.oldLog()
		if fi, err := os.Stat(o.NewDir); err != nil || !fi.IsDir() {
			dir, err := os.MkdirTemp("", "pgfork-rollback-")
			if err == nil {
				err = o.User.MkdirOwned(dir, 0o700)
			}
			if err != nil {
				return nil, errs.Wrap(errs.Internal, err, "cannot create a directory for the old cluster's log")
			}
			log = filepath.Join(dir, oldLogName)
		}
		sctx, cancel := context.WithTimeout(ctx, 5*time.Minute)
		err = pgCtlStart(sctx, o.Old, o.User, o.OldDir, r.oldOpts, log)
		cancel()
		if err != nil {
			return nil, errs.Wrap(errs.Internal, err, "cannot start the old cluster again").WithPath(o.OldDir).
				WithHint("its log: %s", log)
		}
		res.Did = append(res.Did, fmt.Sprintf("started the old cluster as it ran (its log: %s)", log))
	}
	if err := r.connectOld(ctx); err != nil {
		return nil, err
	}
	defer r.closeAll()
	res.Port = r.oldPort
	if carried != nil {
		// Still read-only (default_transaction_read_only in its
		// postgresql.auto.conf): the slots and publications go first.
		if left := r.dropOnOld(ctx); left != "" {
			return nil, errs.New(errs.Busy, "the old cluster runs again at its address, read-only, but%s", left).
				WithHint("drop them by hand, then ALTER SYSTEM RESET default_transaction_read_only; SELECT pg_reload_conf(); and remove %s", statePath(o.NewDir))
		}
		res.Did = append(res.Did, fmt.Sprintf("dropped the run's slots and publications on the old cluster (%d databases)", len(carried.Databases)))
	}
	for _, q := range []string{"ALTER SYSTEM RESET default_transaction_read_only", "SELECT pg_reload_conf()"} {
		if _, err := r.control.Exec(ctx, q); err != nil {
			return nil, errs.Wrap(errs.Internal, err, "cannot give writes back to the old cluster")
		}
	}
	if carried != nil {
		_ = os.Remove(statePath(o.NewDir))
	}
	res.Did = append(res.Did, fmt.Sprintf("gave writes back to the old cluster (port %d); writes made on the new cluster since the cutover are not on it, and %s is kept", r.oldPort, o.NewDir))
	return res, nil
}
