// Package pgclone copies a whole PostgreSQL data directory safely, so that
// the copy runs as an independent cluster: offline (the source is cleanly
// shut down) or online (the source runs; the copy is taken between
// pg_backup_start and pg_backup_stop on one session, with the WAL it needs,
// and recovers to a consistent state on its first start).
//
// The source is never written. The copy is built in a staging directory
// beside the destination and renamed into place only when complete;
// tablespaces are copied to DST.tblspc/<oid> and the clone's links point
// there. A clone shares the source's system identifier.
//
// pgclone owns making a data directory into an independent cluster. It must
// not start the clone (the caller does) and must not write the source; the
// copying itself is package clone's, the data-directory rules pgdata's.
package pgclone

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/pgfork/pgfork/clone"
	"github.com/pgfork/pgfork/instance"
	"github.com/pgfork/pgfork/internal/errs"
	"github.com/pgfork/pgfork/internal/fsutil"
	"github.com/pgfork/pgfork/pgbin"
	"github.com/pgfork/pgfork/pgdata"
)

// Options shape a clone.
type Options struct {
	// Src is the source data directory; Dst the new one (must not exist).
	Src, Dst string
	// Installation is the PostgreSQL build of the source's major version
	// (its pg_controldata reads the source's control file).
	Installation pgbin.Installation
	// Online copies a running source with the backup API.
	Online bool
	// ConnString reaches the running source (Online only); empty: from its
	// postmaster.pid (socket directory and port), as user postgres.
	ConnString string
	// ConfigDir is where the source's configuration lives when it is not in
	// Src (Debian: /etc/postgresql/MAJOR/CLUSTER); empty: found by itself
	// (online: asked of the server; offline: the Debian layout).
	ConfigDir string
	// Label names the backup on the source (Online only); default
	// "pgfork clone to DST".
	Label string
	// Method, Jobs and Sync are passed to the copy engine.
	Method clone.Method
	Jobs   int
	Sync   clone.SyncMode
	// Port, when not 0, becomes the clone's port; 0 keeps the source's.
	Port int
	// User owns the copy (when pgfork runs as root); nil keeps ownership.
	User *instance.OSUser
	// OnProgress is called while files are copied (see clone.Options).
	OnProgress func(Progress)
}

// Progress is reported while a clone runs.
type Progress struct {
	// Phase is "data", "tablespace OID" or "wal".
	Phase string
	clone.Progress
}

// TablespaceCopy is one tablespace of the clone.
type TablespaceCopy struct {
	OID    string `json:"oid"`
	Source string `json:"source"` // the source's tablespace directory
	Target string `json:"target"` // the clone's copy of it
}

// Result describes a finished clone.
type Result struct {
	Src    string `json:"src"`
	Dst    string `json:"dst"`
	Online bool   `json:"online"`
	Major  int    `json:"major"`
	// SystemIdentifier is shared with the source: tools that key on it
	// (replication, some backup tools) see the two as the same cluster.
	SystemIdentifier string                 `json:"system_identifier"`
	Port             int                    `json:"port,omitempty"` // set by Options.Port; 0: the source's setting
	Files            int64                  `json:"files"`
	Bytes            int64                  `json:"bytes"`
	SharedBytes      int64                  `json:"shared_bytes"`
	Methods          map[clone.Method]int64 `json:"methods"`
	Sync             clone.SyncMode         `json:"sync"`
	Vanished         int64                  `json:"vanished,omitempty"`
	Tablespaces      []TablespaceCopy       `json:"tablespaces,omitempty"`
	// Online only: the backup's WAL range and the WAL files copied.
	StartLSN string `json:"start_lsn,omitempty"`
	StopLSN  string `json:"stop_lsn,omitempty"`
	WALFiles int    `json:"wal_files,omitempty"`
	WALBytes int64  `json:"wal_bytes,omitempty"`
	// BackupUser is the OS user whose psql session held the backup (as
	// root without ConnString); empty: pgfork's own connection.
	BackupUser string `json:"backup_user,omitempty"`
	// Config is the configuration copied into the clone when the source
	// keeps it outside its data directory.
	Config *pgdata.ConfigCopy `json:"config,omitempty"`
	// NoConfig: the source has no postgresql.conf of its own and its
	// configuration was not found, so the clone starts with the defaults.
	NoConfig bool     `json:"no_config,omitempty"`
	Warnings []string `json:"warnings,omitempty"`
	// Phases times the steps: "backup start" (connect, fast checkpoint),
	// "copy", "tablespaces", "backup stop", "wal", "finish" (reset, sync, rename).
	Phases  map[string]time.Duration `json:"phases_ns"`
	Elapsed time.Duration            `json:"elapsed_ns"`
}

// Clone copies opts.Src to opts.Dst. See the package documentation.
func Clone(ctx context.Context, opts Options) (*Result, error) {
	t0 := time.Now()
	src, dst, err := checkPaths(opts.Src, opts.Dst)
	if err != nil {
		return nil, err
	}
	if err := pgdata.Check(src); err != nil {
		return nil, err
	}
	if opts.User != nil {
		if err := instance.CheckDataOwner(src, opts.User.Owner()); err != nil {
			return nil, err
		}
	}
	major, err := pgdata.Version(src)
	if err != nil {
		return nil, err
	}
	inst := opts.Installation
	if inst.BinDir == "" {
		return nil, errs.New(errs.Usage, "no PostgreSQL installation given for the clone").WithHint("give the PostgreSQL %d binaries", major).WithCLI("--pg %d or --pg-bin DIR", major)
	}
	if inst.Major != 0 && inst.Major != major {
		return nil, errs.New(errs.Unsupported, "the source data directory is PostgreSQL %d but the binaries in %s are PostgreSQL %s", major, inst.BinDir, inst.Version).
			WithPath(src).WithHint("use the PostgreSQL %d binaries", major).WithCLI("--pg %d (install them with `pgfork pg install %d` if missing)", major, major)
	}
	tss, err := pgdata.Tablespaces(src)
	if err != nil {
		return nil, err
	}
	if err := checkDestination(opts, src, dst, tss); err != nil {
		return nil, err
	}
	cd, err := checkSourceState(ctx, opts, src)
	if err != nil {
		return nil, err
	}

	parent := filepath.Dir(dst)
	if err := os.MkdirAll(parent, 0o755); err != nil {
		return nil, errs.FromOS(err, parent, "cannot create the destination's parent directory")
	}
	b := &build{opts: opts, src: src, dst: dst, parent: parent, tss: tss,
		res: &Result{Src: src, Dst: dst, Online: opts.Online, Major: major, Port: opts.Port,
			SystemIdentifier: strconv.FormatUint(cd.SystemIdentifier, 10), Methods: map[clone.Method]int64{},
			Phases: map[string]time.Duration{}}}
	if opts.User != nil {
		b.owner = opts.User.Owner()
	}
	if err := b.run(ctx, cd); err != nil {
		b.cleanup()
		if ctx.Err() != nil && errs.KindOf(err) != errs.Interrupted {
			err = errs.Wrap(errs.Interrupted, err, "clone interrupted; nothing was left at the destination")
		}
		return nil, err
	}
	b.res.Elapsed = time.Since(t0)
	return b.res, nil
}

// checkDestination refuses a destination that overlaps the source's
// tablespaces or already exists (after removing what crashed clones to it
// left), and a --config-dir the source does not need.
func checkDestination(opts Options, src, dst string, tss []pgdata.Tablespace) error {
	for _, ts := range tss {
		if ts.Target == "" {
			continue
		}
		if !filepath.IsAbs(ts.Target) {
			return errs.New(errs.Unsupported, "tablespace %s links to a relative path %q", ts.OID, ts.Target).WithPath(src).
				WithHint("PostgreSQL writes absolute tablespace links; repoint pg_tblspc/%s to an absolute path", ts.OID)
		}
		if fsutil.Within(dst, ts.Target) || fsutil.Within(ts.Target, dst) || fsutil.Within(TablespaceDir(dst), ts.Target) {
			return errs.New(errs.Usage, "the destination overlaps the source's tablespace %s (%s)", ts.OID, ts.Target).WithPath(dst).
				WithHint("choose a destination outside the source's data and tablespace directories")
		}
	}
	if opts.ConfigDir != "" {
		if pgdata.HasOwnConfig(src) {
			return errs.New(errs.Usage, "the source has its own postgresql.conf; a configuration directory is for clusters whose configuration lives elsewhere").WithPath(src).
				WithHint("do not give a configuration directory").WithCLI("drop --config-dir")
		}
		if _, err := pgdata.ConfigInDir(opts.ConfigDir, src, "--config-dir"); err != nil {
			return err
		}
	}
	_ = CleanStale(dst)
	if _, err := os.Lstat(dst); err == nil {
		return errs.New(errs.Exists, "the destination already exists").WithPath(dst).
			WithHint("choose a new destination, or remove this one first")
	}
	needTS := false
	for _, ts := range tss {
		needTS = needTS || ts.Target != ""
	}
	if needTS {
		if _, err := os.Lstat(TablespaceDir(dst)); err == nil {
			return errs.New(errs.Exists, "the clone's tablespace directory already exists").WithPath(TablespaceDir(dst)).
				WithHint("the source has tablespaces, which the clone keeps in %s: remove it or choose another destination", TablespaceDir(dst))
		}
	}
	return nil
}

// checkSourceState reads the source's control data and refuses a source in
// the wrong state: running for an offline clone (or not cleanly shut down),
// stopped for an online one.
func checkSourceState(ctx context.Context, opts Options, src string) (*pgdata.ControlData, error) {
	inst := opts.Installation
	cd, err := pgdata.ReadControlData(ctx, inst.BinDir, src, inst.Env())
	if err != nil {
		return nil, err
	}
	pid, running, err := pgdata.Running(src)
	if err != nil {
		return nil, err
	}
	if !opts.Online {
		if running {
			return nil, errs.New(errs.Busy, "the source is running (postmaster pid %d); an offline clone needs it stopped", pid).WithPath(src).
				WithHint("stop it cleanly first (pg_ctl -D %s stop -m fast), or clone it online while it runs", src).WithCLI("--online")
		}
		if !cd.CleanShutdown() {
			return nil, errs.New(errs.Busy, "the source was not shut down cleanly (pg_controldata says %q), so its files may be inconsistent", cd.State).WithPath(src).
				WithHint("start it and stop it cleanly (pg_ctl -D %s start, then pg_ctl -D %s stop -m fast), then clone again", src, src)
		}
	} else if !running {
		e := errs.New(errs.Usage, "an online clone needs the source running, but no server runs on it").WithPath(src).
			WithHint("start it, or give a connection URL if it runs elsewhere").WithCLI("--url")
		if cd.CleanShutdown() {
			e = e.WithHint("it is cleanly shut down: clone it offline").WithCLI("without --online")
		}
		return nil, e
	}

	return cd, nil
}

// build is one clone in progress.
type build struct {
	opts              Options
	src, dst, parent  string
	tss               []pgdata.Tablespace
	owner             *clone.Owner
	data, tsStage     *staged
	rootMode          fs.FileMode         // the source data directory's mode, given to the clone last
	config            *pgdata.ConfigFiles // found by asking the source
	tsRenamed, placed bool
	res               *Result
	phaseStart        time.Time
}

// phase ends the current phase under name and starts the next.
func (b *build) phase(name string) {
	now := time.Now()
	b.res.Phases[name] += now.Sub(b.phaseStart)
	b.phaseStart = now
}

func (b *build) run(ctx context.Context, cd *pgdata.ControlData) error {
	var err error
	b.phaseStart = time.Now()
	if b.data, err = newStaged(b.parent, filepath.Base(b.dst)); err != nil {
		return err
	}
	var sess *backupSession
	defer func() { sess.close() }()
	if b.opts.Online {
		sess, err = b.startBackup(ctx)
		if err != nil {
			return err
		}
		b.phase("backup start")
	}
	srcWAL, err := b.copyData(ctx)
	if err != nil {
		return err
	}
	b.phase("copy")
	newTarget, err := b.copyTablespaces(ctx)
	if err != nil {
		return err
	}

	if b.opts.Online {
		if err := b.finishOnline(ctx, sess, srcWAL, newTarget); err != nil {
			return err
		}
		sess.close()
		sess = nil
	} else if err := b.checkStillStopped(ctx, cd); err != nil {
		return err
	}

	if err := b.copyConfig(); err != nil {
		return err
	}
	if err := pgdata.ResetForClone(b.data.path, pgdata.ResetOptions{Port: b.opts.Port}); err != nil {
		return err
	}
	if b.opts.Sync != clone.SyncNone {
		for _, d := range []string{b.data.path, filepath.Join(b.data.path, "pg_tblspc"), filepath.Join(b.data.path, "pg_wal")} {
			if err := fsutil.SyncDir(d); err != nil {
				return errs.FromOS(err, d, "cannot sync the clone")
			}
		}
	}
	err = b.place(ctx)
	b.phase("finish")
	return err
}

// startBackup opens the session that holds the online backup (psql as the
// cluster's owner, or pgx) and starts the backup. It returns the session
// even on error, so that the caller closes it.
func (b *build) startBackup(ctx context.Context) (*backupSession, error) {
	var err error
	conn := b.opts.ConnString
	if conn == "" {
		if conn, err = DefaultConnString(b.src); err != nil {
			return nil, err
		}
	}
	var sess *backupSession
	if u, ok := useOwnerSession(b.opts.ConnString, b.src); ok {
		c, err := connectPsql(ctx, b.opts.Installation, u, b.src)
		if err != nil {
			return sess, err
		}
		if sess, err = newBackupSession(ctx, c, b.src); err != nil {
			return sess, err
		}
		b.res.BackupUser = u.Name
	} else if sess, err = openBackupSession(ctx, conn, b.src); err != nil {
		return sess, err
	}
	if b.opts.ConfigDir == "" && !pgdata.HasOwnConfig(b.src) {
		if b.config, err = sess.configFiles(ctx); err != nil {
			if ctx.Err() != nil {
				return sess, err
			}
			b.res.Warnings = append(b.res.Warnings, fmt.Sprintf("cannot ask the source where its configuration is: %v", err))
		}
	}
	sess.holdWAL(ctx)
	label := b.opts.Label
	if label == "" {
		label = "pgfork clone to " + b.dst
	}
	if len(label) > 1000 {
		label = label[:1000]
	}
	if _, err := sess.startBackup(ctx, label); err != nil {
		return sess, err
	}
	return sess, nil
}

// copyData copies the data directory into the staging directory and
// returns the source's WAL directory (resolved when pg_wal is a symlink).
func (b *build) copyData(ctx context.Context) (string, error) {
	// The data directory. A pg_wal that is a symlink (initdb --waldir) is
	// not copied as a link (the clone would write into the source's WAL):
	// the clone gets a pg_wal directory of its own.
	srcWAL := filepath.Join(b.src, "pg_wal")
	walLink := false
	if fi, err := os.Lstat(srcWAL); err == nil && fi.Mode()&fs.ModeSymlink != 0 {
		walLink = true
		if srcWAL, err = filepath.EvalSymlinks(srcWAL); err != nil {
			return "", errs.Wrap(errs.Internal, err, "cannot resolve the source's pg_wal link").WithPath(b.src)
		}
		// Online, the WAL is read later by its segments' names: the
		// directory is checked here as offline copies check it.
		f, err := pgdata.OpenLinkedDir(b.src, "pg_wal", srcWAL)
		if err != nil {
			return "", err
		}
		f.Close()
	}
	filter := clone.Filter(pgdata.Filter)
	if b.opts.Online {
		filter = pgdata.OnlineFilter
	}
	base := filter
	filter = func(rel string, d fs.DirEntry) clone.Action {
		if walLink && rel == "pg_wal" {
			return clone.Skip
		}
		return base(rel, d)
	}
	// The staging directory itself stays root's and private until place
	// hands it over: WAL, backup_label and configuration are written into
	// it after the copy, where the clone's user must not reach (issue 19,
	// F4b).
	if fi, err := os.Stat(b.src); err == nil {
		b.rootMode = fi.Mode().Perm()
	}
	if err := b.copyTree(ctx, "data", b.src, b.data.path, filter, true); err != nil {
		return "", err
	}
	if walLink {
		wal := filepath.Join(b.data.path, "pg_wal")
		if err := b.mkdir(wal); err != nil {
			return "", err
		}
		if !b.opts.Online {
			if err := b.copyLinked(ctx, "wal", "pg_wal", srcWAL, wal, nil); err != nil {
				return "", err
			}
		}
	}
	if err := b.mkdir(filepath.Join(b.data.path, "pg_wal", "archive_status")); err != nil {
		return "", err
	}
	return srcWAL, nil
}

// copyTablespaces copies the source's tablespaces beside the destination,
// links the clone to them and returns where each one now lives, by OID.
func (b *build) copyTablespaces(ctx context.Context) (map[string]string, error) {
	var err error
	// Tablespaces, beside the destination.
	newTarget := map[string]string{}
	for _, ts := range b.tss {
		if ts.Target == "" {
			continue // in place: copied with the data directory
		}
		if b.tsStage == nil {
			if b.tsStage, err = newStaged(b.parent, filepath.Base(TablespaceDir(b.dst))); err != nil {
				return nil, err
			}
			if err := os.WriteFile(filepath.Join(b.tsStage.path, incompleteMarker), []byte("pgfork clone in progress\n"), 0o600); err != nil {
				return nil, errs.FromOS(err, b.tsStage.path, "cannot mark the tablespace copy as incomplete")
			}
			// Root's and 0700 until place hands it over.
		}
		dir := filepath.Join(b.tsStage.path, ts.OID)
		if err := os.Mkdir(dir, 0o700); err != nil {
			return nil, errs.FromOS(err, dir, "cannot create the tablespace copy")
		}
		if err := b.copyLinked(ctx, "tablespace "+ts.OID, "pg_tblspc/"+ts.OID, ts.Target, dir, pgdata.TablespaceFilter); err != nil {
			return nil, err
		}
		final := filepath.Join(TablespaceDir(b.dst), ts.OID)
		link := filepath.Join(b.data.path, "pg_tblspc", ts.OID)
		if err := os.Symlink(final, link); err != nil {
			return nil, errs.FromOS(err, link, "cannot link the clone to its tablespace copy")
		}
		if b.owner != nil {
			if err := os.Lchown(link, b.owner.UID, b.owner.GID); err != nil {
				return nil, errs.FromOS(err, link, "cannot set the owner of the tablespace link")
			}
		}
		newTarget[ts.OID] = final
		b.res.Tablespaces = append(b.res.Tablespaces, TablespaceCopy{OID: ts.OID, Source: ts.Target, Target: final})
		b.phase("tablespaces")
	}
	return newTarget, nil
}

// copyConfig copies the source's configuration into the clone when it
// lives outside the source's data directory: from --config-dir, else where
// the running source said, else the Debian layout. Found nowhere, the clone
// has none and the result says so.
func (b *build) copyConfig() error {
	if pgdata.HasOwnConfig(b.src) {
		return nil
	}
	cf := b.config
	var err error
	switch {
	case b.opts.ConfigDir != "":
		if cf, err = pgdata.ConfigInDir(b.opts.ConfigDir, b.src, "--config-dir"); err != nil {
			return err
		}
	case cf == nil:
		if dir := pgdata.DebianConfigDir(b.src); dir != "" {
			if cf, err = pgdata.ConfigInDir(dir, b.src, "Debian layout"); err != nil {
				b.res.Warnings = append(b.res.Warnings, fmt.Sprintf("%s looks like this cluster's configuration but is not usable: %v", dir, err))
				cf = nil
			}
		}
	}
	if cf == nil {
		b.res.NoConfig = true
		return nil
	}
	cc, err := pgdata.CopyConfig(*cf, b.data.path, b.owner)
	if err != nil {
		return err
	}
	b.res.Config = cc
	b.res.Warnings = append(b.res.Warnings, cc.Warnings...)
	return nil
}

// copyLinked copies the directory the source's link (pg_tblspc/OID,
// pg_wal) points to, target, into dst: opened and checked by
// pgdata.OpenLinkedDir (it must be the source's owner's, writable by no
// one else), then read through its descriptor only.
func (b *build) copyLinked(ctx context.Context, phase, link, target, dst string, filter clone.Filter) error {
	f, err := pgdata.OpenLinkedDir(b.src, link, target)
	if err != nil {
		return err
	}
	defer f.Close()
	return b.copyTree(ctx, phase, "/proc/self/fd/"+strconv.Itoa(int(f.Fd())), dst, filter, false)
}

// copyTree copies src into the existing empty directory dst and adds the
// copy's summary to the result. With private, dst itself keeps its owner
// and mode (a staging directory: root's, 0700) for place to hand over.
func (b *build) copyTree(ctx context.Context, phase, src, dst string, filter clone.Filter, private bool) error {
	var onProgress func(clone.Progress)
	if b.opts.OnProgress != nil {
		onProgress = func(p clone.Progress) { b.opts.OnProgress(Progress{Phase: phase, Progress: p}) }
	}
	sum, err := clone.CopyInto(ctx, src, dst, clone.Options{
		Method: b.opts.Method, Jobs: b.opts.Jobs, Sync: b.opts.Sync, Filter: filter,
		Owner: b.owner, TolerateVanished: b.opts.Online, OnProgress: onProgress, KeepRootPrivate: private,
	})
	if err != nil {
		return err
	}
	r := b.res
	r.Files += sum.Files
	r.Bytes += sum.Bytes
	r.SharedBytes += sum.SharedBytes
	r.Vanished += sum.Vanished
	r.Sync = sum.Sync
	for m, n := range sum.Methods {
		r.Methods[m] += n
	}
	return nil
}

// testHookBeforeWAL, when set (tests only), runs in an online clone after
// the data directory is copied, before the WAL is written into staging.
var testHookBeforeWAL func(staging string)

// finishOnline stops the backup on the same session, writes backup_label
// and tablespace_map, and copies the WAL from the backup's start to its stop.
func (b *build) finishOnline(ctx context.Context, sess *backupSession, srcWAL string, newTarget map[string]string) error {
	br, err := sess.stopBackup(ctx)
	if err != nil {
		return err
	}
	b.phase("backup stop")
	bl, err := pgdata.ParseBackupLabel("", []byte(br.LabelFile))
	if err != nil {
		return errs.Wrap(errs.Internal, err, "cannot read the backup label the source returned").
			WithHint("the source server returned a backup_label pgfork does not understand; clone it offline (stopped cleanly) instead, and report this")
	}
	b.res.StartLSN, b.res.StopLSN = bl.StartLSN.String(), br.StopLSN.String()
	b.res.Warnings = append(b.res.Warnings, sess.warnings...)

	plan, err := planWAL(srcWAL, bl.StartTLI, bl.StartLSN, br.StopLSN, sess.segSize)
	if err != nil {
		return err
	}
	var own *uidgid
	if b.owner != nil {
		own = &uidgid{b.owner.UID, b.owner.GID}
	}
	if testHookBeforeWAL != nil {
		testHookBeforeWAL(b.data.path)
	}
	n, err := copyWAL(ctx, srcWAL, filepath.Join(b.data.path, "pg_wal"), plan, own, b.opts.Sync != clone.SyncNone)
	if err != nil {
		return err
	}
	b.phase("wal")
	b.res.WALFiles, b.res.WALBytes = len(plan.Segments)+len(plan.History), n
	b.res.Files += int64(b.res.WALFiles)
	b.res.Bytes += n

	if err := b.writeFile("backup_label", br.LabelFile); err != nil {
		return err
	}
	if strings.TrimSpace(br.SpcMapFile) != "" {
		m, err := rewriteTablespaceMap(br.SpcMapFile, newTarget)
		if err != nil {
			return err
		}
		if err := b.writeFile("tablespace_map", m); err != nil {
			return err
		}
	}
	return nil
}

// rewriteTablespaceMap points every entry of a tablespace_map at the
// clone's copy: left as the source wrote it, the clone's first start would
// recreate its links to the source's tablespaces and write into them.
func rewriteTablespaceMap(m string, newTarget map[string]string) (string, error) {
	var out strings.Builder
	for _, line := range strings.Split(m, "\n") {
		if line == "" {
			continue
		}
		oid, _, ok := strings.Cut(line, " ")
		t, known := newTarget[oid]
		if !ok || !known {
			return "", errs.New(errs.Internal, "the backup's tablespace map names tablespace %q, which was not copied (created during the copy?)", oid).
				WithHint("clone again; do not create tablespaces while cloning")
		}
		out.WriteString(oid + " ")
		for _, c := range t {
			if c == '\n' || c == '\r' || c == '\\' {
				out.WriteByte('\\')
			}
			out.WriteRune(c)
		}
		out.WriteByte('\n')
	}
	return out.String(), nil
}

// checkStillStopped makes sure the source did not start while it was
// copied: its files would then be inconsistent.
func (b *build) checkStillStopped(ctx context.Context, before *pgdata.ControlData) error {
	pid, running, err := pgdata.Running(b.src)
	if err != nil {
		return err
	}
	after, err := pgdata.ReadControlData(ctx, b.opts.Installation.BinDir, b.src, b.opts.Installation.Env())
	if err != nil {
		return err
	}
	if running || !after.CleanShutdown() || after.CheckpointLocation != before.CheckpointLocation {
		msg := "the source was started while it was being copied, so the copy is inconsistent"
		if running {
			msg = fmt.Sprintf("%s (postmaster pid %d)", msg, pid)
		}
		return errs.New(errs.Busy, "%s", msg).WithPath(b.src).
			WithHint("keep the source stopped while cloning, or clone it online while it runs").WithCLI("--online")
	}
	return nil
}

// place renames the tablespace copies, then the data directory, into place.
func (b *build) place(ctx context.Context) error {
	if err := ctx.Err(); err != nil {
		return errs.Wrap(errs.Interrupted, err, "clone interrupted")
	}
	uid, gid := -1, -1
	if b.owner != nil {
		uid, gid = b.owner.UID, b.owner.GID
	}
	// Hand the staging directories over last, by descriptor, and check
	// their names still are the directories built.
	if b.tsStage != nil {
		if err := clone.HandOver(b.tsStage.path, uid, gid, 0o700); err != nil {
			return errs.FromOS(err, b.tsStage.path, "cannot give the tablespace copies to their OS user")
		}
		if err := clone.SameDir(b.tsStage.path, b.tsStage.built); err != nil {
			return err
		}
	}
	mode := b.rootMode
	if mode == 0 {
		mode = 0o700
	}
	if err := clone.HandOver(b.data.path, uid, gid, mode); err != nil {
		return errs.FromOS(err, b.data.path, "cannot give the clone to its OS user")
	}
	if err := clone.SameDir(b.data.path, b.data.built); err != nil {
		return err
	}
	if b.tsStage != nil {
		if err := fsutil.RenameNoReplace(b.tsStage.path, TablespaceDir(b.dst)); err != nil {
			if errors.Is(err, fs.ErrExist) {
				return errs.New(errs.Exists, "the clone's tablespace directory appeared while cloning").WithPath(TablespaceDir(b.dst)).
					WithHint("choose another destination")
			}
			return errs.FromOS(err, TablespaceDir(b.dst), "cannot move the tablespace copies into place")
		}
		b.tsRenamed = true
	}
	if err := fsutil.RenameNoReplace(b.data.path, b.dst); err != nil {
		if errors.Is(err, fs.ErrExist) {
			return errs.New(errs.Exists, "the destination appeared while cloning").WithPath(b.dst).
				WithHint("choose another destination")
		}
		return errs.FromOS(err, b.dst, "cannot move the clone into place")
	}
	b.placed = true
	if b.tsStage != nil {
		_ = os.Remove(filepath.Join(TablespaceDir(b.dst), incompleteMarker))
		b.tsStage.release()
	}
	b.data.release()
	if b.opts.Sync != clone.SyncNone {
		if err := fsutil.SyncDir(b.parent); err != nil {
			return errs.FromOS(err, b.parent, "cannot sync the destination's parent directory")
		}
	}
	return nil
}

// cleanup removes everything a failed clone built.
func (b *build) cleanup() {
	if b.placed {
		return
	}
	if b.data != nil {
		_ = fsutil.RemoveAll(b.data.path)
		b.data.release()
	}
	if b.tsStage != nil {
		if b.tsRenamed {
			_ = fsutil.RemoveAll(TablespaceDir(b.dst))
		} else {
			_ = fsutil.RemoveAll(b.tsStage.path)
		}
		b.tsStage.release()
	}
}

// mkdir makes p, a directory inside the clone's data directory, and gives
// it to the clone's owner, relative to the data directory's descriptor
// (os.Root): a component swapped for a symlink that leaves the data
// directory is refused, never followed (issue 19 F4b).
func (b *build) mkdir(p string) error {
	r, rel, err := b.dataRoot(p)
	if err != nil {
		return err
	}
	defer r.Close()
	if err := r.Mkdir(rel, 0o700); err != nil && !errors.Is(err, fs.ErrExist) {
		return errs.FromOS(err, p, "cannot create a directory in the clone")
	}
	if b.owner != nil {
		if err := r.Lchown(rel, b.owner.UID, b.owner.GID); err != nil {
			return errs.FromOS(err, p, "cannot give the clone to its OS user")
		}
	}
	return nil
}

// dataRoot opens the clone's data directory as an os.Root and returns p
// relative to it.
func (b *build) dataRoot(p string) (*os.Root, string, error) {
	rel, err := filepath.Rel(b.data.path, p)
	if err != nil || !filepath.IsLocal(rel) {
		return nil, "", errs.New(errs.Internal, "%s is not inside the clone's data directory %s", p, b.data.path)
	}
	r, err := os.OpenRoot(b.data.path)
	if err != nil {
		return nil, "", errs.FromOS(err, b.data.path, "cannot open the clone's data directory")
	}
	return r, rel, nil
}

// writeFile writes a small file into the clone (0600, owned like the clone).
func (b *build) writeFile(name, content string) error {
	p := filepath.Join(b.data.path, name)
	r, rel, err := b.dataRoot(p)
	if err != nil {
		return err
	}
	defer r.Close()
	f, err := r.OpenFile(rel, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return errs.FromOS(err, p, "cannot write %s", name)
	}
	_, err = f.WriteString(content)
	if err == nil && b.opts.Sync != clone.SyncNone {
		err = f.Sync()
	}
	if err == nil && b.owner != nil {
		err = f.Chown(b.owner.UID, b.owner.GID)
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return errs.FromOS(err, p, "cannot write %s", name)
	}
	return nil
}

// checkPaths resolves src and dst and refuses overlapping ones.
func checkPaths(src, dst string) (string, string, error) {
	if src == "" || dst == "" {
		return "", "", errs.New(errs.Usage, "a clone needs a source and a destination").WithCLI("pgfork clone SRC DST")
	}
	s, err := filepath.Abs(src)
	if err != nil {
		return "", "", errs.Wrap(errs.Usage, err, "bad source path").WithPath(src)
	}
	d, err := filepath.Abs(dst)
	if err != nil {
		return "", "", errs.Wrap(errs.Usage, err, "bad destination path").WithPath(dst)
	}
	if rs, err := filepath.EvalSymlinks(s); err == nil {
		s = rs
	}
	rd := d
	if rp, err := filepath.EvalSymlinks(filepath.Dir(d)); err == nil {
		rd = filepath.Join(rp, filepath.Base(d))
	}
	if fsutil.Within(rd, s) || fsutil.Within(s, rd) {
		return "", "", errs.New(errs.Usage, "the destination overlaps the source").WithPath(d).
			WithHint("choose a destination outside the source data directory (and not containing it)")
	}
	return s, d, nil
}

// within reports whether p is dir or inside it.
