package logical

import (
	"context"
	"errors"
	"fmt"
	"os"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgfork/pgfork/instance"
	"github.com/pgfork/pgfork/internal/errs"
	"github.com/pgfork/pgfork/upgrade"
)

// windowJobs is how many databases the window works on at once: its
// round trips (sequences, catalogs, drops) wait on the servers, not on
// pgfork, on connections opened before.
const windowJobs = 16

// pollEvery is how often the run looks at the slots while it waits.
const pollEvery = 10 * time.Millisecond

// confirmed waits until the slot of every subscribed database has
// confirmed lsn, or ctx ends (the others' slots have no WAL sender).
func (r *run) confirmed(ctx context.Context, lsn string, checkErrors bool) error {
	var slots []string
	for _, d := range r.subscribed() {
		slots = append(slots, d.slot)
	}
	tick := time.NewTicker(pollEvery)
	defer tick.Stop()
	for {
		var behind int
		if err := r.control.QueryRow(ctx, `SELECT count(*) FROM pg_replication_slots WHERE slot_name = ANY($1)
			AND (confirmed_flush_lsn IS NULL OR confirmed_flush_lsn < $2::pg_lsn)`, slots, lsn).Scan(&behind); err != nil {
			return err
		}
		if behind == 0 {
			return nil
		}
		if checkErrors {
			if err := r.applyErrors(ctx); err != nil {
				return err
			}
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-tick.C:
		}
	}
}

// catchUp waits until the new cluster has applied what the old one wrote
// up to now, checks that no apply failed and that the catalogs match,
// before writes are refused.
func (r *run) catchUp(ctx context.Context) error {
	cctx, cancel := context.WithTimeout(ctx, r.o.CatchUp)
	defer cancel()
	// Until a scan of the WAL finds no database written that has no
	// subscription yet: those it finds are subscribed from R and caught
	// up in the next round (each database at most once).
	for {
		var lsn string
		if err := r.control.QueryRow(cctx, "SELECT pg_current_wal_lsn()::text").Scan(&lsn); err != nil {
			return errs.Wrap(errs.Internal, err, "cannot read the old cluster's WAL position")
		}
		var found []*database
		if r.scan.ok {
			var err error
			if found, err = r.scanWAL(cctx); err != nil {
				return err
			}
			if len(found) > 0 {
				if err := r.checkSenders(cctx, len(found)); err != nil {
					return err
				}
				r.infof(PhaseCatchUp, "%d more databases were written (%s): subscribed", len(found), names(found))
				if err := r.subscribeDBs(cctx, found, r.scan.R); err != nil {
					return err
				}
			}
		}
		if err := r.confirmed(cctx, lsn, true); err != nil {
			if errors.Is(err, context.DeadlineExceeded) && ctx.Err() == nil {
				if sum := r.watch.summary(); sum != "" {
					return errs.New(errs.Busy, "the new cluster did not catch up with the old one within %s%s", r.o.CatchUp, sum).
						WithHint("nothing was changed on the old cluster: run again once the cause is gone")
				}
				return errs.New(errs.Busy, "the new cluster did not catch up with the old one within %s", r.o.CatchUp).
					WithHint("the old cluster writes faster than the new one applies; run again at a quieter time")
			}
			return err
		}
		if len(found) == 0 {
			break
		}
	}
	if err := r.applyErrors(ctx); err != nil {
		return err
	}
	if err := r.compare(ctx); err != nil {
		return err
	}
	// The window copies only what moved after this.
	if _, err := r.copySequences(ctx); err != nil {
		return err
	}
	if r.ho != nil {
		// The shutdowns of the hand-over end with a checkpoint each: most
		// of their writing is done here, outside the window.
		if _, err := r.control.Exec(ctx, "CHECKPOINT"); err != nil {
			return errs.Wrap(errs.Internal, err, "checkpoint on the old cluster")
		}
		for _, d := range r.dbs[:1] {
			if _, err := d.new.Exec(ctx, "CHECKPOINT"); err != nil {
				return errs.Wrap(errs.Internal, err, "checkpoint on the new cluster")
			}
		}
	}
	if r.scan.ok {
		// The databases not subscribed need no connection of pgfork's on
		// the old cluster in the window (subscribeDBs opens one again for a
		// database its final scan finds written; the clean-up reconnects):
		// their backends exit now, not in the old cluster's stop inside
		// the window.
		var idle []*database
		for _, d := range r.dbs {
			if !d.sub && d.old != nil && !d.old.IsClosed() {
				idle = append(idle, d)
			}
		}
		_ = eachOf(ctx, idle, windowJobs, func(ctx context.Context, d *database) error {
			_ = d.old.Close(ctx)
			return nil
		})
	}
	return nil
}

// userSchemas leaves out the system's schemas and every session's
// temporary ones (a session's temporary table is not the schema).
const userSchemas = `n.nspname NOT IN ('pg_catalog', 'information_schema', 'pg_toast')
  AND n.nspname NOT LIKE 'pg_temp_%' AND n.nspname NOT LIKE 'pg_toast_temp_%'`

// catalogSQL reads, in one statement, a database's catalog fingerprint
// (an md5 of its user relations with their kinds, functions with their
// signatures, types, extensions with their versions, and the columns of
// its tables, views and foreign tables with their types: what logical
// replication does not carry) with its large-object count, and its
// sequences' qualified names and last values. One round trip per database
// in the window; the columns are read from the user schemas' relations
// only (a join from pg_namespace), not formatted for every system column.
const catalogSQL = `SELECT md5(concat_ws('|',
  (SELECT string_agg(s, ',' ORDER BY s) FROM (SELECT format('%I.%I:%s', n.nspname, c.relname, c.relkind) s
     FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace WHERE ` + userSchemas + `) r),
  (SELECT string_agg(s, ',' ORDER BY s) FROM (SELECT p.oid::regprocedure::text s
     FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace WHERE ` + userSchemas + `) f),
  (SELECT string_agg(s, ',' ORDER BY s) FROM (SELECT format('%I.%I', n.nspname, t.typname) s
     FROM pg_type t JOIN pg_namespace n ON n.oid = t.typnamespace WHERE ` + userSchemas + `) t),
  (SELECT string_agg(extname || ' ' || extversion, ',' ORDER BY extname) FROM pg_extension),
  (SELECT string_agg(s, ',' ORDER BY s) FROM (SELECT format('%I.%I.%I:%s', n.nspname, c.relname, a.attname, format_type(a.atttypid, a.atttypmod)) s
     FROM pg_namespace n JOIN pg_class c ON c.relnamespace = n.oid JOIN pg_attribute a ON a.attrelid = c.oid
     WHERE ` + userSchemas + ` AND c.relkind IN ('r', 'p', 'v', 'm', 'f') AND a.attnum > 0 AND NOT a.attisdropped) x)))
  || ' ' || (SELECT count(*) FROM pg_largeobject_metadata),
  q.names, q.vals
FROM (SELECT coalesce(array_agg(format('%I.%I', schemaname, sequencename)), '{}') names, coalesce(array_agg(last_value), '{}') vals
  FROM pg_sequences WHERE last_value IS NOT NULL AND schemaname NOT LIKE 'pg_temp%') q`

// dbState is what catalogSQL read of one database.
type dbState struct {
	catalog string
	seqs    []string // qualified, quoted names
	vals    []int64
}

// readDB runs catalogSQL on conn.
func readDB(ctx context.Context, conn *pgx.Conn) (dbState, error) {
	var st dbState
	err := conn.QueryRow(ctx, catalogSQL).Scan(&st.catalog, &st.seqs, &st.vals)
	return st, err
}

// catalogOf returns a database's catalog fingerprint and large-object
// count (catalogSQL).
func catalogOf(ctx context.Context, conn *pgx.Conn) (string, error) {
	st, err := readDB(ctx, conn)
	return st.catalog, err
}

// moved returns the sequences of st whose value differs from what was
// last copied to the new cluster (d.seqs).
func (d *database) moved(st dbState) (names []string, vals []int64) {
	for i, n := range st.seqs {
		if last, ok := d.seqs[n]; !ok || last != st.vals[i] {
			names, vals = append(names, n), append(vals, st.vals[i])
		}
	}
	return names, vals
}

// setSQL sets the new cluster's sequences to the old one's values.
const setSQL = `SELECT setval(n::regclass, v) FROM unnest($1::text[], $2::bigint[]) AS t(n, v)`

// copied records sequence values set on the new cluster.
func (d *database) copied(names []string, vals []int64) {
	if d.seqs == nil {
		d.seqs = map[string]int64{}
	}
	for i := range names {
		d.seqs[names[i]] = vals[i]
	}
}

// clusterChecks checks what is cluster-wide: no transaction prepared
// during the run, no database created or dropped since it began.
func (r *run) clusterChecks(ctx context.Context) error {
	// A transaction prepared during the run could commit after the cutover.
	var prepared int
	if err := r.control.QueryRow(ctx, "SELECT count(*) FROM pg_prepared_xacts").Scan(&prepared); err != nil {
		return errs.Wrap(errs.Internal, err, "cannot read pg_prepared_xacts")
	}
	if prepared > 0 {
		return errs.New(errs.Busy, "%d transactions were prepared on the old cluster during the run; they could commit after the cutover", prepared).
			WithHint("COMMIT PREPARED or ROLLBACK PREPARED them, then run again")
	}
	rows, err := r.control.Query(ctx, `SELECT datname FROM pg_database WHERE datallowconn AND datname <> 'template1' ORDER BY datname`)
	if err != nil {
		return errs.Wrap(errs.Internal, err, "cannot list databases")
	}
	now, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return errs.Wrap(errs.Internal, err, "cannot list databases")
	}
	if !slices.Equal(now, r.res.Databases) {
		return errs.New(errs.Unsupported, "the old cluster's databases changed since the run began (%s, was %s)", strings.Join(now, ", "), strings.Join(r.res.Databases, ", ")).
			WithHint("run again (and create no databases meanwhile)")
	}
	return nil
}

// compare checks the cluster (clusterChecks) and that every database's
// catalog and large objects are the same on both sides: what logical
// replication does not carry. What it found equal is kept in d.catalog,
// for the window.
func (r *run) compare(ctx context.Context) error {
	if err := r.clusterChecks(ctx); err != nil {
		return err
	}
	var mu sync.Mutex
	var drift []string
	// Only the subscribed: the WAL proves the others unchanged since R.
	if err := eachOf(ctx, r.subscribed(), windowJobs, func(ctx context.Context, d *database) error {
		same, err := sameCatalog(ctx, d)
		if err != nil {
			return err
		}
		if !same {
			mu.Lock()
			drift = append(drift, d.name)
			mu.Unlock()
		}
		return nil
	}); err != nil {
		return err
	}
	if len(drift) > 0 {
		slices.Sort(drift)
		return driftError(drift...)
	}
	return nil
}

// windowPass is the window's work per database, one database per job on
// the connections opened before: one statement on the old side (catalogSQL:
// the catalog fingerprint and large objects, compared with what the
// catch-up found equal on both sides — nothing but the apply writes to the
// new cluster, which carries no DDL and no large objects, so its side
// cannot have changed since — and the sequences), then one round trip on
// the new side (the sequences that moved since the catch-up's copy, and,
// with the hand-over, ALTER SUBSCRIPTION … DISABLE: see
// disableSubscriptions) in one transaction. It returns how many sequences
// it set; a database whose catalog changed fails it (the caller rolls
// back, which drops the subscriptions, disabled or not).
func (r *run) windowPass(ctx context.Context) (int, error) {
	var mu sync.Mutex
	var drift []string
	total := 0
	disable := r.ho != nil
	// Only the subscribed: the WAL up to the window's LSN proves the
	// others unchanged since R (catalogs, large objects, sequences: see
	// walscan.go).
	err := eachOf(ctx, r.subscribed(), windowJobs, func(ctx context.Context, d *database) error {
		st, err := readDB(ctx, d.old)
		if err != nil {
			return errs.Wrap(errs.Internal, err, "cannot read the catalog of database %q of the old cluster", d.name)
		}
		if st.catalog != d.catalog {
			mu.Lock()
			drift = append(drift, d.name)
			mu.Unlock()
			return nil
		}
		names, vals := d.moved(st)
		b := &pgx.Batch{}
		if len(names) > 0 {
			b.Queue(setSQL, names, vals)
		}
		if disable && d.sub {
			b.Queue("ALTER SUBSCRIPTION " + pgx.Identifier{subName}.Sanitize() + " DISABLE")
		}
		if b.Len() == 0 {
			return nil
		}
		if err := d.new.SendBatch(ctx, b).Close(); err != nil {
			return errs.Wrap(errs.Internal, err, "cannot copy the sequences of database %q to the new cluster or disable its subscription", d.name)
		}
		d.copied(names, vals)
		mu.Lock()
		total += len(names)
		mu.Unlock()
		if disable {
			// The hand-over needs no more of this database's connections
			// (but the first one's on the new side): their backends exit
			// now, beside the other databases' work, not one after the
			// other before the stops. A rollback reconnects.
			_ = d.old.Close(ctx)
			if d != r.dbs[0] {
				_ = d.new.Close(ctx)
			}
		}
		return nil
	})
	if err != nil {
		return total, err
	}
	if len(drift) > 0 {
		slices.Sort(drift)
		return total, driftError(drift...)
	}
	return total, nil
}

// driftError says that databases changed in what replication does not carry.
func driftError(dbs ...string) error {
	return errs.New(errs.Unsupported, "the catalog or the large objects of database %s changed on the old cluster since the run began: logical replication does not carry that", strings.Join(dbs, ", ")).
		WithHint("run again, with no DDL and no large objects written meanwhile")
}

// sameCatalog compares a database's catalog and large objects on both
// sides; when they match it keeps them in d.catalog.
func sameCatalog(ctx context.Context, d *database) (bool, error) {
	a, err := catalogOf(ctx, d.old)
	if err != nil {
		return false, errs.Wrap(errs.Internal, err, "cannot read the catalog of database %q of the old cluster", d.name)
	}
	b, err := catalogOf(ctx, d.new)
	if err != nil {
		return false, errs.Wrap(errs.Internal, err, "cannot read the catalog of database %q of the new cluster", d.name)
	}
	if a == b {
		d.catalog = a
	}
	return a == b, nil
}

// window refuses writes on the old cluster, waits until every slot has
// confirmed its current LSN, copies the sequences and compares the
// catalogs, all within o.Window; on failure the caller gives writes back.
func (r *run) window(ctx context.Context) error {
	t0 := time.Now()
	wctx, cancel := context.WithTimeout(ctx, r.o.Window)
	defer cancel()
	err := r.inWindow(wctx)
	r.res.Window = time.Since(t0)
	if err != nil && errors.Is(err, context.DeadlineExceeded) && ctx.Err() == nil {
		return errs.New(errs.Busy, "the write pause did not finish within %s; writes were given back%s", r.o.Window, r.watch.summary()).
			WithHint("the new cluster lags behind the old one; run again at a quieter time, or allow a longer pause").WithCLI("--window")
	}
	if err == nil {
		var steps []string
		for _, s := range r.res.WindowSteps {
			steps = append(steps, fmt.Sprintf("%s %s", s.Name, s.Elapsed.Round(time.Millisecond)))
		}
		r.infof(PhaseWindow, "writes were refused for %s (%s)", r.res.Window.Round(time.Millisecond), strings.Join(steps, ", "))
	}
	return err
}

func (r *run) inWindow(ctx context.Context) error {
	c := r.control
	last := time.Now()
	step := func(name string) {
		r.res.WindowSteps = append(r.res.WindowSteps, upgrade.PhaseTime{Name: name, Elapsed: time.Since(last)})
		last = time.Now()
	}
	r.readOnly = true
	if err := r.save(); err != nil {
		return err
	}
	if _, err := c.Exec(ctx, "ALTER SYSTEM SET default_transaction_read_only = on"); err != nil {
		return errs.Wrap(errs.Internal, err, "cannot refuse writes on the old cluster")
	}
	if _, err := c.Exec(ctx, "SELECT pg_reload_conf()"); err != nil {
		return errs.Wrap(errs.Internal, err, "cannot reload the old cluster's configuration")
	}
	r.infof(PhaseWindow, "writes refused on the old cluster")
	// End every other session: its open transaction may write.
	rows, err := c.Query(ctx, `SELECT pid FROM pg_stat_activity WHERE backend_type = 'client backend' AND pid <> ALL($1)`, r.ownPIDs)
	if err != nil {
		return errs.Wrap(errs.Internal, err, "cannot list the old cluster's sessions")
	}
	pids, err := pgx.CollectRows(rows, pgx.RowTo[int32])
	if err != nil {
		return errs.Wrap(errs.Internal, err, "cannot list the old cluster's sessions")
	}
	if _, err := c.Exec(ctx, "SELECT pg_terminate_backend(p) FROM unnest($1::int[]) p", pids); err != nil {
		return errs.Wrap(errs.Internal, err, "cannot end the old cluster's sessions")
	}
	tick := time.NewTicker(pollEvery)
	defer tick.Stop()
	for {
		var alive int
		if err := c.QueryRow(ctx, "SELECT count(*) FROM pg_stat_activity WHERE pid = ANY($1)", pids).Scan(&alive); err != nil {
			return err
		}
		if alive == 0 {
			break
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-tick.C:
		}
	}
	step("sessions ended")
	var lsn string
	if err := c.QueryRow(ctx, "SELECT pg_current_wal_lsn()::text").Scan(&lsn); err != nil {
		return err
	}
	if r.scan.ok {
		// The final scan, from where the catch-up's last one ended to past
		// the window's LSN: a database written only since is subscribed
		// and caught up here, inside the window.
		late, err := r.scanWAL(ctx)
		if err != nil {
			return err
		}
		if len(late) > 0 {
			if err := r.checkSenders(ctx, len(late)); err != nil {
				return err
			}
			if err := r.subscribeDBs(ctx, late, r.scan.R); err != nil {
				return err
			}
			for _, d := range late {
				r.res.SubscribedInWindow = append(r.res.SubscribedInWindow, d.name)
			}
		}
		r.infof(PhaseWindow, "the final WAL scan found %d databases written only since the catch-up's last scan%s", len(late), inWindowNote(late))
		step("WAL scanned")
	}
	if err := r.confirmed(ctx, lsn, true); err != nil {
		return err
	}
	step("slots confirmed")
	if err := r.applyErrors(ctx); err != nil {
		return err
	}
	if err := r.clusterChecks(ctx); err != nil {
		return err
	}
	n, err := r.windowPass(ctx)
	r.res.Sequences = n
	if err != nil {
		return err
	}
	if r.ho != nil {
		step("databases checked, sequences copied, subscriptions disabled")
	} else {
		step("databases checked, sequences copied")
	}
	if r.ho != nil {
		err := r.handOver(ctx, step)
		step("new cluster started")
		return err
	}
	return nil
}

// dropSlot drops a slot on the old cluster, retrying while its WAL sender
// still exits (right after DROP SUBSCRIPTION the slot is still active).
func dropSlot(ctx context.Context, conn *pgx.Conn, slot string) error {
	tick := time.NewTicker(pollEvery)
	defer tick.Stop()
	for {
		_, err := conn.Exec(ctx, `SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE slot_name = $1`, slot)
		if err == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%w (last: %v)", ctx.Err(), err)
		case <-tick.C:
		}
	}
}

// dropReplication removes the subscriptions on the new cluster and the
// slots and publications on the old one; it returns what it could not
// remove ("" when nothing is left).
func (r *run) dropReplication(ctx context.Context) string {
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	var mu sync.Mutex
	var left []string
	note := func(format string, args ...any) {
		mu.Lock()
		left = append(left, fmt.Sprintf(format, args...))
		mu.Unlock()
	}
	r.reconnect(ctx)
	_ = r.each(ctx, windowJobs, func(ctx context.Context, d *database) error {
		if d.sub && d.new != nil {
			sub := pgx.Identifier{subName}.Sanitize()
			var err error
			for _, q := range []string{"ALTER SUBSCRIPTION " + sub + " DISABLE", "ALTER SUBSCRIPTION " + sub + " SET (slot_name = NONE)", "DROP SUBSCRIPTION " + sub} {
				if _, err = d.new.Exec(ctx, q); err != nil {
					break
				}
			}
			if err != nil {
				note("subscription %s in database %s of the new cluster (%v)", subName, d.name, err)
			} else {
				d.sub = false
			}
		}
		if d.old == nil {
			return nil
		}
		if d.slotMade {
			if err := dropSlot(ctx, d.old, d.slot); err != nil {
				note("slot %s on the old cluster (%v)", d.slot, err)
			} else {
				d.slotMade = false
			}
		}
		if d.pub {
			if _, err := d.old.Exec(ctx, "DROP PUBLICATION IF EXISTS "+pgx.Identifier{pubName}.Sanitize()); err != nil {
				note("publication %s in database %s of the old cluster (%v)", pubName, d.name, err)
			} else {
				d.pub = false
			}
		}
		return nil
	})
	if r.phys && r.control != nil {
		if err := dropSlot(ctx, r.control, physSlot); err != nil {
			note("slot %s on the old cluster (%v)", physSlot, err)
		} else {
			r.phys = false
		}
	}
	if len(left) == 0 {
		return ""
	}
	slices.Sort(left)
	return "; left behind: " + strings.Join(left, ", ")
}

// reconnect reopens the connections an interrupt closed (pgx closes a
// connection whose query was cancelled), and those of the databases not
// subscribed, closed at the catch-up's end, for the clean-up; a few at a
// time.
func (r *run) reconnect(ctx context.Context) {
	if r.control != nil && r.control.IsClosed() {
		if c, err := pgx.Connect(ctx, r.oldURL("template1", "pgfork upgrade")); err == nil {
			r.control = c
		}
	}
	_ = r.each(ctx, windowJobs, func(ctx context.Context, d *database) error {
		if d.old != nil && d.old.IsClosed() {
			if c, err := pgx.Connect(ctx, r.oldURL(d.name, "pgfork upgrade")); err == nil {
				d.old = c
			}
		}
		if d.new != nil && d.new.IsClosed() && r.newInst != nil {
			if c, err := pgx.Connect(ctx, r.newInst.ConnString(r.su, d.name)); err == nil {
				d.new = c
			}
		}
		return nil
	})
}

// rollback gives writes back to the old cluster, removes what the run
// created on both sides and the new cluster, and returns what it could not
// remove ("" when nothing is left).
func (r *run) rollback(ctx context.Context) string {
	var left []string
	r.reconnect(ctx)
	if r.readOnly && r.control != nil {
		_, err1 := r.control.Exec(ctx, "ALTER SYSTEM RESET default_transaction_read_only")
		_, err2 := r.control.Exec(ctx, "SELECT pg_reload_conf()")
		if err := errors.Join(err1, err2); err != nil {
			left = append(left, fmt.Sprintf("the old cluster refuses writes: run ALTER SYSTEM RESET default_transaction_read_only; SELECT pg_reload_conf(); on it (%v)", err))
		}
	}
	// The new cluster goes, its subscriptions with it: stopped first, its
	// WAL senders on the old cluster let go of the slots.
	if r.newInst != nil && r.newMade {
		_ = r.newInst.Stop(ctx, instance.Fast)
		for _, d := range r.dbs {
			d.sub = false
		}
	}
	if s := r.dropReplication(ctx); s != "" {
		left = append(left, strings.TrimPrefix(s, "; "))
	}
	if r.newInst != nil {
		_ = r.newInst.Stop(ctx, instance.Fast)
	}
	r.removeClone()
	if r.newMade {
		if err := os.RemoveAll(r.o.NewDir); err != nil {
			left = append(left, fmt.Sprintf("the new data directory %s (%v)", r.o.NewDir, err))
		}
	}
	if len(left) == 0 {
		return ""
	}
	return "; " + strings.Join(left, "; ")
}

// copySequences copies every sequence's last_value from the old cluster to
// the new one, skipping those whose value was copied before (one round
// trip to the old cluster per database, and one to the new where a value
// moved); it returns how many it set.
func (r *run) copySequences(ctx context.Context) (int, error) {
	var mu sync.Mutex
	total := 0
	err := eachOf(ctx, r.subscribed(), windowJobs, func(ctx context.Context, d *database) error {
		st, err := readDB(ctx, d.old)
		if err != nil {
			return errs.Wrap(errs.Internal, err, "cannot read the sequences of database %q", d.name)
		}
		names, vals := d.moved(st)
		if len(names) == 0 {
			return nil
		}
		if _, err := d.new.Exec(ctx, setSQL, names, vals); err != nil {
			return errs.Wrap(errs.Internal, err, "cannot copy the sequences of database %q", d.name)
		}
		d.copied(names, vals)
		mu.Lock()
		total += len(names)
		mu.Unlock()
		return nil
	})
	return total, err
}

// inWindowNote names the databases the window subscribed.
func inWindowNote(late []*database) string {
	if len(late) == 0 {
		return ""
	}
	return " (" + names(late) + "): subscribed and caught up inside the window"
}
