package upgrade

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/pgfork/pgfork/clone"
	"github.com/pgfork/pgfork/instance"
	"github.com/pgfork/pgfork/internal/errs"
	"github.com/pgfork/pgfork/pgbin"
	"github.com/pgfork/pgfork/pgclone"
	"github.com/pgfork/pgfork/pgdata"
)

// rehearse runs the whole upgrade on a clone of the old cluster: clone it
// (copy-on-write where the filesystem allows: seconds, little space), read
// its settings, initdb a matching new cluster, pg_upgrade (--clone, or
// --link: the clone is thrown away), start the result, connect to every
// database and count its relations, and delete everything. The original is
// only read; that is verified at the end.
func (u *upgrader) rehearse(ctx context.Context, p *prepared) (*Catalog, error) {
	o, w := u.o, u.work
	t0 := time.Now()
	rh := &Rehearsal{Mode: Link, Online: p.online}
	if p.fs.oldCanClone {
		rh.Mode = Clone
	}
	dir := filepath.Join(filepath.Dir(o.OldDir), fmt.Sprintf(".%s.pgfork-rehearsal-%d", filepath.Base(o.OldDir), os.Getpid()))
	rh.Dir = dir
	u.res.Rehearsal = rh
	w.state.Rehearsal = dir
	if err := w.save(); err != nil {
		return nil, err
	}
	defer func() {
		stopServer(ctx, filepath.Join(dir, "old"), "")
		stopServer(ctx, filepath.Join(dir, "new"), "")
		_ = os.RemoveAll(dir)
		w.state.Rehearsal = ""
		_ = w.save()
	}()
	if err := os.Mkdir(dir, 0o755); err != nil {
		return nil, errs.Wrap(errs.OSKind(err), err, "cannot create the rehearsal directory beside the old data directory").WithPath(dir).
			WithHint("the rehearsal needs to write beside the old data directory (on its filesystem); or upgrade without a rehearsal").WithCLI("or pass --no-rehearse")
	}
	var err error
	roots := []string{o.OldDir}
	for _, ts := range p.tss {
		roots = append(roots, filepath.Join(ts.Location, ts.VersionDir))
	}
	// A running old cluster writes its own files: only a stopped one can be
	// verified unchanged afterwards.
	var before snapshot
	if !p.online {
		if before, err = takeSnapshot(roots...); err != nil {
			return nil, errs.FromOS(err, "", "cannot list the old cluster's files")
		}
	}
	step := func(name string, fn func() error) error {
		u.emit(Event{Phase: PhaseRehearsal, Step: name})
		t := time.Now()
		err := fn()
		rh.Phases = append(rh.Phases, PhaseTime{Name: name, Elapsed: time.Since(t)})
		status := "ok"
		if err != nil {
			status = "failed"
		}
		u.emit(Event{Phase: PhaseRehearsal, Step: name, Done: true, Status: status})
		return err
	}

	oldClone, newClone := filepath.Join(dir, "old"), filepath.Join(dir, "new")
	cloneStep := "clone the old cluster"
	if p.online {
		cloneStep = "clone the running old cluster online"
	}
	p.cloneStart = time.Now()
	if err := step(cloneStep, func() error {
		method := clone.Auto
		if p.fs.oldCanClone {
			method = clone.Clone
		}
		_, err := pgclone.Clone(ctx, pgclone.Options{
			Src: o.OldDir, Dst: oldClone, Online: p.online, Label: "pgfork upgrade rehearsal",
			Installation: pgbin.Installation{BinDir: o.Old.BinDir, Version: o.Old.Version, Major: o.Old.Major},
			Method:       method, Jobs: o.Jobs, Sync: clone.SyncNone, User: o.User,
			OnProgress: cloneHook(),
		})
		return err
	}); err != nil {
		if p.online {
			return nil, errs.Wrap(errs.KindOf(err), err, "the rehearsal could not clone the running old cluster; it was not stopped").
				WithHint("%s", errs.HintOf(err))
		}
		return nil, err
	}
	var cat *Catalog
	if err := step("read settings", func() error {
		var err error
		var extra map[string]string
		if p.online {
			extra = recoverySettings(p.ctl)
		}
		cat, err = u.readSettings(ctx, oldClone, o.Old, extra, perDatabase{all: true}, p.online)
		return err
	}); err != nil {
		return nil, err
	}
	if err := step("initdb", func() error {
		if err := instance.InitDB(ctx, initOptions(o.New, newClone, o.User, p.ctl, cat, true)); err != nil {
			return err
		}
		// The real upgrade needs the very same fresh cluster: copy it
		// (a clone where the filesystem can) instead of a second initdb.
		if !o.CheckOnly && o.Rehearse != RehearseOnly {
			if _, err := clone.Copy(ctx, newClone, w.Staging, clone.Options{Sync: clone.SyncNone}); err != nil {
				_ = os.RemoveAll(w.Staging)
			}
		}
		return nil
	}); err != nil {
		return nil, err
	}
	cwd := filepath.Join(w.Tmp, "rehearsal")
	if err := u.mkUserDir(cwd); err != nil {
		return nil, err
	}
	if err := step("pg_upgrade --"+string(rh.Mode), func() error {
		r := u.pgUpgrade(oldClone, newClone, cwd, cat.Superuser, rh.Mode, PhaseRehearsal)
		r.NoSync = true
		if p.online {
			r.OldSettings = recoverySettings(p.ctl)
			r.Background = true
		}
		out, err := r.run(ctx)
		if err == nil {
			u.res.Findings = append(u.res.Findings, warnings(out.Findings)...)
			return nil
		}
		if out == nil || ctx.Err() != nil {
			return err
		}
		logs := keepRehearsalLogs(o.NewDir, newClone, out.Output)
		fs := rewritePaths(out.Findings, filepath.Join(newClone, "pg_upgrade_output.d"), filepath.Join(logs, "pg_upgrade_output.d"))
		u.res.Findings = fs
		return errorWithFindings("the rehearsal on a clone failed, so the real upgrade was not started (the old cluster was not touched)", fs, logs)
	}); err != nil {
		return nil, err
	}
	if err := step("start and smoke check", func() error {
		cfg := serverCfg(o.New, newClone, w.Tmp, filepath.Join(w.Tmp, "pgfork_hba.conf"), "rehearsal-server.log", o.User)
		cfg.SocketDir = cwd
		cfg.Background = p.online
		inst, err := instance.Start(ctx, cfg)
		if err != nil {
			return errs.Wrap(errs.KindOf(err), err, "the rehearsal's upgraded cluster does not start; the real upgrade was not started").
				WithHint("its server log: %s", keepFile(cfg.LogFile, o.NewDir))
		}
		defer func() { _ = inst.Stop(context.WithoutCancel(ctx), instance.Fast) }()
		hook("rehearsal server started")
		if err := smokeCheck(ctx, inst, cat, nil, nil); err != nil {
			return errs.Wrap(errs.Internal, err, "the rehearsal's smoke check failed; the real upgrade was not started")
		}
		rh.Relations = cat.Relations
		return nil
	}); err != nil {
		return nil, err
	}
	if err := step("delete the clone", func() error {
		stopServer(ctx, newClone, "")
		return os.RemoveAll(dir)
	}); err != nil {
		return nil, errs.FromOS(err, dir, "cannot delete the rehearsal clone")
	}
	rh.Elapsed = time.Since(t0)
	if p.online {
		u.infof(PhaseRehearsal, "rehearsal passed in %s: %d databases upgraded on an online clone, started and checked, while the old cluster served",
			rh.Elapsed.Round(10*time.Millisecond), len(cat.Relations))
		return cat, nil
	}
	after, err := takeSnapshot(roots...)
	if err != nil {
		return nil, errs.FromOS(err, "", "cannot list the old cluster's files")
	}
	if d := before.diff(after, 10); len(d) > 0 {
		return nil, errs.New(errs.Internal, "the old cluster changed during the rehearsal: %s", strings.Join(d, "; ")).WithPath(o.OldDir).
			WithHint("something else wrote to it (a server started on it?); the real upgrade was not started: check the old cluster")
	}
	rh.OriginalUnchanged = true
	u.infof(PhaseRehearsal, "rehearsal passed in %s: %d databases upgraded on a clone, started and checked; the original was not written",
		rh.Elapsed.Round(10*time.Millisecond), len(cat.Relations))
	return cat, nil
}

// cloneHook reports the rehearsal clone's progress to testHook (tests
// only): it runs while the files are copied.
func cloneHook() func(pgclone.Progress) {
	if testHook == nil {
		return nil
	}
	return func(pgclone.Progress) { hook("clone copying") }
}

func warnings(fs []Finding) []Finding {
	var out []Finding
	for _, f := range fs {
		if f.Severity == "warning" {
			out = append(out, f)
		}
	}
	return out
}

// keepRehearsalLogs keeps the rehearsal's pg_upgrade logs beside NEW_DATADIR.
func keepRehearsalLogs(newDir, newClone, output string) string {
	dst := newDir + ".pgfork-rehearsal-logs-" + time.Now().Format("20060102T150405")
	if err := os.MkdirAll(dst, 0o755); err != nil {
		return ""
	}
	_ = os.WriteFile(filepath.Join(dst, "pg_upgrade.out"), []byte(output), 0o644)
	src := filepath.Join(newClone, "pg_upgrade_output.d")
	if _, err := os.Stat(src); err == nil {
		_ = os.Rename(src, filepath.Join(dst, "pg_upgrade_output.d"))
	}
	return dst
}

// recoverySettings are the settings an online clone must start with to
// replay the running cluster's WAL: recovery refuses values lower than the
// source's (a prepared transaction needs a slot), and the source may have
// them from its command line, which the clone does not copy. pg_control
// records the values the source runs with.
func recoverySettings(ctl *pgdata.ControlData) map[string]string {
	out := map[string]string{}
	for field, setting := range map[string]string{
		"max_connections setting":      "max_connections",
		"max_prepared_xacts setting":   "max_prepared_transactions",
		"max_locks_per_xact setting":   "max_locks_per_transaction",
		"max_worker_processes setting": "max_worker_processes",
		"max_wal_senders setting":      "max_wal_senders",
	} {
		if v, ok := ctl.Fields[field]; ok && v != "" {
			out[setting] = v
		}
	}
	return out
}
