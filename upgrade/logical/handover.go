package logical

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgfork/pgfork/instance"
	"github.com/pgfork/pgfork/internal/errs"
	"github.com/pgfork/pgfork/upgrade"
)

// readHandOver reads, while the old cluster serves and before anything is
// created, what the hand-over carries (upgrade.ReadHandOver: it refuses an
// unreadable configuration or local trust on an open socket) and the
// command line it runs with, to start it again if the new cluster does
// not start.
func (r *run) readHandOver(ctx context.Context) error {
	o := r.o
	h, err := upgrade.ReadHandOver(ctx, upgrade.Options{OldDir: o.OldDir, NewDir: o.NewDir, Old: o.Old, New: o.New,
		User: o.User, Superuser: r.su})
	if err != nil {
		return err
	}
	r.ho = h
	if b, err := os.ReadFile(filepath.Join(o.OldDir, "postmaster.opts")); err == nil {
		// As pg_ctl restart does: the options follow the program's path,
		// each in double quotes.
		if _, opts, ok := strings.Cut(strings.TrimSpace(string(b)), ` "`); ok {
			r.oldOpts = `"` + opts
		}
	}
	return nil
}

// carry writes the old cluster's address and authentication into the new
// one's postgresql.auto.conf (effective at its next start).
func (r *run) carry(ctx context.Context) error {
	conn, err := pgx.Connect(ctx, r.newInst.ConnString(r.su, "template1"))
	if err != nil {
		return errs.Wrap(errs.Internal, err, "cannot connect to the new cluster")
	}
	defer conn.Close(context.WithoutCancel(ctx))
	did, err := r.ho.Carry(ctx, conn)
	if err != nil {
		return err
	}
	r.res.Notes = append(r.res.Notes, "carried from the old cluster: "+strings.Join(did, "; "))
	return nil
}

// pgCtlStart starts the cluster in dir with pg_ctl and its own
// configuration, in a process group of its own (the terminal's Ctrl-C
// reaches pgfork alone).
func pgCtlStart(ctx context.Context, bin upgrade.Install, u *instance.OSUser, dir, opts string) error {
	args := []string{"start", "-D", dir, "-w", "-t", "300", "-l", filepath.Join(dir, instance.LogFileName)}
	if opts != "" {
		args = append(args, "-o", opts)
	}
	cmd := u.Command(ctx, bin.Env, filepath.Join(bin.BinDir, "pg_ctl"), args...)
	if cmd.SysProcAttr == nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{}
	}
	cmd.SysProcAttr.Setpgid = true
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("pg_ctl start: %v: %s", err, strings.TrimSpace(string(out)))
	}
	return nil
}

// stopOld stops the old cluster (fast) and returns once it has released
// its data directory and sockets: its postmaster.pid and socket lock files
// are gone. That comes before Stop sees the process gone where its exit is
// reaped late (the old server's parent is an init that reaps it after a
// second or so, seen in containers), and it is all the new server needs.
func (r *run) stopOld(ctx context.Context, old *instance.Instance) error {
	stopped := make(chan error, 1)
	go func() { stopped <- old.Stop(ctx, instance.Fast) }()
	lock := filepath.Join(r.oldHost, fmt.Sprintf(".s.PGSQL.%d.lock", r.oldPort))
	released := func() bool {
		for _, p := range []string{filepath.Join(r.o.OldDir, "postmaster.pid"), lock} {
			if _, err := os.Lstat(p); err == nil {
				return false
			}
		}
		return true
	}
	tick := time.NewTicker(2 * time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case err := <-stopped:
			return err
		case <-tick.C:
			if released() {
				return nil
			}
		}
	}
}

// startNew starts the new cluster with pg_ctl and its own configuration,
// and returns as soon as its postmaster.pid says it is ready: pg_ctl -w
// looks only every 100 ms. An error is pg_ctl's (the server did not start).
func (r *run) startNew(ctx context.Context) error {
	pctx, cancel := context.WithTimeout(ctx, 5*time.Minute)
	done := make(chan error, 1)
	go func() {
		defer cancel()
		done <- pgCtlStart(pctx, r.o.New, r.o.User, r.o.NewDir, "")
	}()
	tick := time.NewTicker(2 * time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case err := <-done:
			return err
		case <-tick.C:
			if pf, err := instance.ReadPidFile(r.o.NewDir); err == nil && pf.Status == "ready" {
				return nil
			}
		}
	}
}

// handOver, at the end of the window: replication stopped (every
// subscription disabled, the old side's slots and publications dropped),
// the old cluster stopped (fast), the new one started with its own
// configuration at the old one's address. The disabled subscriptions are
// dropped after the window (dropSubscriptions), once the new cluster
// serves: their DROP waits for each apply worker to exit, which the
// window need not wait for. If the new cluster does not start, the old
// one is started again as it ran (the caller then gives writes back).
func (r *run) handOver(ctx context.Context, step func(string)) error {
	o := r.o
	ctx = context.WithoutCancel(ctx) // past here, a half-done hand-over is worse than a late one
	if err := r.each(ctx, windowJobs, func(ctx context.Context, d *database) error {
		if !d.sub {
			return nil
		}
		if _, err := d.new.Exec(ctx, "ALTER SUBSCRIPTION "+pgx.Identifier{subName}.Sanitize()+" DISABLE"); err != nil {
			return errs.Wrap(errs.Internal, err, "cannot disable the subscription of database %q of the new cluster", d.name)
		}
		return nil
	}); err != nil {
		return err
	}
	step("subscriptions disabled")
	if left := r.dropOldReplication(ctx); left != "" {
		r.res.Notes = append(r.res.Notes, "left behind"+left)
	}
	step("old slots and publications dropped")
	// The disabled subscriptions' origins go now, in one statement (the
	// catalog is shared; each drop waits for its apply worker to exit):
	// the new cluster's own configuration allows only a few active origins
	// (max_active_replication_origins on 18, max_replication_slots before)
	// and would not start with hundreds. DROP SUBSCRIPTION later skips a
	// missing origin.
	if len(r.dbs) > 0 && r.dbs[0].new != nil {
		if _, err := r.dbs[0].new.Exec(ctx, `SELECT pg_replication_origin_drop(o.roname) FROM pg_replication_origin o
			WHERE o.roname IN (SELECT 'pg_' || s.oid FROM pg_subscription s WHERE s.subname = $1)`, subName); err != nil {
			return errs.Wrap(errs.Internal, err, "cannot drop the subscriptions' replication origins on the new cluster")
		}
	}
	step("origins dropped")
	r.closeAll()
	r.handingOver = true
	if err := r.save(); err != nil {
		return err
	}
	// Both shutdowns at once: each ends with a checkpoint.
	newStopped := make(chan error, 1)
	go func() { newStopped <- r.newInst.Stop(ctx, instance.Fast) }()
	old, err := instance.Attach(o.OldDir)
	if err == nil {
		err = r.stopOld(ctx, old)
	}
	step("old stopped")
	if nerr := <-newStopped; nerr != nil {
		return errs.Wrap(errs.Internal, nerr, "cannot stop the new cluster's private server")
	}
	if err != nil {
		return errs.Wrap(errs.Busy, err, "cannot stop the old cluster for the hand-over").WithPath(o.OldDir)
	}
	r.oldStopped = true
	step("new private server stopped")
	sctx, cancel := context.WithTimeout(ctx, 5*time.Minute)
	defer cancel()
	if err := r.startNew(ctx); err != nil {
		if rerr := pgCtlStart(sctx, o.Old, o.User, o.OldDir, r.oldOpts); rerr != nil {
			return errs.Wrap(errs.Internal, err, "the new cluster does not start with the old one's address, and the old one does not start again either (%v)", rerr).
				WithHint("start the old cluster: %s -D %s start; then ALTER SYSTEM RESET default_transaction_read_only; SELECT pg_reload_conf();", filepath.Join(o.Old.BinDir, "pg_ctl"), o.OldDir)
		}
		r.oldStopped = false
		return errs.Wrap(errs.Internal, err, "the new cluster does not start with the old one's address; the old cluster was started again").
			WithHint("the new cluster's log: %s", filepath.Join(o.NewDir, instance.LogFileName))
	}
	inst, err := instance.Attach(o.NewDir)
	if err != nil {
		return errs.Wrap(errs.Internal, err, "the new cluster started but cannot be found")
	}
	inst.Release()
	r.res.Port, r.res.SocketDir, r.res.HandedOver = inst.Port, inst.SocketDir, true
	return nil
}

// dropOldReplication drops the run's slots on the old cluster (ending the
// WAL senders that still hold them: their subscriptions are disabled) in
// one statement at a time for all databases, and the publications; it
// returns what it could not drop ("" when nothing is left).
func (r *run) dropOldReplication(ctx context.Context) string {
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	var slots []string
	for _, d := range r.dbs {
		if d.slotMade {
			slots = append(slots, d.slot)
		}
	}
	if r.phys {
		slots = append(slots, physSlot)
	}
	var left []string
	tick := time.NewTicker(pollEvery)
	defer tick.Stop()
	for len(slots) > 0 {
		var remain int
		_, err := r.control.Exec(ctx, `SELECT pg_terminate_backend(active_pid) FROM pg_replication_slots WHERE slot_name = ANY($1) AND active_pid IS NOT NULL`, slots)
		if err == nil {
			_, err = r.control.Exec(ctx, `SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE slot_name = ANY($1) AND NOT active`, slots)
		}
		if err == nil {
			err = r.control.QueryRow(ctx, `SELECT count(*) FROM pg_replication_slots WHERE slot_name = ANY($1)`, slots).Scan(&remain)
		}
		if err == nil && remain == 0 {
			break
		}
		select {
		case <-ctx.Done():
			left = append(left, fmt.Sprintf("slots %s on the old cluster (%v)", strings.Join(slots, ", "), err))
			slots = nil
		case <-tick.C:
		}
	}
	if len(left) == 0 {
		for _, d := range r.dbs {
			d.slotMade = false
		}
		r.phys = false
	}
	var mu sync.Mutex
	_ = r.each(ctx, windowJobs, func(ctx context.Context, d *database) error {
		if !d.pub || d.old == nil {
			return nil
		}
		// The old cluster is stopped next, and its shutdown checkpoint
		// flushes the drop: no flush per database in the window.
		_, err := d.old.Exec(ctx, "SET synchronous_commit = off")
		if err == nil {
			_, err = d.old.Exec(ctx, "DROP PUBLICATION IF EXISTS "+pgx.Identifier{pubName}.Sanitize())
		}
		if err != nil {
			mu.Lock()
			left = append(left, fmt.Sprintf("publication %s in database %s of the old cluster (%v)", pubName, d.name, err))
			mu.Unlock()
			return nil
		}
		d.pub = false
		return nil
	})
	if len(left) == 0 {
		return ""
	}
	slices.Sort(left)
	return "; left behind: " + strings.Join(left, ", ")
}

// dropSubscriptions drops the disabled subscriptions on the new cluster
// once it serves at the old one's address (after the window); it returns
// what it could not drop ("" when nothing is left).
func (r *run) dropSubscriptions(ctx context.Context) string {
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	inst, err := instance.Attach(r.o.NewDir)
	if err != nil {
		return fmt.Sprintf("; left behind: the subscriptions %s, disabled, in every database of the new cluster (%v): run DROP SUBSCRIPTION after ALTER SUBSCRIPTION ... SET (slot_name = NONE)", subName, err)
	}
	inst.Release()
	var mu sync.Mutex
	var left []string
	sub := pgx.Identifier{subName}.Sanitize()
	_ = r.each(ctx, windowJobs, func(ctx context.Context, d *database) error {
		if !d.sub {
			return nil
		}
		conn, err := pgx.Connect(ctx, inst.ConnString(r.su, d.name))
		if err == nil {
			for _, q := range []string{"ALTER SUBSCRIPTION " + sub + " SET (slot_name = NONE)", "DROP SUBSCRIPTION " + sub} {
				if _, err = conn.Exec(ctx, q); err != nil {
					break
				}
			}
			_ = conn.Close(context.WithoutCancel(ctx))
		}
		if err != nil {
			mu.Lock()
			left = append(left, fmt.Sprintf("subscription %s (disabled) in database %s of the new cluster (%v)", subName, d.name, err))
			mu.Unlock()
			return nil
		}
		d.sub = false
		return nil
	})
	if len(left) == 0 {
		return ""
	}
	slices.Sort(left)
	return "; left behind: " + strings.Join(left, ", ")
}
