// Package logical upgrades a running cluster to a newer PostgreSQL major
// with a write pause of about a second: pg_upgrade runs on an online
// reflink clone of it while it serves, and logical replication carries
// what was written since the clone, as pg_createsubscriber does across
// majors.
//
// The sequence: publications and a physical slot on the old cluster; an
// online clone; per database a logical slot, the last one's LSN R; the clone
// recovered as a standby that stops just before R and promotes; pg_upgrade
// --clone of it (package upgrade); on the new cluster per database a
// subscription to the slot, its origin advanced to R; the window: writes
// refused on the old cluster, every slot confirmed at its current LSN,
// sequences copied, catalogs compared. Any failure, timeout or interrupt
// gives writes back and removes what the run created on both sides (slots,
// publications, subscriptions, the new cluster).
//
// logical owns the logical-replication path of `pgfork upgrade --logical`;
// copying is pgclone's, pg_upgrade is package upgrade's.
package logical

import (
	"context"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"golang.org/x/sync/errgroup"

	"github.com/pgfork/pgfork/clone"
	"github.com/pgfork/pgfork/dbclone"
	"github.com/pgfork/pgfork/instance"
	"github.com/pgfork/pgfork/internal/errs"
	"github.com/pgfork/pgfork/pgbin"
	"github.com/pgfork/pgfork/pgclone"
	"github.com/pgfork/pgfork/pgdata"
	"github.com/pgfork/pgfork/upgrade"
)

// Names of what a run creates. The logical slots are named per database
// OID (slots are cluster-wide); publications and subscriptions are per
// database.
const (
	pubName  = "pgfork_upgrade"
	subName  = "pgfork_upgrade"
	physSlot = "pgfork_upgrade_clone"
	slotPfx  = "pgfork_upgrade_"
)

// Phases of a logical upgrade, in order (pg_upgrade's own phases come
// between PhaseRecover and PhaseSubscribe).
const (
	PhasePreflight = "preflight" // checks on the old cluster, nothing created yet
	PhasePublish   = "publish"   // checkpoint, publications, physical slot
	PhaseClone     = "clone"     // online reflink clone
	PhaseSlots     = "slots"     // logical slots; R
	PhaseRecover   = "recover"   // the clone recovers to just before R and promotes
	PhaseSubscribe = "subscribe" // subscriptions from R, statistics
	PhaseCatchUp   = "catch-up"  // the new cluster follows the old one
	PhaseWindow    = "window"    // writes refused, drained, sequences, checks
	PhaseCleanup   = "cleanup"   // subscriptions, slots, publications dropped
)

// Options describe a logical upgrade.
type Options struct {
	OldDir, NewDir string
	Old, New       upgrade.Install
	// Jobs for pg_upgrade; default 1.
	Jobs int
	// Superuser connects to the old cluster (default: postgres, the data
	// directory's owner, $USER, the first that connects).
	Superuser string
	// User runs PostgreSQL (nil: the current user).
	User *instance.OSUser
	// Window bounds the write pause: from refusing writes to the checks'
	// end. Default 10 s. On expiry writes are given back and the run rolls
	// back.
	Window time.Duration
	// CatchUp bounds the wait for the new cluster to follow the old one
	// before the window. Default 10 minutes.
	CatchUp time.Duration
	// MaxXactAge refuses the run when a session's transaction holding an
	// xid is older (creating a logical slot waits for every such
	// transaction to end). Default 1 minute.
	MaxXactAge time.Duration
	// HandOver ends the window by stopping the old cluster and starting
	// the new one at its address (port, sockets, authentication: see
	// upgrade.ReadHandOver). Without it the old cluster is left running
	// read-only and the new one on a private socket.
	HandOver bool
	// OnEvent receives progress; nil for none.
	OnEvent func(upgrade.Event)
}

// Result describes a finished logical upgrade.
type Result struct {
	OldDir     string   `json:"old_dir"`
	NewDir     string   `json:"new_dir"`
	OldVersion string   `json:"old_version"`
	NewVersion string   `json:"new_version"`
	Databases  []string `json:"databases"`
	// R is the LSN the clone stopped before and replication started at.
	R string `json:"r"`
	// Upgrade is pg_upgrade's run on the clone.
	Upgrade *upgrade.Result `json:"upgrade"`
	// Window is how long writes were refused on the old cluster (with
	// the hand-over: until the new cluster accepted connections at its
	// address).
	Window time.Duration `json:"window_ns"`
	// WindowSteps times the window's steps.
	WindowSteps []upgrade.PhaseTime `json:"window_steps"`
	// HandedOver: the old cluster was stopped and the new one serves at
	// its address.
	HandedOver bool `json:"handed_over"`
	// Sequences copied in the window (those that moved since the copy
	// made just before it).
	Sequences int `json:"sequences"`
	// WALScan: which databases wrote after R was read from the old
	// cluster's WAL (pg_walinspect), and only those were subscribed;
	// without it every database was.
	WALScan bool `json:"wal_scan"`
	// Subscribed are the databases that got a subscription (an apply
	// worker on the new cluster, a WAL sender on the old one), in the
	// order they got it; SubscribedInWindow those of them that the window's
	// final scan found written only then.
	Subscribed         []string `json:"subscribed"`
	SubscribedInWindow []string `json:"subscribed_in_window,omitempty"`
	// Port and SocketDir: where the new cluster runs (without the
	// hand-over: socket only, a private directory, initdb's
	// authentication).
	Port      int    `json:"port"`
	SocketDir string `json:"socket_dir"`
	// Phases times the run's phases.
	Phases  []upgrade.PhaseTime `json:"phases"`
	Elapsed time.Duration       `json:"elapsed_ns"`
	Notes   []string            `json:"notes,omitempty"`
	// CleanedUp says what was cleaned up after an earlier run that was
	// killed.
	CleanedUp []string `json:"cleaned_up,omitempty"`
}

// database is one database the run replicates.
type database struct {
	name string
	oid  uint32
	slot string
	lsn  pgdata.LSN
	old  *pgx.Conn // to the old cluster, opened before the window
	new  *pgx.Conn // to the new cluster
	// catalog is what the last comparison found on both sides (catalogOf).
	catalog string
	// seqs are the sequence values last copied to the new cluster, by
	// schema and name (NUL between).
	seqs map[string]int64
	// what the run created for it
	pub, slotMade, sub bool
	// unloggedSeqs: it has unlogged sequences, which move without WAL; it
	// is subscribed whatever the WAL scan finds.
	unloggedSeqs bool
}

// run is the state of one logical upgrade.
type run struct {
	o        Options
	res      *Result
	t0       time.Time
	oldHost  string
	oldPort  int
	su       string
	ctl      *pgdata.ControlData
	control  *pgx.Conn // old cluster, template1
	dbs      []*database
	phys     bool   // physical slot created
	readOnly bool   // default_transaction_read_only set on the old cluster
	cloneDir string // the clone, while it exists
	newInst  *instance.Instance
	newMade  bool // NewDir was created by this run
	ownPIDs  []uint32
	// ho is what the hand-over carries; oldOpts the old server's command
	// line, to start it again; oldStopped: the hand-over stopped it.
	ho         *upgrade.HandOver
	oldOpts    string
	oldStopped bool
	// clonePath is where the clone goes; handingOver: the hand-over began.
	clonePath   string
	handingOver bool
	// saved: this run wrote the state file (only then may it remove it).
	saved bool
	// oldCarries: the hand-over is done and the stopped old cluster still
	// carries the run's slots and publications (cleanOld drops them);
	// oldOptsRaw is its postmaster.opts as it ran; appHost and appPort its
	// address (oldHost and oldPort are where pgfork reaches it, a private
	// socket during cleanOld); oldSettings what its command line set.
	oldCarries  bool
	oldOptsRaw  string
	oldSettings map[string]string
	appHost     string
	appPort     int
	// watch follows the apply workers' errors on the new cluster.
	watch applyWatch
	// scan finds the databases written after R (walscan.go).
	scan walScan
}

func (r *run) emit(e upgrade.Event) {
	if r.o.OnEvent != nil {
		r.o.OnEvent(e)
	}
}

func (r *run) infof(phase, format string, args ...any) {
	r.emit(upgrade.Event{Phase: phase, Message: fmt.Sprintf(format, args...)})
}

func (r *run) phase(name string, fn func() error) error {
	r.emit(upgrade.Event{Phase: name})
	t := time.Now()
	err := fn()
	r.res.Phases = append(r.res.Phases, upgrade.PhaseTime{Name: name, Elapsed: time.Since(t)})
	status := "ok"
	if err != nil {
		status = "failed"
	}
	r.emit(upgrade.Event{Phase: name, Done: true, Status: status})
	return err
}

// Run upgrades the running cluster in o.OldDir into o.NewDir with
// pg_upgrade on a clone and logical replication for the difference. On
// any error the old cluster is left serving and what the run created is
// removed.
func Run(ctx context.Context, o Options) (*Result, error) {
	if o.Jobs < 1 {
		o.Jobs = 1
	}
	if o.Window <= 0 {
		o.Window = 10 * time.Second
	}
	if o.CatchUp <= 0 {
		o.CatchUp = 10 * time.Minute
	}
	if o.MaxXactAge <= 0 {
		o.MaxXactAge = time.Minute
	}
	for _, p := range []*string{&o.OldDir, &o.NewDir} {
		if *p == "" {
			return nil, errs.New(errs.Usage, "a data directory is missing").WithCLI("see `pgfork upgrade --help`")
		}
		a, err := filepath.Abs(*p)
		if err != nil {
			return nil, errs.Wrap(errs.Usage, err, "bad data directory").WithPath(*p)
		}
		*p = a
	}
	r := &run{o: o, t0: time.Now(), res: &Result{OldDir: o.OldDir, NewDir: o.NewDir, OldVersion: o.Old.Version, NewVersion: o.New.Version},
		clonePath: filepath.Join(filepath.Dir(o.OldDir), fmt.Sprintf(".%s.pgfork-logical-%d", filepath.Base(o.OldDir), os.Getpid()))}
	err := r.run(ctx)
	if err != nil {
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Minute)
		left := r.rollback(cctx)
		cancel()
		if left == "" {
			r.forget()
		}
		if ctx.Err() != nil {
			e := errs.Wrap(errs.Interrupted, err, "interrupted: the old cluster serves (writes allowed)%s", left)
			if left == "" {
				e = e.WithHint("nothing of the run is left on either cluster; run again when you like")
			}
			err = e
		} else if left != "" {
			err = errs.Wrap(errs.KindOf(err), err, "%s", strings.TrimPrefix(left, "; ")).WithHint("%s", errs.HintOf(err))
		}
		r.closeAll()
		return nil, err
	}
	r.closeAll()
	if !r.oldCarries {
		r.forget()
	}
	r.res.Elapsed = time.Since(r.t0)
	return r.res, nil
}

func (r *run) closeAll() {
	for _, d := range r.dbs {
		if d.old != nil {
			_ = d.old.Close(context.Background())
		}
		if d.new != nil {
			_ = d.new.Close(context.Background())
		}
	}
	if r.control != nil {
		_ = r.control.Close(context.Background())
	}
}

func (r *run) run(ctx context.Context) error {
	o := r.o
	did, err := r.cleanKilled(ctx)
	if err != nil {
		return err
	}
	if len(did) > 0 {
		r.res.CleanedUp = did
		r.infof(PhasePreflight, "cleaned up after an earlier run that was killed: %s", strings.Join(did, "; "))
	}
	if _, err := os.Lstat(o.NewDir); err == nil {
		return errs.New(errs.Exists, "new data directory already exists").WithPath(o.NewDir).
			WithHint("choose a path that does not exist yet (pgfork creates it)")
	}
	if err := r.phase(PhasePreflight, func() error {
		if err := r.preflight(ctx); err != nil {
			return err
		}
		if o.HandOver {
			if err := r.readHandOver(ctx); err != nil {
				return err
			}
		}
		return r.save()
	}); err != nil {
		return err
	}
	if err := r.phase(PhasePublish, func() error { return r.publish(ctx) }); err != nil {
		return err
	}
	if err := r.phase(PhaseClone, func() error { return r.clone(ctx) }); err != nil {
		return err
	}
	var R pgdata.LSN
	if err := r.phase(PhaseSlots, func() error {
		// Each slot waits for the transactions running when it is created.
		sctx, cancel := context.WithTimeout(ctx, slotTimeout)
		defer cancel()
		var err error
		if R, err = r.slots(sctx); err != nil && sctx.Err() != nil && ctx.Err() == nil {
			return errs.New(errs.Busy, "creating the logical slots took longer than %s: they wait for running transactions to end%s", slotTimeout, r.longXacts(ctx, 0)).
				WithHint("end or wait for the long transactions, then run again")
		}
		return err
	}); err != nil {
		return err
	}
	r.res.R = R.String()
	if err := r.phase(PhaseRecover, func() error { return r.recoverClone(ctx, R) }); err != nil {
		return err
	}
	r.newMade = true
	if err := r.save(); err != nil {
		return err
	}
	up, err := upgrade.Run(ctx, upgrade.Options{
		OldDir: r.cloneDir, NewDir: o.NewDir, Old: o.Old, New: o.New, Mode: upgrade.Clone,
		Jobs: o.Jobs, Rehearse: upgrade.RehearseOff, Superuser: r.su, NoAnalyze: true,
		User: o.User, OnEvent: o.OnEvent,
	})
	if err != nil {
		return errs.Wrap(errs.KindOf(err), err, "pg_upgrade of the clone failed; the old cluster was not touched").WithHint("%s", errs.HintOf(err))
	}
	r.res.Upgrade = up
	r.res.Phases = append(r.res.Phases, up.Phases...)
	r.removeClone()
	if err := r.phase(PhaseSubscribe, func() error { return r.subscribe(ctx, R) }); err != nil {
		return err
	}
	if err := r.phase(PhaseCatchUp, func() error { return r.catchUp(ctx) }); err != nil {
		return err
	}
	if err := r.phase(PhaseWindow, func() error { return r.window(ctx) }); err != nil {
		return err
	}
	if r.res.HandedOver {
		_ = r.phase(PhaseCleanup, func() error {
			cctx := context.WithoutCancel(ctx)
			if left := r.dropSubscriptions(cctx); left != "" {
				r.res.Notes = append(r.res.Notes, "left behind"+left)
			}
			// Out of the window: the old side's slots and publications, on
			// a private start of the old cluster. Until they are gone the
			// state file says so, and the next run drops them.
			if left := r.cleanOld(cctx); left != "" {
				r.res.Notes = append(r.res.Notes, "left behind"+left+
					"; the old cluster is stopped: the next run of this upgrade (same data directories) drops them, as does its rollback")
			} else {
				r.oldCarries = false
			}
			return nil
		})
		r.res.Notes = append(r.res.Notes,
			fmt.Sprintf("the new cluster serves at the old one's address (port %d), started with its own configuration; its log is %s; carry over your other settings from %s",
				r.res.Port, filepath.Join(o.NewDir, instance.LogFileName), o.OldDir),
			"the old cluster is stopped, intact and read-only (default_transaction_read_only = on in its postgresql.auto.conf): to roll back, stop the new cluster, start the old one and run ALTER SYSTEM RESET default_transaction_read_only; SELECT pg_reload_conf(); (writes made on the new cluster are not on it)")
		return nil
	}
	_ = r.phase(PhaseCleanup, func() error {
		if left := r.dropReplication(context.WithoutCancel(ctx)); left != "" {
			r.res.Notes = append(r.res.Notes, "left behind"+left)
		}
		return nil
	})
	r.res.Port, r.res.SocketDir = r.newInst.Port, r.newInst.SocketDir
	r.res.Notes = append(r.res.Notes,
		"the old cluster is intact and read-only (ALTER SYSTEM SET default_transaction_read_only = on): to roll back, run ALTER SYSTEM RESET default_transaction_read_only; SELECT pg_reload_conf(); on it (writes made there afterwards are not on the new cluster)",
		fmt.Sprintf("the new cluster runs on its own socket %s, port %d, with initdb's authentication: to switch the application to it, stop the old cluster and restart the new one with the old one's port, sockets and pg_hba.conf", r.newInst.SocketDir, r.newInst.Port))
	return nil
}

// slotTimeout bounds the creation of the logical slots.
const slotTimeout = 5 * time.Minute

// longXacts names the old cluster's sessions whose transaction holds an
// xid and began more than age ago (": pid N (user, database, state, for
// D), ..."), or "" when there is none.
func (r *run) longXacts(ctx context.Context, age time.Duration) string {
	rows, err := r.control.Query(ctx, `SELECT format('pid %s (%s, database %s, %s, for %s)', pid, usename, datname, state,
			date_trunc('second', now() - xact_start)) FROM pg_stat_activity
		WHERE backend_xid IS NOT NULL AND xact_start < now() - make_interval(secs => $1) AND pid <> pg_backend_pid()
		ORDER BY xact_start LIMIT 10`, age.Seconds())
	if err != nil {
		return ""
	}
	s, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil || len(s) == 0 {
		return ""
	}
	return ": " + strings.Join(s, ", ")
}

// oldURL is a connection URL to database db of the old cluster, with
// default_transaction_read_only off for pgfork's own sessions.
func (r *run) oldURL(db, app string) string {
	u := url.URL{Scheme: "postgresql", User: url.User(r.su), Path: "/" + db}
	q := url.Values{}
	q.Set("host", r.oldHost)
	q.Set("port", strconv.Itoa(r.oldPort))
	q.Set("application_name", app)
	q.Set("default_transaction_read_only", "off")
	u.RawQuery = q.Encode()
	return u.String()
}

// conninfo is a libpq key=value connection string to database db of the
// old cluster (for primary_conninfo and subscriptions).
func (r *run) conninfo(db, app string) string {
	ps := []pgdata.ConnParam{{Key: "host", Value: r.oldHost}, {Key: "port", Value: strconv.Itoa(r.oldPort)},
		{Key: "user", Value: r.su}, {Key: "application_name", Value: app}}
	if db != "" {
		ps = append(ps, pgdata.ConnParam{Key: "dbname", Value: db})
	}
	return pgdata.FormatConninfo(ps)
}

// superuserCandidates are the roles tried to connect to the old cluster.
func superuserCandidates(explicit, dataDir string) []string {
	if explicit != "" {
		return []string{explicit}
	}
	c := []string{"postgres"}
	if u, err := instance.OwnerOf(dataDir); err == nil && u != nil && u.Name != "" && u.Name != "postgres" {
		c = append(c, u.Name)
	}
	if n := os.Getenv("USER"); n != "" && !slices.Contains(c, n) && n != "root" {
		c = append(c, n)
	}
	return c
}

// connectOld opens the control connection to the running old cluster.
func (r *run) connectOld(ctx context.Context) error {
	pf, err := instance.ReadPidFile(r.o.OldDir)
	if err != nil {
		return errs.Wrap(errs.NotFound, err, "cannot read the old cluster's postmaster.pid").WithPath(r.o.OldDir).
			WithHint("an upgrade by logical replication needs the old cluster running: start it, or upgrade it stopped").WithCLI("or run without --logical")
	}
	r.oldHost, r.oldPort = pf.SocketDir, pf.Port
	if r.oldHost == "" {
		return errs.New(errs.Unsupported, "the old cluster has no Unix socket").WithPath(r.o.OldDir).
			WithHint("the upgrade connects to the old cluster through its socket: set unix_socket_directories")
	}
	var last error
	for _, su := range superuserCandidates(r.o.Superuser, r.o.OldDir) {
		r.su = su
		conn, err := pgx.Connect(ctx, r.oldURL("template1", "pgfork upgrade"))
		if err == nil {
			var super bool
			if err := conn.QueryRow(ctx, `SELECT rolsuper FROM pg_roles WHERE rolname = current_user`).Scan(&super); err != nil || !super {
				_ = conn.Close(ctx)
				last = fmt.Errorf("role %s is not a superuser", su)
				continue
			}
			r.control = conn
			r.ownPIDs = append(r.ownPIDs, conn.PgConn().PID())
			return nil
		}
		last = err
	}
	return dbclone.SQLError(ctx, last, "cannot connect to the old cluster as a superuser").
		WithHint("name a superuser that may connect through the socket %s", r.oldHost).WithCLI("pass --superuser NAME")
}

// openOld opens a connection to every database of the old cluster.
func (r *run) openOld(ctx context.Context) error {
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(4)
	var mu sync.Mutex
	for _, d := range r.dbs {
		g.Go(func() error {
			conn, err := pgx.Connect(gctx, r.oldURL(d.name, "pgfork upgrade"))
			if err != nil {
				return errs.Wrap(errs.Internal, err, "cannot connect to database %q of the old cluster", d.name)
			}
			d.old = conn
			mu.Lock()
			r.ownPIDs = append(r.ownPIDs, conn.PgConn().PID())
			mu.Unlock()
			return nil
		})
	}
	return g.Wait()
}

// each runs fn on every database, a few at a time.
func (r *run) each(ctx context.Context, limit int, fn func(context.Context, *database) error) error {
	return eachOf(ctx, r.dbs, limit, fn)
}

// publish checkpoints the old cluster (so that the clone's backup start
// does not wait for one inside the timed steps), creates a publication in
// every database and the physical slot that keeps the clone's WAL.
func (r *run) publish(ctx context.Context) error {
	if _, err := r.control.Exec(ctx, "CHECKPOINT"); err != nil {
		return errs.Wrap(errs.Internal, err, "checkpoint on the old cluster")
	}
	if err := r.each(ctx, 4, func(ctx context.Context, d *database) error {
		if _, err := d.old.Exec(ctx, "CREATE PUBLICATION "+pgx.Identifier{pubName}.Sanitize()+" FOR ALL TABLES"); err != nil {
			return errs.Wrap(errs.Internal, err, "cannot create the publication in database %q of the old cluster", d.name)
		}
		d.pub = true
		return nil
	}); err != nil {
		return err
	}
	if _, err := r.control.Exec(ctx, "SELECT pg_create_physical_replication_slot($1, true)", physSlot); err != nil {
		return errs.Wrap(errs.Internal, err, "cannot create the physical slot for the clone")
	}
	r.phys = true
	return nil
}

// clone makes the online reflink clone beside the old cluster.
func (r *run) clone(ctx context.Context) error {
	o := r.o
	r.cloneDir = r.clonePath
	_, err := pgclone.Clone(ctx, pgclone.Options{
		Src: o.OldDir, Dst: r.cloneDir, Online: true, ConnString: r.oldURL("postgres", "pgfork upgrade clone"),
		Label:        "pgfork upgrade --logical",
		Installation: pgbin.Installation{BinDir: o.Old.BinDir, Version: o.Old.Version, Major: o.Old.Major},
		Method:       clone.Clone, Jobs: o.Jobs, Sync: clone.SyncNone, User: o.User,
	})
	if err != nil {
		if _, serr := os.Lstat(r.cloneDir); serr != nil {
			r.cloneDir = ""
		}
		return errs.Wrap(errs.KindOf(err), err, "cannot clone the running old cluster").
			WithHint("an upgrade by logical replication needs the old cluster on a filesystem that clones files (XFS with reflink, btrfs): %s", errs.HintOf(err))
	}
	return nil
}

// slots creates a logical slot in every database and returns R, the
// latest slot's LSN, then writes a WAL record past it so that the clone's
// recovery can stop before R.
func (r *run) slots(ctx context.Context) (pgdata.LSN, error) {
	var R pgdata.LSN
	var mu sync.Mutex
	err := r.each(ctx, 4, func(ctx context.Context, d *database) error {
		var lsn string
		if err := d.old.QueryRow(ctx, "SELECT lsn::text FROM pg_create_logical_replication_slot($1, 'pgoutput')", d.slot).Scan(&lsn); err != nil {
			return errs.Wrap(errs.Internal, err, "cannot create the logical slot of database %q on the old cluster", d.name).
				WithHint("creating a slot waits for running transactions to end: look for long or idle-in-transaction sessions")
		}
		l, err := pgdata.ParseLSN(lsn)
		if err != nil {
			return errs.Wrap(errs.Internal, err, "bad LSN %q", lsn)
		}
		mu.Lock()
		d.slotMade, d.lsn = true, l
		if l > R {
			R = l
		}
		mu.Unlock()
		return nil
	})
	if err != nil {
		return 0, err
	}
	// The WAL scans start at the earliest restart_lsn of the run's slots:
	// a transaction running at R began after the slot consistent at R
	// started (snapbuild), whose restart_lsn is no earlier; the slots keep
	// that WAL.
	var l0 string
	if err := r.control.QueryRow(ctx, `SELECT coalesce(min(restart_lsn), $1::pg_lsn)::text FROM pg_replication_slots WHERE slot_name LIKE 'pgfork\_upgrade\_%' AND slot_type = 'logical'`, R.String()).Scan(&l0); err != nil {
		return 0, errs.Wrap(errs.Internal, err, "cannot read the logical slots' restart positions")
	}
	if r.scan.from, err = pgdata.ParseLSN(l0); err != nil {
		return 0, errs.Wrap(errs.Internal, err, "bad LSN %q", l0)
	}
	r.scan.R = R
	// A transactional message commits, and the commit is flushed: a record
	// after R the standby receives.
	if _, err := r.control.Exec(ctx, "SELECT pg_logical_emit_message(true, 'pgfork', 'upgrade --logical: R')"); err != nil {
		return 0, errs.Wrap(errs.Internal, err, "cannot write a WAL record after R")
	}
	r.infof(PhaseSlots, "%d logical slots; R = %s", len(r.dbs), R)
	return R, nil
}

// recoverClone starts the clone as a standby of the old cluster that stops
// just before R (recovery_target_inclusive off: decoding from R skips every
// transaction whose commit record starts before R) and promotes, then stops
// it cleanly for pg_upgrade.
func (r *run) recoverClone(ctx context.Context, R pgdata.LSN) error {
	o := r.o
	if err := instance.WriteFileAs(filepath.Join(r.cloneDir, "standby.signal"), o.User, nil); err != nil {
		return errs.FromOS(err, r.cloneDir, "cannot write standby.signal into the clone")
	}
	settings := upgrade.RecoverySettings(r.ctl)
	for k, v := range map[string]string{
		"primary_conninfo":          r.conninfo("", "pgfork_upgrade_clone"),
		"primary_slot_name":         physSlot,
		"recovery_target_lsn":       R.String(),
		"recovery_target_inclusive": "off",
		"recovery_target_action":    "promote",
		"recovery_init_sync_method": "syncfs",
		"hot_standby":               "on",
		"archive_mode":              "off",
	} {
		settings[k] = v
	}
	inst, err := instance.Start(ctx, instance.Config{BinDir: o.Old.BinDir, Env: o.Old.Env, DataDir: r.cloneDir, User: o.User,
		Settings: settings, LogFile: filepath.Join(r.cloneDir, "pgfork-recovery.log"), StartTimeout: 30 * time.Minute})
	if err != nil {
		return errs.Wrap(errs.KindOf(err), err, "the clone did not start to recover to R")
	}
	defer func() { _ = inst.Stop(context.WithoutCancel(ctx), instance.Fast) }()
	conn, err := pgx.Connect(ctx, inst.ConnString(r.su, "postgres"))
	if err != nil {
		return errs.Wrap(errs.Internal, err, "cannot connect to the recovering clone")
	}
	defer conn.Close(context.Background())
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	deadline := time.After(recoverTimeout)
	for {
		var rec bool
		if err := conn.QueryRow(ctx, "SELECT pg_is_in_recovery()").Scan(&rec); err != nil {
			return errs.Wrap(errs.Internal, err, "the clone failed while recovering to R").WithHint("its log: %s", inst.LogFile)
		}
		if !rec {
			break
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-deadline:
			return errs.New(errs.Internal, "the clone did not reach R within %s", recoverTimeout).
				WithHint("its log %s says why (does it receive WAL from the old cluster?)", inst.LogFile)
		case <-tick.C:
		}
	}
	_ = conn.Close(ctx)
	if err := inst.Stop(ctx, instance.Fast); err != nil {
		return errs.Wrap(errs.Internal, err, "cannot stop the recovered clone")
	}
	if _, err := r.control.Exec(ctx, "SELECT pg_drop_replication_slot($1)", physSlot); err == nil {
		r.phys = false
	}
	return nil
}

// recoverTimeout bounds the clone's recovery to R: the WAL from its
// backup to R, streamed from the old cluster.
const recoverTimeout = 30 * time.Minute

// removeClone deletes the clone (the new cluster shares its extents).
func (r *run) removeClone() {
	if r.cloneDir == "" {
		return
	}
	_ = os.RemoveAll(r.cloneDir)
	_ = os.RemoveAll(pgclone.TablespaceDir(r.cloneDir))
	r.cloneDir = ""
}

// subscribe starts the new cluster and subscribes every database to its
// slot from R, then analyzes it while it catches up.
func (r *run) subscribe(ctx context.Context, R pgdata.LSN) error {
	o := r.o
	n := len(r.dbs)
	settings := map[string]string{
		"max_logical_replication_workers": strconv.Itoa(n + 2),
		"max_worker_processes":            strconv.Itoa(n + 10),
		"max_replication_slots":           strconv.Itoa(n + 2),
		// pgfork holds a connection to every database of the new cluster.
		"max_connections": strconv.Itoa(max(100, n+20)),
		// Apply commits asynchronously and the slots confirm what the new
		// cluster flushed: flush often, so that the window's wait for the
		// last commit is not the WAL writer's default 200 ms.
		"wal_writer_delay": "10ms",
		// Nothing but the apply writes to it before the hand-over:
		// autovacuum's work would only be written again by the shutdown
		// checkpoint inside the window (its own configuration turns it on
		// again at the start at the old address).
		"autovacuum": "off",
		// Its apply workers' errors are read back from its log (applyErrors).
		"log_line_prefix":   newLogLinePrefix,
		"lc_messages":       "C",
		"logging_collector": "off",
		"log_destination":   "stderr",
	}
	if o.New.Major >= 18 {
		settings["max_active_replication_origins"] = strconv.Itoa(n + 2)
	}
	inst, err := instance.Start(ctx, instance.Config{BinDir: o.New.BinDir, Env: o.New.Env, DataDir: o.NewDir, User: o.User, Settings: settings})
	if err != nil {
		return errs.Wrap(errs.KindOf(err), err, "the upgraded cluster does not start")
	}
	r.newInst = inst
	if r.ho != nil {
		if err := r.carry(ctx); err != nil {
			return err
		}
	}
	// Only the databases written after R get a subscription (walscan.go);
	// without pg_walinspect, every database.
	writers := r.dbs
	if r.scan.ok {
		found, err := r.scanWAL(ctx)
		if err != nil {
			r.infof(PhaseSubscribe, "the WAL scan failed, so every database is subscribed: %v", err)
			r.scan.ok = false
		} else {
			for _, d := range r.dbs {
				if d.unloggedSeqs && !slices.Contains(found, d) {
					found = append(found, d)
				}
			}
			writers = found
			r.infof(PhaseSubscribe, "the WAL since R names %d of %d databases as written: only those are subscribed (%s)", len(found), len(r.dbs), names(found))
		}
	} else {
		r.infof(PhaseSubscribe, "pg_walinspect is not available on the old cluster: every database is subscribed (%d)", len(r.dbs))
	}
	r.res.WALScan = r.scan.ok
	if err := r.checkSenders(ctx, len(writers)); err != nil {
		return err
	}
	if err := r.subscribeDBs(ctx, writers, R); err != nil {
		return err
	}
	// Every database: the publication that came with the clone dropped,
	// statistics. The connections of those not subscribed are closed (but
	// the first's: shared catalogs are read through it).
	return r.each(ctx, 4, func(ctx context.Context, d *database) error {
		if err := r.openNew(ctx, d); err != nil {
			return err
		}
		if _, err := d.new.Exec(ctx, "ANALYZE"); err != nil {
			return errs.Wrap(errs.Internal, err, "cannot analyze database %q of the new cluster", d.name)
		}
		if !d.sub && d != r.dbs[0] {
			_ = d.new.Close(ctx)
			d.new = nil
		}
		return nil
	})
}

// eachOf runs fn on every database of dbs, a few at a time.
func eachOf(ctx context.Context, dbs []*database, limit int, fn func(context.Context, *database) error) error {
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(limit)
	for _, d := range dbs {
		g.Go(func() error { return fn(gctx, d) })
	}
	return g.Wait()
}

// openNew connects to database d of the new cluster (where it has no
// connection yet) and drops the publication that came with the clone.
func (r *run) openNew(ctx context.Context, d *database) error {
	if d.new != nil && !d.new.IsClosed() {
		return nil
	}
	conn, err := pgx.Connect(ctx, r.newInst.ConnString(r.su, d.name))
	if err != nil {
		return errs.Wrap(errs.Internal, err, "cannot connect to database %q of the new cluster", d.name)
	}
	d.new = conn
	// What this session commits needs no flush of its own: the run
	// fails if the new cluster crashes, and its stop checkpoints. The
	// window's statements then do not wait for a WAL flush each.
	if _, err := conn.Exec(ctx, "SET synchronous_commit = off"); err != nil {
		return errs.Wrap(errs.Internal, err, "database %q of the new cluster", d.name)
	}
	// The publication came along with the clone.
	if _, err := conn.Exec(ctx, "DROP PUBLICATION IF EXISTS "+pgx.Identifier{pubName}.Sanitize()); err != nil {
		return errs.Wrap(errs.Internal, err, "database %q of the new cluster", d.name)
	}
	return nil
}

// subscribeDBs subscribes each database of dbs to its slot from R, a few
// at a time: its catalogs compared on both sides, the subscription created
// disabled, its origin advanced to R, enabled.
func (r *run) subscribeDBs(ctx context.Context, dbs []*database, R pgdata.LSN) error {
	err := eachOf(ctx, dbs, 4, func(ctx context.Context, d *database) error {
		if err := r.openNew(ctx, d); err != nil {
			return err
		}
		if d.old == nil || d.old.IsClosed() {
			// Closed at the catch-up's end (a database the window's final
			// scan found written); the window ended the other sessions
			// before, so this one needs no place in ownPIDs.
			c, err := pgx.Connect(ctx, r.oldURL(d.name, "pgfork upgrade"))
			if err != nil {
				return errs.Wrap(errs.Internal, err, "cannot connect to database %q of the old cluster", d.name)
			}
			d.old = c
		}
		conn := d.new
		sub := pgx.Identifier{subName}.Sanitize()
		// DDL after R: a table the new cluster lacks fails the subscription.
		if same, err := sameCatalog(ctx, d); err != nil || !same {
			if err == nil {
				err = driftError(d.name)
			}
			return err
		}
		if _, err := conn.Exec(ctx, "CREATE SUBSCRIPTION "+sub+" CONNECTION "+upgrade.QuoteLiteral(r.conninfo(d.name, d.slot))+
			" PUBLICATION "+pgx.Identifier{pubName}.Sanitize()+" WITH (create_slot = false, slot_name = "+upgrade.QuoteLiteral(d.slot)+
			", copy_data = false, enabled = false)"); err != nil {
			return errs.Wrap(errs.Internal, err, "cannot create the subscription of database %q", d.name)
		}
		d.sub = true
		// pg_subscription is shared: filter on this database.
		var origin string
		if err := conn.QueryRow(ctx, `SELECT 'pg_' || oid FROM pg_subscription
			WHERE subname = $1 AND subdbid = (SELECT oid FROM pg_database WHERE datname = current_database())`, subName).Scan(&origin); err != nil {
			return errs.Wrap(errs.Internal, err, "cannot find the subscription of database %q", d.name)
		}
		if _, err := conn.Exec(ctx, "SELECT pg_replication_origin_advance($1, $2::pg_lsn)", origin, R.String()); err != nil {
			return errs.Wrap(errs.Internal, err, "cannot advance the subscription of database %q to R", d.name)
		}
		if _, err := conn.Exec(ctx, "ALTER SUBSCRIPTION "+sub+" ENABLE"); err != nil {
			return errs.Wrap(errs.Internal, err, "cannot enable the subscription of database %q", d.name)
		}
		return nil
	})
	for _, d := range dbs {
		if d.sub && !slices.Contains(r.res.Subscribed, d.name) {
			r.res.Subscribed = append(r.res.Subscribed, d.name)
		}
	}
	return err
}
