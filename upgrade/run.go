package upgrade

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgfork/pgfork/clone"
	"github.com/pgfork/pgfork/instance"
	"github.com/pgfork/pgfork/internal/errs"
	"github.com/pgfork/pgfork/internal/fsutil"
	"github.com/pgfork/pgfork/internal/units"
	"github.com/pgfork/pgfork/pgdata"
)

// Tablespace is one tablespace of the old cluster.
type Tablespace struct {
	OID      string `json:"oid"`
	Location string `json:"location"` // the pg_tblspc link's target
	// VersionDir is the old cluster's PG_<major>_<catversion> in Location.
	VersionDir string `json:"version_dir"`
}

// oldTablespaces lists the old cluster's linked tablespaces.
func oldTablespaces(oldDir string, major int) ([]Tablespace, error) {
	tss, err := pgdata.Tablespaces(oldDir)
	if err != nil {
		return nil, err
	}
	var out []Tablespace
	for _, t := range tss {
		if t.InPlace || t.Target == "" {
			continue
		}
		ts := Tablespace{OID: t.OID, Location: t.Target}
		ents, err := os.ReadDir(t.Target)
		if err != nil {
			return nil, errs.Wrap(errs.NotFound, err, "tablespace %s points to a directory that cannot be read", t.OID).WithPath(t.Target).
				WithHint("restore the tablespace directory or fix the link pg_tblspc/%s", t.OID)
		}
		for _, e := range ents {
			if strings.HasPrefix(e.Name(), fmt.Sprintf("PG_%d_", major)) {
				ts.VersionDir = e.Name()
			}
		}
		if ts.VersionDir == "" {
			return nil, errs.New(errs.Internal, "tablespace %s has no PG_%d_* directory", t.OID, major).WithPath(t.Target)
		}
		out = append(out, ts)
	}
	return out, nil
}

// prepared is what the prepare phase found.
type prepared struct {
	oldMajor int
	ctl      *pgdata.ControlData
	tss      []Tablespace
	fs       *fsInfo
	sizes    oldSizes
	rehearse bool
	// online: the old cluster runs; the rehearsal works on an online
	// clone and the old cluster is stopped after it.
	online bool
	// cloneStart is when the rehearsal began to clone the old cluster.
	cloneStart time.Time
	// recheck: the catalogs changed after the rehearsal; pg_upgrade
	// --check runs again before the real upgrade.
	recheck   bool
	totalData int64 // apparent bytes of user data to transfer (for progress)
}

func (u *upgrader) run(ctx context.Context) (*Result, error) {
	o, res := u.o, u.res
	var p *prepared
	err := u.phase(PhasePrepare, &res.Phases, func() error {
		var err error
		p, err = u.prepare(ctx)
		return err
	})
	if u.work != nil {
		defer func() {
			// On any failure below that did not handle its own cleanup,
			// leave nothing half-built behind.
			if u.work != nil {
				u.cleanupFailed(ctx)
			}
		}()
	}
	if err != nil {
		return res, err
	}

	cat, done, err := u.catalog(ctx, p)
	if err != nil || done {
		return res, err
	}
	res.Catalog = cat

	if err := u.phase(PhaseInitDB, &res.Phases, func() error { return u.initNew(ctx, p, cat) }); err != nil {
		return res, err
	}

	// pg_upgrade runs the checks of --check as the first part of every run
	// and stops before it changes anything when one fails; pgfork reports
	// those findings the same way. A separate --check run first would only
	// repeat them (seconds, more with many databases), so it runs only
	// when asked (CheckOnly).
	if o.CheckOnly {
		if err := u.phase(PhaseCheck, &res.Phases, func() error { return u.check(ctx, cat) }); err != nil {
			return res, err
		}
		res.CheckOnly = true
		u.finish(ctx)
		return res, nil
	}
	// The catalogs changed after the online rehearsal: what was rehearsed
	// is not quite what is upgraded, so pg_upgrade --check runs first.
	if p.recheck {
		if err := u.phase(PhaseCheck, &res.Phases, func() error { return u.check(ctx, cat) }); err != nil {
			return res, err
		}
		res.Rechecked = true
	}

	// From the transfer on, an interrupt stops the run only while the old
	// cluster can still be started again (see committed); past that the
	// run goes on until the new cluster serves.
	gctx, release := u.commitGuard(ctx)
	defer release()
	if err := u.phase(PhaseUpgrade, &res.Phases, func() error { return u.transfer(gctx, p, cat) }); err != nil {
		return res, err
	}
	hook("transferred")
	// The new cluster is in place; from here on a failure must not remove it.
	var inst *instance.Instance
	if err := u.phase(PhaseStart, &res.Phases, func() error {
		var err error
		inst, err = u.startNew(gctx, cat)
		return err
	}); err != nil {
		u.finish(ctx)
		return res, err
	}
	err = u.finishNew(ctx, gctx, inst, cat)
	u.finish(ctx)
	return res, err
}

// finish removes the workspace of a run that needs nothing more from it.
func (u *upgrader) finish(ctx context.Context) {
	if u.work != nil {
		u.work.remove(ctx)
		u.work = nil
	}
}

// cleanupFailed removes what a failed run built (the staging directory,
// the rehearsal clone, the new tablespace directories) and stops servers it
// left, unless the old cluster's files may be in the staging directory (a
// swap-mode transfer began).
func (u *upgrader) cleanupFailed(ctx context.Context) {
	w := u.work
	u.work = nil
	if w.state.Mode == Swap && w.state.Transferring {
		return
	}
	cctx := context.WithoutCancel(ctx)
	_, _ = cleanStale(cctx, u.o.NewDir)
	_ = os.RemoveAll(w.Tmp)
}

func (u *upgrader) prepare(ctx context.Context) (*prepared, error) {
	o, res := u.o, u.res
	p := &prepared{}
	var err error
	if err := u.refusePlaced(ctx); err != nil {
		return nil, err
	}
	if err := u.checkVersions(p); err != nil {
		return nil, err
	}

	w, cleaned, err := newWorkspace(ctx, o.OldDir, o.NewDir, o.User)
	res.CleanedUp = cleaned
	for _, c := range cleaned {
		u.infof(PhasePrepare, "cleaned up an interrupted upgrade: %s", c)
	}
	if err != nil {
		return nil, err
	}
	u.work = w
	if err := linkDisabled(o.OldDir); err != nil {
		return nil, err
	}

	pid, running, err := pgdata.Running(o.OldDir)
	if err != nil {
		return nil, err
	}
	if running {
		if pf, err := instance.ReadPidFile(o.OldDir); err == nil {
			u.oldPort = pf.Port
		}
	}
	if running && !o.StopOld && o.Rehearse != RehearseOnly {
		return nil, errs.New(errs.Busy, "the old cluster is running (postmaster pid %d)", pid).WithPath(o.OldDir).
			WithHint("let pgfork rehearse on an online clone while it serves and then shut it down cleanly (fast), or stop it first (pg_ctl -D %s stop -m fast)", o.OldDir).
			WithCLI("pass --stop-old to let pgfork stop it after an online rehearsal")
	}
	if p.ctl, err = pgdata.ReadControlData(ctx, o.Old.BinDir, o.OldDir, o.Old.Env); err != nil {
		return nil, err
	}
	res.Control = p.ctl
	if err := u.readOld(ctx, running); err != nil {
		return nil, err
	}
	if p.tss, err = oldTablespaces(o.OldDir, p.oldMajor); err != nil {
		return nil, err
	}
	res.Tablespaces = p.tss
	for _, ts := range p.tss {
		if fsutil.Within(ts.Location, o.NewDir) || fsutil.Within(o.NewDir, ts.Location) {
			return nil, errs.New(errs.Usage, "the new data directory overlaps tablespace %s (%s)", ts.OID, ts.Location).WithPath(o.NewDir).
				WithHint("choose NEW_DATADIR outside the old cluster's tablespace directories")
		}
	}

	if p.fs, err = probeFS(ctx, o.OldDir, o.NewDir); err != nil {
		return nil, err
	}
	mode, why, err := chooseMode(o.Mode, o.New.Major, p.fs)
	if err != nil {
		return nil, err
	}
	res.Mode, res.ModeReason = mode, why
	u.infof(PhasePrepare, "transfer mode: %s (%s)", mode, why)

	switch o.Rehearse {
	case RehearseOn, RehearseOnly:
		p.rehearse = true
	case RehearseAuto:
		p.rehearse = p.fs.oldCanClone && !o.CheckOnly
	}
	if o.CheckOnly {
		p.rehearse = false
	}
	if running {
		if p.rehearse {
			// The rehearsal runs on an online clone while the old cluster
			// serves; it is stopped only once the rehearsal passed.
			p.online = true
			u.infof(PhasePrepare, "the old cluster runs (pid %d): the rehearsal works on an online clone while it serves; it is stopped only after the rehearsal passed", pid)
		} else {
			if err := u.stopOld(ctx, pid); err != nil {
				return nil, err
			}
			if p.ctl, err = pgdata.ReadControlData(ctx, o.Old.BinDir, o.OldDir, o.Old.Env); err != nil {
				return nil, err
			}
			res.Control = p.ctl
		}
	}
	if !p.online && u.down.IsZero() {
		u.down = u.t0 // stopped already: the whole run is downtime
	}

	p.sizes = measureOld(o.OldDir, p.tss)
	p.totalData = p.sizes.userData
	res.Bytes = p.totalData
	if err := u.checkSpace(p, mode); err != nil {
		return nil, err
	}

	if err := u.confirm(mode); err != nil {
		return nil, err
	}
	return p, nil
}

// catalog reads what the upgrade must know of the old cluster's catalogs:
// by a rehearsal on a clone when one runs (recovering a cluster that was
// not shut down cleanly first), else from the old cluster's settings. done
// is true when the run ends with the rehearsal (RehearseOnly).
func (u *upgrader) catalog(ctx context.Context, p *prepared) (cat *Catalog, done bool, err error) {
	o, res := u.o, u.res
	if p.rehearse {
		if !p.online && !p.ctl.CleanShutdown() {
			if o.Rehearse == RehearseOnly {
				return nil, false, errs.New(errs.Busy, "the old cluster was not shut down cleanly (%s); a rehearsal cannot clone it without writing to it", p.ctl.State).
					WithPath(o.OldDir).WithHint("start it and stop it cleanly (pg_ctl -D %s start, then stop -m fast), then rehearse again", o.OldDir)
			}
			if err := u.recoverOld(ctx); err != nil {
				return nil, false, err
			}
		}
		if err := u.phase(PhaseRehearsal, &res.Phases, func() error {
			var err error
			cat, err = u.rehearse(ctx, p)
			return err
		}); err != nil {
			return nil, false, err
		}
		if o.Rehearse == RehearseOnly {
			res.RehearsalOnly = true
			res.Catalog = cat
			u.finish(ctx)
			return cat, true, nil
		}
		if p.online {
			if cat, err = u.stopAfterRehearsal(ctx, p, cat); err != nil {
				return nil, false, err
			}
		}
	} else {
		if err := u.phase(PhaseSettings, &res.Phases, func() error {
			var err error
			cat, err = u.readSettings(ctx, o.OldDir, o.Old, nil, perDatabase{all: !filesKept(p.oldMajor, o.New.Major)}, false)
			return err
		}); err != nil {
			return nil, false, err
		}
	}
	return cat, false, nil
}

// checkVersions checks the two majors and builds against each other and
// that NEW_DATADIR is free.
func (u *upgrader) checkVersions(p *prepared) error {
	o, res := u.o, u.res
	if fsutil.Within(o.NewDir, o.OldDir) || fsutil.Within(o.OldDir, o.NewDir) {
		return errs.New(errs.Usage, "the new data directory must be outside the old one, and the old outside the new").WithPath(o.NewDir).
			WithHint("choose NEW_DATADIR beside the old data directory, e.g. %s", filepath.Join(filepath.Dir(o.OldDir), "data-"+strconv.Itoa(o.New.Major)))
	}
	var err error
	if p.oldMajor, err = oldVersion(o.OldDir); err != nil {
		return err
	}
	res.OldVersion, res.NewVersion = strconv.Itoa(p.oldMajor), strconv.Itoa(o.New.Major)
	if o.New.Major <= p.oldMajor {
		return errs.New(errs.Unsupported, "cannot upgrade PostgreSQL %d to %d: the target must be a newer major", p.oldMajor, o.New.Major).
			WithPath(o.OldDir).WithHint("upgrade to a major newer than %d, e.g. 18", p.oldMajor).WithCLI("pass --to with a major newer than %d, e.g. --to 18", p.oldMajor)
	}
	if o.Old.BinDir == "" || o.New.BinDir == "" {
		return errs.New(errs.Usage, "the PostgreSQL builds for the upgrade are missing").WithHint("see FindInstalls")
	}
	if o.Old.Major != 0 && o.Old.Major != p.oldMajor {
		return errs.New(errs.Usage, "the old cluster is PostgreSQL %d but the old binaries in %s are %s", p.oldMajor, o.Old.BinDir, o.Old.Version).
			WithHint("give the PostgreSQL %d binaries, or leave them out to find them", p.oldMajor).WithCLI("--old-bindir names them")
	}
	if o.Old.Version != "" {
		res.OldVersion = o.Old.Version
	}
	if o.New.Version != "" {
		res.NewVersion = o.New.Version
	}
	if _, err := os.Stat(o.New.tool("pg_upgrade")); err != nil {
		return errs.New(errs.NotFound, "pg_upgrade is missing from the new PostgreSQL build").WithPath(o.New.BinDir).
			WithHint("install a complete PostgreSQL %d", o.New.Major).WithCLI("pgfork pg install %d", o.New.Major)
	}
	if err := pathFree(o.NewDir); err != nil {
		return err
	}
	return nil
}

// refusePlaced refuses NEW_DATADIR when an interrupted run had already
// moved the upgraded cluster there, after removing that run's workspace
// (cleanPlaced): the upgrade is complete, what remains is to start the
// new cluster and rebuild statistics.
func (u *upgrader) refusePlaced(ctx context.Context) error {
	o, res := u.o, u.res
	cleaned, placed, err := cleanPlaced(ctx, o.NewDir)
	res.CleanedUp = cleaned
	for _, c := range cleaned {
		u.infof(PhasePrepare, "cleaned up an interrupted upgrade: %s", c)
	}
	if !placed || err != nil {
		return err
	}
	return errs.New(errs.Exists, "an interrupted upgrade had already moved the upgraded cluster into the new data directory").WithPath(o.NewDir).
		WithHint("pg_upgrade had completed: start it (%s -D %s -l logfile start), check it and rebuild statistics (%s); or remove it, and its PG_%d_* directories in the tablespaces, to upgrade again",
			o.New.tool("pg_ctl"), o.NewDir, strings.Join(statsArgs(o.New.Major, 1, true), " "), o.New.Major)
}

// readOld reads, before anything is stopped, what the hand-over carries
// from the old cluster (its authentication, port, socket directories,
// listen addresses, SSL: see carry) and, when it runs, its command line to
// start it again after an interrupt. A running cluster whose configuration
// cannot be read or carried safely fails the run here, while it still
// serves; for a stopped one the new cluster is then not handed over.
func (u *upgrader) readOld(ctx context.Context, running bool) error {
	o := u.o
	if running {
		if b, err := os.ReadFile(filepath.Join(o.OldDir, "postmaster.opts")); err == nil {
			// As pg_ctl restart does: the options follow the program's
			// path, each in double quotes.
			if _, opts, ok := strings.Cut(strings.TrimSpace(string(b)), ` "`); ok {
				u.oldOpts = `"` + opts
			}
		}
	}
	if !u.handsOver() || o.CheckOnly || o.Rehearse == RehearseOnly {
		return nil
	}
	c, err := u.readOldConfig(ctx, running)
	if err == nil {
		_, err = u.checkTrust(ctx, c)
	}
	if err != nil {
		if running {
			return err
		}
		u.oldCfgErr = err
		return nil
	}
	u.oldCfg = c
	return nil
}

// stopOld shuts the running old cluster down cleanly (fast) and notes
// when it stopped serving.
func (u *upgrader) stopOld(ctx context.Context, pid int) error {
	o := u.o
	u.infof(PhasePrepare, "stopping the old cluster (pid %d) with a clean fast shutdown", pid)
	u.down = time.Now()
	inst, err := instance.Attach(o.OldDir)
	if err == nil {
		err = inst.Stop(ctx, instance.Fast)
	}
	if err != nil {
		return errs.Wrap(errs.Busy, err, "cannot stop the old cluster").WithPath(o.OldDir).
			WithHint("stop it yourself: pg_ctl -D %s stop -m fast", o.OldDir)
	}
	return nil
}

// stopAfterRehearsal stops the old cluster after an online rehearsal
// passed, reads its catalogs again and compares them with the rehearsal's:
// a change made in between (a new database, extension, table...) is
// reported, and pg_upgrade --check then runs again before the real
// upgrade. It returns the catalogs as they were at the stop.
func (u *upgrader) stopAfterRehearsal(ctx context.Context, p *prepared, rehearsed *Catalog) (*Catalog, error) {
	o, res := u.o, u.res
	if hookBeforeStop != nil {
		hookBeforeStop()
	}
	// An interrupt during the rehearsal's last steps (deleting its clone
	// does not watch ctx) must not go on to stop the serving cluster.
	if err := ctx.Err(); err != nil {
		return nil, errs.Wrap(errs.Interrupted, err, "interrupted after the rehearsal, before the old cluster was stopped").
			WithPath(o.OldDir).WithHint("the old cluster still runs, untouched; run the upgrade again when you are ready")
	}
	if err := u.phase(PhaseStopOld, &res.Phases, func() error {
		pid, running, err := pgdata.Running(o.OldDir)
		if err != nil {
			return err
		}
		if running {
			return u.stopOld(ctx, pid)
		}
		u.down = time.Now()
		return nil
	}); err != nil {
		return nil, err
	}
	var err error
	if p.ctl, err = pgdata.ReadControlData(ctx, o.Old.BinDir, o.OldDir, o.Old.Env); err != nil {
		return nil, err
	}
	res.Control = p.ctl
	if !p.ctl.CleanShutdown() {
		if err := u.recoverOld(ctx); err != nil {
			return nil, err
		}
	}
	var cat *Catalog
	if err := u.phase(PhaseSettings, &res.Phases, func() error {
		cat, err = u.readSettings(ctx, o.OldDir, o.Old, nil, perDatabase{all: true, known: knownSince(o.OldDir, rehearsed, p.cloneStart)}, false)
		return err
	}); err != nil {
		return nil, err
	}
	changes, reinit := catalogChanges(rehearsed, cat, 10)
	if len(changes) == 0 {
		return cat, nil
	}
	res.CatalogChanges, p.recheck = changes, true
	u.infof(PhaseSettings, "the old cluster's catalogs changed after the rehearsal: %s; pg_upgrade --check runs again before the real upgrade",
		strings.Join(changes, "; "))
	if reinit {
		_ = os.RemoveAll(u.work.Staging)
	}
	return cat, nil
}

// confirm asks before a mode after which the old cluster cannot start again.
func (u *upgrader) confirm(mode Mode) error {
	o := u.o
	if mode.destructive() && !o.CheckOnly && o.Rehearse != RehearseOnly && !o.Confirmed {
		warn := fmt.Sprintf("--mode %s: once the new cluster has started, the old cluster in %s can no longer be started "+
			"(its data files are shared with, or moved into, the new one). Have a backup.", mode, o.OldDir)
		if mode == Swap {
			warn = fmt.Sprintf("--mode swap moves the old cluster's files into the new one: the old cluster in %s cannot be started "+
				"again, even if the upgrade fails. Have a backup.", o.OldDir)
		}
		if o.Confirm == nil || !o.Confirm(warn) {
			return errs.New(errs.Usage, "%s Not confirmed.", warn).
				WithHint("confirm, or let pgfork pick a mode that keeps the old cluster usable").WithCLI("pass --yes to confirm, or use --mode auto")
		}
	}
	return nil
}

func (u *upgrader) checkSpace(p *prepared, mode Mode) error {
	run, rehearsal := u.spaceNeeds(p, mode)
	if err := checkSpace(rehearsal, mode); err != nil {
		return err
	}
	return checkSpace(run, mode)
}

// spaceNeeds returns the free space the real run needs and, apart, what
// the rehearsal needs: the rehearsal's clone and its new cluster are
// deleted before the real run writes (only the fresh initdb it copies for
// the real run stays, inside the allowance), so on one filesystem the
// larger of the two is needed, not their sum.
func (u *upgrader) spaceNeeds(p *prepared, mode Mode) (run, rehearsal []spaceNeed) {
	o := u.o
	allowance := catalogAllowance(p.sizes.dbs)
	newParent := filepath.Dir(o.NewDir)
	dNew, _ := devOf(newParent)
	dataNeed := allowance
	if mode == Copy || mode == CopyFileRange {
		dataNeed += p.sizes.dataBytes
	}
	if !o.CheckOnly && o.Rehearse != RehearseOnly {
		run = append(run, spaceNeed{dev: dNew, path: newParent, bytes: dataNeed, what: fmt.Sprintf("the new cluster (--mode %s)", mode)})
		if mode == Copy || mode == CopyFileRange {
			for _, ts := range p.tss {
				d, _ := devOf(ts.Location)
				run = append(run, spaceNeed{dev: d, path: ts.Location, bytes: p.sizes.tsBytes[ts.Location], what: "tablespace " + ts.OID})
			}
		}
	} else {
		run = append(run, spaceNeed{dev: dNew, path: newParent, bytes: allowance, what: "a trial new cluster"})
	}
	if p.rehearse {
		oldParent := filepath.Dir(o.OldDir)
		d, _ := devOf(oldParent)
		n := allowance
		if !p.fs.oldCanClone {
			n += p.sizes.total()
		}
		rehearsal = append(rehearsal, spaceNeed{dev: d, path: oldParent, bytes: n, what: "the rehearsal clone"})
	}
	return run, rehearsal
}

// recoverOld starts and stops the old cluster once so that it is shut
// down cleanly, as pg_upgrade and an offline clone require.
func (u *upgrader) recoverOld(ctx context.Context) error {
	u.infof(PhasePrepare, "the old cluster was not shut down cleanly: starting and stopping it once to make it consistent")
	hba, err := writeHBA(u.work.Tmp, u.o.User)
	if err != nil {
		return err
	}
	cfg := serverCfg(u.o.Old, u.o.OldDir, u.work.Tmp, hba, "old-recovery.log", u.o.User)
	cfg.SocketDir = u.work.Tmp
	inst, err := instance.Start(ctx, cfg)
	if err != nil {
		return err
	}
	return inst.Stop(context.WithoutCancel(ctx), instance.Fast)
}

// readSettings starts a cluster privately (socket only, in pgfork's temp
// directory, with a private trust pg_hba.conf, archiving off), reads its
// catalogs (as per says, every database's too: see Catalog.Relations) and
// stops it cleanly. The catalogs are the only place encoding, locale and the
// bootstrap superuser are kept; pg_upgrade starts the old cluster the same
// way for its own checks.
func (u *upgrader) readSettings(ctx context.Context, dataDir string, bin Install, extra map[string]string, per perDatabase, background bool) (*Catalog, error) {
	hba, err := writeHBA(u.work.Tmp, u.o.User)
	if err != nil {
		return nil, err
	}
	cfg := serverCfg(bin, dataDir, u.work.Tmp, hba, "settings.log", u.o.User)
	cfg.SocketDir = u.work.Tmp
	cfg.Background = background
	for k, v := range extra {
		cfg.Settings[k] = v
	}
	inst, err := instance.Start(ctx, cfg)
	if err != nil {
		return nil, err
	}
	hook("settings server started")
	cat, known, rerr := readCatalog(ctx, inst, superuserCandidates(u.o.Superuser, dataDir), per)
	if err := inst.Stop(context.WithoutCancel(ctx), instance.Fast); err != nil && rerr == nil {
		rerr = err
	}
	if rerr != nil {
		return nil, rerr
	}
	if known > 0 {
		u.infof(PhaseSettings, "%d of %d databases unchanged on disk since the rehearsal's clone: taken as the rehearsal read them, not connected to",
			known, len(cat.Databases))
	}
	u.infof(PhaseSettings, "old cluster: superuser %s, encoding %s, locale %s, data checksums %s, block size %d, WAL segments %s",
		cat.Superuser, cat.Encoding, cat.Collate, onOff(u.res.Control.ChecksumsEnabled()), u.res.Control.BlockSize, units.Bytes(u.res.Control.WALSegmentSize))
	return cat, nil
}

func onOff(b bool) string {
	if b {
		return "on"
	}
	return "off"
}

// initNew creates the new cluster in the staging directory, matching the
// old one, and records the tablespace directories pg_upgrade will create.
func (u *upgrader) initNew(ctx context.Context, p *prepared, cat *Catalog) error {
	w := u.work
	if _, err := os.Stat(filepath.Join(w.Staging, "PG_VERSION")); err != nil {
		if err := instance.InitDB(ctx, initOptions(u.o.New, w.Staging, u.o.User, p.ctl, cat, true)); err != nil {
			return err
		}
	}
	ncd, err := pgdata.ReadControlData(ctx, u.o.New.BinDir, w.Staging, u.o.New.Env)
	if err != nil {
		return err
	}
	var dirs []string
	for _, ts := range p.tss {
		d := filepath.Join(ts.Location, fmt.Sprintf("PG_%d_%d", u.o.New.Major, ncd.CatalogVersion))
		if _, err := os.Lstat(d); err == nil {
			return errs.New(errs.Exists, "tablespace %s already holds a directory for PostgreSQL %d", ts.OID, u.o.New.Major).WithPath(d).
				WithHint("an earlier upgrade (not pgfork's, or one whose state was lost) left it; if no cluster uses it, remove it and run again")
		}
		dirs = append(dirs, d)
	}
	w.state.TablespaceDirs = dirs
	return w.save()
}

// check runs pg_upgrade --check and reports its findings.
func (u *upgrader) check(ctx context.Context, cat *Catalog) error {
	r := u.pgUpgrade(u.o.OldDir, u.work.Staging, u.work.Tmp, cat.Superuser, u.res.Mode, PhaseCheck)
	r.Check = true
	out, err := r.run(ctx)
	what := "pg_upgrade --check found problems; nothing was changed"
	if u.res.Rehearsal != nil && u.res.Rehearsal.Online {
		what = "the catalogs changed after the rehearsal and pg_upgrade --check now finds problems; nothing was changed " +
			"(the old cluster is stopped: start it again with " + u.o.Old.tool("pg_ctl") + " -D " + u.o.OldDir + " start)"
	}
	return u.afterPGUpgrade(out, err, what)
}

func (u *upgrader) pgUpgrade(oldDir, newDir, cwd, su string, mode Mode, phase string) pgUpgradeRun {
	return pgUpgradeRun{
		Old: u.o.Old, New: u.o.New, OldDir: oldDir, NewDir: newDir, Superuser: su, Mode: mode,
		Jobs: u.o.Jobs, WorkDir: cwd, HBA: filepath.Join(u.work.Tmp, "pgfork_hba.conf"), User: u.o.User,
		OnStep: func(step string, done bool, status string) {
			u.emit(Event{Phase: phase, Step: step, Done: done, Status: status})
		},
	}
}

// afterPGUpgrade turns a pg_upgrade run into findings and, on failure, an
// error pointing at the kept logs.
func (u *upgrader) afterPGUpgrade(out *pgUpgradeResult, err error, what string) error {
	if out != nil {
		for _, f := range out.Findings {
			if f.Severity == "warning" {
				u.res.Findings = append(u.res.Findings, f)
			}
		}
		u.res.Steps = append(u.res.Steps, out.Steps...)
	}
	if err == nil {
		return nil
	}
	if !errors.Is(err, errPGUpgrade) {
		return err
	}
	logs := u.work.keepLogs(u.o.NewDir, out.Output)
	fs := rewritePaths(out.Findings, filepath.Join(u.work.Staging, "pg_upgrade_output.d"), filepath.Join(logs, "pg_upgrade_output.d"))
	u.res.Findings = fs
	return errorWithFindings(what, fs, logs)
}

func rewritePaths(fs []Finding, from, to string) []Finding {
	for i := range fs {
		for j, p := range fs[i].Files {
			fs[i].Files[j] = strings.Replace(p, from, to, 1)
		}
		fs[i].Detail = strings.ReplaceAll(fs[i].Detail, from, to)
	}
	return fs
}

// transfer runs the upgrade for real and moves the new cluster into place.
func (u *upgrader) transfer(ctx context.Context, p *prepared, cat *Catalog) error {
	o, w, res := u.o, u.work, u.res
	hba := filepath.Join(w.Tmp, "pgfork_hba.conf")
	if _, err := os.Stat(hba); err != nil {
		if _, err := writeHBA(w.Tmp, o.User); err != nil {
			return err
		}
	}
	w.state.Mode, w.state.Transferring = res.Mode, true
	if err := w.save(); err != nil {
		return err
	}
	r := u.pgUpgrade(o.OldDir, w.Staging, w.Tmp, cat.Superuser, res.Mode, PhaseUpgrade)
	newRoots := []string{filepath.Join(w.Staging, "base")}
	newRoots = append(newRoots, w.state.TablespaceDirs...)
	var mu sync.Mutex
	var stopPoll func()
	r.OnStep = func(step string, done bool, status string) {
		u.emit(Event{Phase: PhaseUpgrade, Step: step, Done: done, Status: status})
		if !strings.Contains(step, "relation files") && !strings.HasPrefix(step, "Swapping") {
			return
		}
		mu.Lock()
		defer mu.Unlock()
		if !done && stopPoll == nil && u.o.OnEvent != nil {
			stopPoll = u.pollBytes(step, newRoots, p.totalData)
		} else if done && stopPoll != nil {
			stopPoll()
			stopPoll = nil
		}
	}
	out, err := r.run(ctx)
	mu.Lock()
	if stopPoll != nil {
		stopPoll()
	}
	mu.Unlock()
	if err != nil {
		err = u.afterPGUpgrade(out, err, "pg_upgrade failed")
		switch res.Mode {
		case Link:
			if _, serr := os.Stat(filepath.Join(o.OldDir, "global", "pg_control.old")); serr == nil {
				return errs.Wrap(errs.KindOf(err), err, "the upgrade failed after pg_upgrade disabled the old cluster").
					WithHint("the new cluster never started, so the old one is intact: rename %s back to pg_control to use it again; %s",
						filepath.Join(o.OldDir, "global", "pg_control.old"), errs.HintOf(err))
			}
		case Swap:
			return errs.Wrap(errs.KindOf(err), err, "the swap-mode upgrade failed; the old cluster's files may have been moved").
				WithHint("nothing was removed: inspect %s and pg_upgrade's logs, or restore the old cluster from backup", w.Staging)
		}
		return err
	}
	_ = u.afterPGUpgrade(out, nil, "")
	res.SharedBytes, res.CopiedBytes = transferStats(res.Mode, newRoots, p.totalData)
	if err := pathFree(o.NewDir); err != nil {
		return err
	}
	if err := os.Rename(w.Staging, o.NewDir); err != nil {
		return errs.Wrap(errs.OSKind(err), err, "cannot move the upgraded cluster into place").WithPath(o.NewDir).
			WithHint("the upgraded cluster is in %s; move it yourself", w.Staging)
	}
	hook("placed")
	// The tablespace directories now belong to the new cluster.
	w.state.TablespaceDirs, w.state.Transferring, w.state.Placed = nil, false, true
	w.Staging = o.NewDir
	_ = w.save()
	return nil
}

// pollBytes reports the bytes in the new cluster's data files while
// pg_upgrade transfers them. It returns a function that stops it.
func (u *upgrader) pollBytes(step string, roots []string, total int64) func() {
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		// Each poll walks the new files: with many databases that is
		// hundreds of thousands of stats, which must not compete with
		// pg_upgrade for the cores. Wait at least ten times as long as the
		// last walk took, so that polling costs at most a tenth of a core.
		wait := 500 * time.Millisecond
		for {
			select {
			case <-done:
				return
			case <-time.After(wait):
				t := time.Now()
				var n int64
				for _, r := range roots {
					n += clone.TreeBytes(r)
				}
				wait = max(500*time.Millisecond, 10*time.Since(t))
				u.emit(Event{Phase: PhaseUpgrade, Step: step, Bytes: min(n, total), TotalBytes: total})
			}
		}
	}()
	return func() { close(done); wg.Wait() }
}

// startNew starts the new cluster privately and checks every database
// against the old relation counts. It returns the running server.
func (u *upgrader) startNew(ctx context.Context, cat *Catalog) (*instance.Instance, error) {
	o, w := u.o, u.work
	hba := filepath.Join(w.Tmp, "pgfork_hba.conf")
	cfg := serverCfg(o.New, o.NewDir, w.Tmp, hba, "new-server.log", o.User)
	cfg.SocketDir = w.Tmp
	inst, err := instance.Start(ctx, cfg)
	if err != nil {
		return nil, errs.Wrap(errs.KindOf(err), err, "the upgraded cluster does not start").WithPath(o.NewDir).
			WithHint("its server log is %s", keepFile(cfg.LogFile, o.NewDir))
	}
	if err := smokeCheck(ctx, inst, cat, u.filesOnDisk(cat), func(m string) { u.infof(PhaseStart, "%s", m) }); err != nil {
		_ = inst.Stop(context.WithoutCancel(ctx), instance.Fast)
		return nil, err
	}
	return inst, nil
}

// handsOver says whether the new cluster is started for the application
// before statistics are rebuilt. pg_upgrade's documentation recommends
// letting the application in while vacuumdb --analyze-in-stages rebuilds
// them (coarse ones first): PostgreSQL before 18 starts without optimizer
// statistics, 18 with most of them (--missing-stats-only gathers the rest,
// one connection per database: 49 s at 1,000 databases, downtime a
// by-hand run does not have).
func (u *upgrader) handsOver() bool {
	return !u.o.NoAnalyze && !u.o.WaitAnalyze
}

// handOver stops the private server and starts the new cluster with its
// own configuration (pg_ctl start), on the old cluster's port when the old
// cluster ran, for the application to connect. It returns the running
// server, or an error when it does not start (the caller falls back to the
// private server).
func (u *upgrader) handOver(ctx context.Context, private *instance.Instance, su string) (*instance.Instance, error) {
	o := u.o
	if u.oldCfg == nil {
		if u.oldCfgErr != nil {
			return nil, u.oldCfgErr
		}
		return nil, errs.New(errs.Internal, "the old cluster's configuration was not read")
	}
	conn, err := pgx.Connect(ctx, private.ConnString(su, "template1"))
	if err != nil {
		return nil, err
	}
	carried, err := u.carry(ctx, conn, u.oldCfg)
	conn.Close(context.WithoutCancel(ctx))
	if err != nil {
		return nil, err
	}
	u.res.Notes = append(u.res.Notes, "carried from the old cluster: "+strings.Join(carried, "; "))
	if err := private.Stop(context.WithoutCancel(ctx), instance.Fast); err != nil {
		return nil, err
	}
	log := filepath.Join(o.NewDir, instance.LogFileName)
	cmd := o.User.Command(ctx, o.New.Env, o.New.tool("pg_ctl"), "start", "-D", o.NewDir, "-w", "-t", "300", "-l", log)
	cmd.Dir = u.work.Tmp
	setpgid(cmd) // not stopped half-way by the terminal's Ctrl-C
	if out, err := cmd.CombinedOutput(); err != nil {
		return nil, fmt.Errorf("pg_ctl start: %v: %s", err, strings.TrimSpace(string(out)))
	}
	inst, err := instance.Attach(o.NewDir)
	if err != nil {
		return nil, err
	}
	u.work.keepServer, u.handed = true, true
	return inst, nil
}

// finishNew rebuilds statistics on the new cluster (handed over to the
// application first where handsOver says so) and stops it unless it was
// handed over.
//
// gctx is ctx until the old cluster is past the point of no return (see
// commitGuard): the hand-over runs on it, statistics on ctx.
func (u *upgrader) finishNew(ctx, gctx context.Context, inst *instance.Instance, cat *Catalog) error {
	o, res := u.o, u.res
	handed := false
	if u.handsOver() {
		hinst, err := u.handOver(gctx, inst, cat.Superuser)
		if err == nil {
			inst, handed = hinst, true
			where := fmt.Sprintf("port %d", inst.Port)
			if inst.SocketDir != "" {
				where += ", socket directory " + inst.SocketDir
			}
			u.infof(PhaseStatistics, "the new cluster accepts connections (pid %d, %s); statistics are rebuilt while it serves", inst.Pid, where)
		} else {
			u.infof(PhaseStatistics, "cannot hand the new cluster over before statistics are rebuilt (%v); rebuilding them on the private socket", err)
			res.Notes = append(res.Notes, fmt.Sprintf("the new cluster was not started for the application before statistics were rebuilt: %v", err))
			if _, running, _ := pgdata.Running(o.NewDir); !running {
				if inst, err = u.startNew(gctx, cat); err != nil {
					return err
				}
			}
		}
	}
	if handed {
		u.accepts()
	}
	if !o.NoAnalyze {
		if err := u.phase(PhaseStatistics, &res.Phases, func() error { return u.statistics(ctx, inst, cat.Superuser, handed) }); err != nil {
			if !handed {
				_ = inst.Stop(context.WithoutCancel(ctx), instance.Fast)
			}
			return err
		}
		res.StatisticsAfter = time.Since(u.t0)
	} else {
		res.Statistics = "skipped (--no-analyze): run " + strings.Join(statsArgs(o.New.Major, 1, true), " ") + " once the cluster runs"
	}
	if handed {
		inst.Release()
		res.Running = true
		res.Notes = append(res.Notes,
			fmt.Sprintf("the new cluster runs (pid %d, port %d), started with its own configuration; its log is %s; stop it with: %s -D %s stop",
				inst.Pid, inst.Port, filepath.Join(o.NewDir, instance.LogFileName), o.New.tool("pg_ctl"), o.NewDir))
	} else {
		if err := inst.Stop(context.WithoutCancel(ctx), instance.Fast); err != nil {
			return err
		}
		u.accepts()
		res.Notes = append(res.Notes, fmt.Sprintf("start the new cluster with: %s -D %s -l logfile start", o.New.tool("pg_ctl"), o.NewDir))
	}
	if handed {
		res.Notes = append(res.Notes,
			"its authentication (pg_hba.conf, pg_ident.conf), port, socket directories, listen addresses and SSL settings are the old cluster's; carry over your other settings from "+o.OldDir)
	} else {
		res.Notes = append(res.Notes,
			"its postgresql.conf and pg_hba.conf are PostgreSQL "+strconv.Itoa(o.New.Major)+"'s defaults (local socket: trust, in the build's default socket directory; TCP: scram-sha-256): carry over your pg_hba.conf and settings from "+o.OldDir+" before you start it")
	}
	if n := logicalNote(res); n != "" {
		res.Notes = append(res.Notes, n)
	}
	switch res.Mode {
	case Link:
		res.Notes = append(res.Notes, "the old cluster shares its data files with the new one: never start it again")
	case Swap:
		res.Notes = append(res.Notes, "the old cluster's files were moved into the new one: it cannot be started")
	default:
		res.Notes = append(res.Notes, "the old cluster is untouched and can still be started; remove "+o.OldDir+" once you are satisfied")
	}
	return nil
}

// accepts notes that the application can connect now (handed over), or
// could once the user starts the stopped new cluster: the end of the
// downtime.
func (u *upgrader) accepts() {
	u.res.AcceptsAfter = time.Since(u.t0)
	if !u.down.IsZero() {
		u.res.Downtime = time.Since(u.down)
	}
}

// logicalNote is the note an upgrade of a cluster that served during its
// rehearsal and was then down for more than 2 s gets: --logical would have
// kept it serving. Not the default: it needs wal_level = logical (a
// restart) and runs publications and slots on the old cluster
// (docs/upgrade.md).
func logicalNote(res *Result) string {
	if res.Rehearsal == nil || !res.Rehearsal.Online || res.Downtime <= 2*time.Second {
		return ""
	}
	return fmt.Sprintf("the old cluster was down for %s; with --logical it serves through the upgrade and writes pause about a second (it needs wal_level = logical: docs/upgrade.md, \"--logical\")",
		res.Downtime.Round(100*time.Millisecond))
}

// keepFile copies a server log next to dir so it survives the workspace.
func keepFile(p, dir string) string {
	b, err := os.ReadFile(p)
	if err != nil {
		return p
	}
	dst := dir + ".pgfork-" + filepath.Base(p)
	if os.WriteFile(dst, b, 0o644) != nil {
		return p
	}
	return dst
}

// statsArgs is the vacuumdb command line for statistics after an upgrade:
// PostgreSQL 18 keeps the optimizer statistics through pg_upgrade, so only
// what is missing (extended statistics, ...) is gathered; older targets
// start without statistics. With serving set the application is connected
// (or will be: the hint for the user) and they are rebuilt in stages,
// quick coarse ones first; otherwise nobody is waiting for the coarse
// ones, and the last stage alone (--analyze-only) gives the same
// statistics with one connection per database instead of three (with
// 1,000 databases that was most of the statistics phase).
func statsArgs(newMajor, jobs int, serving bool) []string {
	a := []string{"vacuumdb", "--all", "--analyze-only"}
	if serving {
		a[2] = "--analyze-in-stages"
	}
	if newMajor >= 18 {
		a = append(a, "--missing-stats-only")
	}
	if jobs > 1 {
		a = append(a, "--jobs", strconv.Itoa(jobs))
	}
	return a
}

func (u *upgrader) statistics(ctx context.Context, inst *instance.Instance, su string, serving bool) error {
	o := u.o
	args := statsArgs(o.New.Major, o.Jobs, serving)
	full := append(args[1:], "--host", inst.SocketDir, "--port", strconv.Itoa(inst.Port), "--username", su)
	cmd := o.User.Command(ctx, o.New.Env, o.New.tool("vacuumdb"), full...)
	cmd.Dir = u.work.Tmp
	outb, err := cmd.CombinedOutput()
	if err != nil {
		var ee *exec.ExitError
		if errors.As(err, &ee) || ctx.Err() == nil {
			return errs.Wrap(errs.Internal, err, "vacuumdb failed: %s", strings.TrimSpace(string(outb))).
				WithHint("the upgrade itself succeeded; run %s once the new cluster runs", strings.Join(args, " "))
		}
		return err
	}
	u.res.Statistics = strings.Join(args, " ")
	return nil
}
