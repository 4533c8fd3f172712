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

	"github.com/pgfork/pgfork/dbclone"
	"github.com/pgfork/pgfork/instance"
	"github.com/pgfork/pgfork/internal/errs"
	"github.com/pgfork/pgfork/pgdata"
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
	r.appHost, r.appPort = r.oldHost, r.oldPort
	// What its command line set (wal_level, max_replication_slots, …),
	// for the private start after the hand-over: it must start with them.
	rows, err := r.control.Query(ctx, "SELECT name, setting FROM pg_settings WHERE source = 'command line'")
	if err != nil {
		return errs.Wrap(errs.Internal, err, "cannot read the old cluster's settings")
	}
	r.oldSettings = map[string]string{}
	var k, v string
	if _, err := pgx.ForEachRow(rows, []any{&k, &v}, func() error { r.oldSettings[k] = v; return nil }); err != nil {
		return errs.Wrap(errs.Internal, err, "cannot read the old cluster's settings")
	}
	if b, err := os.ReadFile(filepath.Join(o.OldDir, "postmaster.opts")); err == nil {
		r.oldOptsRaw = string(b)
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

// oldLogName is the log of the old cluster's starts by pgfork (its private
// start in the clean-up, its start again after a failed hand-over or by
// the rollback), in NEW_DATADIR: the old data directory is the user's,
// and pgfork leaves no file there. NEW_DATADIR is the run's and belongs to
// the server's OS user, who writes the log (pg_ctl -l opens it as that
// user). Copies of the new cluster leave it out.
const oldLogName = pgdata.OldClusterLogFile

// oldLog is where the old cluster's starts by this run log.
func (r *run) oldLog() string { return filepath.Join(r.o.NewDir, oldLogName) }

// pgCtlStart starts the cluster in dir with pg_ctl and its own
// configuration, its output appended to logFile, in a process group of its
// own (the terminal's Ctrl-C reaches pgfork alone).
func pgCtlStart(ctx context.Context, bin upgrade.Install, u *instance.OSUser, dir, opts, logFile string) error {
	args := []string{"start", "-D", dir, "-w", "-t", "300", "-l", logFile}
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
		done <- pgCtlStart(pctx, r.o.New, r.o.User, r.o.NewDir, "", filepath.Join(r.o.NewDir, instance.LogFileName))
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

// handOver, at the end of the window (the subscriptions are disabled
// already, see windowPass): the WAL senders on the old cluster ended, the old cluster stopped (fast), the
// new one started with its own configuration at the old one's address.
// The old side's slots and publications stay on the stopped old cluster:
// cleanOld drops them after the window, on a private start, and the state
// file says they are there until then (a kill leaves them to the next run
// or --rollback). The disabled subscriptions are dropped after the window
// too (dropSubscriptions), once the new cluster serves: their DROP waits
// for each apply worker to exit, which the window need not wait for. If
// the new cluster does not start, the old one is started again as it ran
// (the caller then gives writes back and drops what the run created).
func (r *run) handOver(ctx context.Context, step func(string)) error {
	o := r.o
	ctx = context.WithoutCancel(ctx) // past here, a half-done hand-over is worse than a late one
	// The WAL senders of the run's slots end now, in one statement: an
	// apply worker notices its disabled subscription only when it wakes
	// (up to a second when nothing arrives); the end of its stream makes
	// it exit at once, and the launcher starts no other for a disabled
	// subscription. The old cluster's shutdown does not wait for them
	// either.
	if _, err := r.control.Exec(ctx, `SELECT pg_terminate_backend(active_pid) FROM pg_replication_slots
		WHERE slot_name LIKE 'pgfork\_upgrade\_%' AND active_pid IS NOT NULL`); err != nil {
		return errs.Wrap(errs.Internal, err, "cannot end the old cluster's WAL senders")
	}
	// The disabled subscriptions' origins go now, in one statement (the
	// catalog is shared), once no apply worker holds one: the new
	// cluster's own configuration allows only a few active origins
	// (max_active_replication_origins on 18, max_replication_slots before)
	// and would not start with hundreds. DROP SUBSCRIPTION later skips a
	// missing origin.
	if len(r.dbs) > 0 && r.dbs[0].new != nil {
		// An apply worker holds its origin until its very end, after it
		// left pg_stat_subscription: the drop is retried while one is in
		// use (SQLSTATE 55006), not waited for by another view.
		c := r.dbs[0].new
		tick := time.NewTicker(2 * time.Millisecond)
		defer tick.Stop()
		deadline := time.After(time.Minute)
		for {
			_, err := c.Exec(ctx, `SELECT pg_replication_origin_drop(o.roname) FROM pg_replication_origin o
				WHERE o.roname IN (SELECT 'pg_' || s.oid FROM pg_subscription s WHERE s.subname = $1)`, subName)
			if err == nil {
				break
			}
			if !dbclone.InUse(err) {
				return errs.Wrap(errs.Internal, err, "cannot drop the subscriptions' replication origins on the new cluster")
			}
			select {
			case <-deadline:
				return errs.Wrap(errs.Busy, err, "the apply workers of the new cluster did not let go of their replication origins within a minute of their subscriptions' disable").
					WithHint("the new cluster's log: %s", r.newInst.LogFile)
			case <-tick.C:
			}
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
		if rerr := pgCtlStart(sctx, o.Old, o.User, o.OldDir, r.oldOpts, r.oldLog()); rerr != nil {
			return errs.Wrap(errs.Internal, err, "the new cluster does not start with the old one's address, and the old one does not start again either (%v; its log: %s)", rerr, r.oldLog()).
				WithHint("start the old cluster: %s -D %s start; then ALTER SYSTEM RESET default_transaction_read_only; SELECT pg_reload_conf(); and drop the slots pgfork_upgrade_* and the publications pgfork_upgrade on it",
					filepath.Join(o.Old.BinDir, "pg_ctl"), o.OldDir)
		}
		r.oldStopped = false
		return errs.Wrap(errs.Internal, err, "the new cluster does not start with the old one's address; the old cluster was started again").
			WithHint("the new cluster's log: %s", filepath.Join(o.NewDir, instance.LogFileName))
	}
	// Done: from here on, a kill leaves the old cluster's slots and
	// publications to the next run or --rollback.
	r.handingOver, r.oldCarries = false, true
	if err := r.save(); err != nil {
		r.res.Notes = append(r.res.Notes, err.Error())
	}
	inst, err := instance.Attach(o.NewDir)
	if err != nil {
		return errs.Wrap(errs.Internal, err, "the new cluster started but cannot be found")
	}
	inst.Release()
	r.res.Port, r.res.SocketDir, r.res.HandedOver = inst.Port, inst.SocketDir, true
	return nil
}

// Why the window disables the subscriptions (windowPass), and why per
// database: after the hand-over the old cluster's address is the new
// cluster's own. A subscription still enabled at the new cluster's start
// would have its apply worker connect there (to itself, for a slot that
// does not exist) from the launcher's first round, before the clean-up
// drops it. ALTER SUBSCRIPTION … DISABLE is the supported way to prevent
// that: it commits subenabled = false, which the launcher reads before it
// starts a worker. It must run in each subscription's database
// (PostgreSQL has no statement for all of them; an UPDATE of the shared
// catalog pg_subscription would be one statement but bypasses ALTER
// SUBSCRIPTION's locking and is not supported; and it would save little:
// measured on PostgreSQL 15 at load average 17, 200 ALTER SUBSCRIPTION …
// DISABLE, 16 at a time, took 21–37 ms, the UPDATE 2–10 ms, while the
// window's disable step took 0.5–0.7 s: the cost is the apply workers'
// and WAL senders' exits, which any way of stopping them pays), so it goes
// in the same round trip and transaction as that database's sequences, on
// the connections opened before the window, without a WAL flush each
// (synchronous_commit is off on them: the private server's shutdown
// checkpoint makes it durable before the new cluster starts at the
// address). It comes after every slot confirmed the window's LSN: nothing
// is left to apply.

// cleanOld drops the run's slots and publications on the old cluster
// after the hand-over, while the new cluster serves at its address: the
// old cluster is started privately (a private socket directory, no TCP,
// default_transaction_read_only on: nobody else reaches it, and it refuses
// writes), they are dropped, it is stopped (its shutdown checkpoint makes
// the drops durable) and its postmaster.opts is put back as it ran. An old
// cluster left running by a killed clean-up is used as it runs, and
// stopped unless it runs at its own address (then someone started it
// there). It returns what it could not drop ("" when nothing is left).
func (r *run) cleanOld(ctx context.Context) string {
	o := r.o
	ctx, cancel := context.WithTimeout(ctx, 5*time.Minute)
	defer cancel()
	var inst *instance.Instance
	if _, running, _ := pgdata.Running(o.OldDir); running {
		pf, err := instance.ReadPidFile(o.OldDir)
		if err != nil {
			return fmt.Sprintf("; left behind: the slots pgfork_upgrade_* and the publications %s on the old cluster, which runs but cannot be read (%v)", pubName, err)
		}
		if pf.SocketDir != r.appHost || pf.Port != r.appPort {
			if inst, err = instance.Attach(o.OldDir); err != nil {
				return fmt.Sprintf("; left behind: the slots pgfork_upgrade_* and the publications %s on the old cluster, which runs but cannot be proven to be its postmaster (%v)", pubName, err)
			}
		}
	} else {
		var err error
		// Its command line's settings, but a private address (instance
		// sets listen_addresses, unix_socket_directories and port), writes
		// refused, no synchronous standby waited for; wal_level as the
		// preflight found it (logical slots need it to start).
		settings := map[string]string{}
		for k, v := range r.oldSettings {
			settings[k] = v
		}
		for k, v := range map[string]string{"wal_level": "logical", "default_transaction_read_only": "on", "synchronous_standby_names": ""} {
			settings[k] = v
		}
		inst, err = instance.Start(ctx, instance.Config{BinDir: o.Old.BinDir, Env: o.Old.Env, DataDir: o.OldDir, User: o.User, Settings: settings,
			LogFile: r.oldLog()})
		if err != nil {
			return fmt.Sprintf("; left behind: the slots pgfork_upgrade_* and the publications %s on the stopped old cluster, which did not start privately to drop them (%v; its log: %s)", pubName, err, r.oldLog())
		}
	}
	left := r.dropOnOld(ctx)
	r.closeAll()
	r.control = nil
	if inst != nil {
		if err := inst.Stop(context.WithoutCancel(ctx), instance.Fast); err != nil {
			left += fmt.Sprintf("; the old cluster's private server (pid %d) did not stop: %v", inst.Pid, err)
		} else if r.oldOptsRaw != "" {
			if err := instance.WriteFileAs(filepath.Join(o.OldDir, "postmaster.opts"), o.User, []byte(r.oldOptsRaw)); err != nil {
				left += fmt.Sprintf("; the old cluster's postmaster.opts still holds the private start's options (%v)", err)
			}
		}
	}
	return left
}

// dropOnOld connects to the old cluster where it runs now (its
// postmaster.pid says where) and drops the run's slots and publications
// in every database of r.dbs; it returns what it could not drop.
func (r *run) dropOnOld(ctx context.Context) string {
	if r.control == nil || r.control.IsClosed() {
		if err := r.connectOld(ctx); err != nil {
			return fmt.Sprintf("; left behind: the slots pgfork_upgrade_* and the publications %s on the old cluster (%v)", pubName, err)
		}
	}
	_ = r.each(ctx, 4, func(ctx context.Context, d *database) error {
		d.new, d.sub = nil, false
		d.old = nil
		if conn, err := pgx.Connect(ctx, r.oldURL(d.name, "pgfork upgrade")); err == nil {
			d.old = conn
		}
		return nil
	})
	// Slots are cluster-wide: those of databases dropped since go by name
	// too (their publications went with the database).
	for _, d := range r.dbs {
		if d.old == nil && d.slotMade {
			if err := dropSlot(ctx, r.control, d.slot); err == nil {
				d.slotMade = false
			}
		}
	}
	r.phys = true
	return r.dropReplication(ctx)
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

// markSubscriptions connects to the new cluster, which serves at the old
// one's address after a hand-over, as one of the superuser candidates
// (r.su first), and marks the databases of r.dbs whose subscription is
// still there (pg_subscription is shared: one query for all); it sets r.su
// to the role that connected.
func (r *run) markSubscriptions(ctx context.Context) error {
	inst, err := instance.Attach(r.o.NewDir)
	if err != nil {
		return err
	}
	inst.Release()
	cands := superuserCandidates(r.o.Superuser, r.o.NewDir)
	if r.su != "" {
		cands = append([]string{r.su}, cands...)
	}
	for _, su := range cands {
		conn, cerr := pgx.Connect(ctx, inst.ConnString(su, "template1"))
		if cerr != nil {
			err = cerr
			continue
		}
		defer conn.Close(context.WithoutCancel(ctx))
		rows, err := conn.Query(ctx, `SELECT d.datname::text FROM pg_subscription s JOIN pg_database d ON d.oid = s.subdbid WHERE s.subname = $1`, subName)
		if err != nil {
			return err
		}
		has, err := pgx.CollectRows(rows, pgx.RowTo[string])
		if err != nil {
			return err
		}
		r.su = su
		for _, d := range r.dbs {
			d.sub = slices.Contains(has, d.name)
		}
		return nil
	}
	return err
}

// finishCleanup drops what a run whose hand-over was done left behind (it
// was killed before or during its clean-up, as the state file st says):
// the old side's slots and publications (cleanOld, a private start of the
// old cluster) and the disabled subscriptions on the new cluster, which
// serves. It returns what it did, or an error naming what is left.
func (r *run) finishCleanup(ctx context.Context, st *state) ([]string, error) {
	r.appHost, r.appPort, r.oldOptsRaw, r.oldSettings = st.OldHost, st.OldPort, st.OldOpts, st.OldSettings
	for name, slot := range st.Databases {
		r.dbs = append(r.dbs, &database{name: name, slot: slot, pub: true, slotMade: true})
	}
	slices.SortFunc(r.dbs, func(a, b *database) int { return strings.Compare(a.name, b.name) })
	left := r.cleanOld(ctx)
	if err := r.markSubscriptions(ctx); err != nil {
		left += fmt.Sprintf("; the subscriptions %s on the new cluster: cannot connect to it to drop them (%v)", subName, err)
	} else {
		left += r.dropSubscriptions(ctx)
	}
	if left != "" {
		return nil, errs.New(errs.Busy, "cannot finish the clean-up of an earlier run%s", left).WithPath(statePath(r.o.NewDir)).
			WithHint("drop them by hand and remove %s", statePath(r.o.NewDir))
	}
	return []string{fmt.Sprintf("dropped its slots and publications on the old cluster (started privately, stopped again) and its subscriptions on the new cluster, in %d databases", len(st.Databases))}, nil
}
