package branches

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pgfork/pgfork/cluster"
	"github.com/pgfork/pgfork/instance"
	"github.com/pgfork/pgfork/internal/errs"
	"github.com/pgfork/pgfork/internal/fsutil"
	"github.com/pgfork/pgfork/internal/proc"
	"github.com/pgfork/pgfork/internal/safefs"
	"github.com/pgfork/pgfork/pgdata"
)

// SourceStandby is a physical standby of a remote primary that the Manager
// makes (pg_basebackup -R) on its volume and keeps running: snapshots are
// online clones of it, the primary is never touched again.
const SourceStandby = "standby"

// kindStandby is the registry kind of a standby source's server.
const kindStandby = "standby"

func (m *Manager) standbyDir(name string) string { return filepath.Join(m.dir, "standby", name) }

// standbyTablespaces is the directory that holds the standby's copies of
// its primary's tablespaces (one directory per tablespace OID), beside its
// data directory.
func (m *Manager) standbyTablespaces(name string) string {
	return filepath.Join(m.dir, "standby", name+".tblspc")
}

// standbyPassfile is the libpq password file of the standby of source
// name (its primary's password), beside its data directory: never in it,
// so that no snapshot or branch carries it.
func (m *Manager) standbyPassfile(name string) string {
	return filepath.Join(m.dir, "standby", name+".pgpass")
}

func standbyReg(name string) string { return "standby." + name }

// ensureStandby makes the standby of s if it does not exist yet (a base
// backup of the primary with its replication settings, built in a private
// directory and renamed when complete) and starts it if it is not running.
//
// The base backup runs as the run-as user with a minimal environment
// (never as root) and maps each tablespace of the primary into
// standbyTablespaces: a primary's tablespace paths name nothing on this
// host. The primary's password goes into standbyPassfile (mode 0600, the
// run-as user's), never into the data directory: pg_basebackup -R's
// primary_conninfo is rewritten to name the passfile instead, as is the
// primary_conninfo of a standby made by an earlier pgfork.
func (m *Manager) ensureStandby(ctx context.Context, s Source) error {
	base := filepath.Join(m.dir, "standby")
	if err := mkdirPrivate(base); err != nil {
		return err
	}
	dir := m.standbyDir(s.Name)
	// A base backup killed mid-way leaves a partial directory: removed.
	if ents, err := os.ReadDir(base); err == nil {
		for _, e := range ents {
			if strings.HasPrefix(e.Name(), ".partial-"+s.Name+"-") {
				_ = removeBelow(base, e.Name())
			}
		}
	}
	url, password, err := pgdata.SplitPassword(s.PrimaryURL)
	if err != nil {
		return errs.Wrap(errs.Usage, err, "bad primary URL of source %q", s.Name)
	}
	if password == "" {
		// Not on serve's command line (docs/SECURITY.md, rule 2): where
		// libpq finds it for pgfork's user (passfile= in the URL,
		// PGPASSFILE, ~/.pgpass, PGPASSWORD).
		if cfg, err := pgconn.ParseConfig(s.PrimaryURL); err == nil {
			password = cfg.Password
		}
	}
	passfile, err := m.writePassfile(s.Name, password)
	if err != nil {
		return err
	}
	if _, err := os.Stat(filepath.Join(dir, "PG_VERSION")); err != nil {
		if err := m.baseBackup(ctx, s, url, passfile); err != nil {
			return err
		}
	} else if err := m.secureConninfo(dir, passfile); err != nil {
		return err
	}
	if e, err := cluster.Get(m.o.Layout, standbyReg(s.Name)); err == nil && e.State == cluster.Running {
		return nil
	}
	_ = cluster.Down(ctx, m.o.Layout, standbyReg(s.Name), cluster.DownOptions{KeepData: true, Timeout: 10 * time.Second})
	inst := m.o.Installation
	_, err = cluster.StartBranch(ctx, m.o.Layout, cluster.BranchOptions{Name: standbyReg(s.Name), DataDir: dir,
		Kind: kindStandby, Source: "standby of " + s.Name, BinDir: inst.BinDir, Env: inst.Env(), PGVersion: inst.Version,
		PGMajor: inst.Major, User: m.o.User, StartTimeout: 10 * time.Minute})
	return err
}

// baseBackup makes the standby's data directory: pg_basebackup -R of the
// primary (url has no password: it comes from passfile) as the run-as
// user into a private directory of that user, its tablespaces mapped into
// standbyTablespaces, then the primary's settings and a primary_conninfo
// without password, then the rename into place.
func (m *Manager) baseBackup(ctx context.Context, s Source, url, passfile string) error {
	base := filepath.Join(m.dir, "standby")
	_ = removeBelow(base, s.Name)
	_ = removeBelow(base, filepath.Base(m.standbyTablespaces(s.Name)))
	settings, tablespaces, err := readPrimary(ctx, s.PrimaryURL)
	if err != nil {
		return errs.Wrap(errs.KindOf(err), err, "cannot read the primary of source %q", s.Name)
	}
	tmp := filepath.Join(base, ".partial-"+s.Name+"-"+fsutil.RandomTag())
	fail := func(err error) error {
		_ = removeBelow(base, filepath.Base(tmp))
		_ = removeBelow(base, filepath.Base(m.standbyTablespaces(s.Name)))
		return err
	}
	if err := os.Mkdir(tmp, 0o700); err != nil {
		return errs.FromOS(err, tmp, "cannot create the standby's directory")
	}
	if err := m.o.User.MkdirOwned(tmp, 0o700); err != nil {
		return fail(errs.FromOS(err, tmp, "cannot give the standby's directory to its user"))
	}
	args := []string{"-d", url, "-D", tmp, "-Fp", "-X", "stream", "-R", "-c", "fast"}
	if len(tablespaces) > 0 {
		tsDir := m.standbyTablespaces(s.Name)
		if err := os.Mkdir(tsDir, 0o700); err != nil {
			return fail(errs.FromOS(err, tsDir, "cannot create the standby's tablespace directory"))
		}
		if err := m.o.User.MkdirOwned(tsDir, 0o700); err != nil {
			return fail(errs.FromOS(err, tsDir, "cannot give the standby's tablespace directory to its user"))
		}
		for oid, loc := range tablespaces {
			args = append(args, "-T", escapeMapping(loc)+"="+escapeMapping(filepath.Join(tsDir, oid)))
		}
	}
	env := m.o.Installation.Env()
	if passfile != "" {
		env = append(env, "PGPASSFILE="+passfile)
	}
	cmd := m.o.User.Command(ctx, env, m.o.Installation.Tool("pg_basebackup"), args...)
	// pg_basebackup dies with serve: a kill -9 must not leave it
	// writing into a directory nobody will rename.
	proc.DieWithParent(cmd)
	if out, err := cmd.CombinedOutput(); err != nil {
		return fail(errs.Wrap(errs.Internal, err, "pg_basebackup of source %q failed: %s", s.Name, strings.TrimSpace(string(out))).
			WithHint("check the primary's URL, its REPLICATION role and pg_hba.conf"))
	}
	// A tablespace created on the primary after it was read would have
	// been written at the primary's path (as the run-as user, which mostly
	// cannot): refused, the next start tries again.
	tss, err := pgdata.Tablespaces(tmp)
	if err != nil {
		return fail(err)
	}
	for _, ts := range tss {
		if !ts.InPlace && !fsutil.Within(ts.Target, m.standbyTablespaces(s.Name)) {
			return fail(errs.New(errs.Busy, "tablespace %s of source %q was created during its base backup, at %s", ts.OID, s.Name, ts.Target).
				WithHint("start again: the next base backup maps it into the standby's directory"))
		}
	}
	if err := m.finishStandbyConf(tmp, passfile, settings); err != nil {
		return fail(errs.Wrap(errs.KindOf(err), err, "cannot give the standby of source %q its settings", s.Name))
	}
	if err := os.Rename(tmp, m.standbyDir(s.Name)); err != nil {
		return fail(errs.FromOS(err, m.standbyDir(s.Name), "cannot put the standby in place"))
	}
	return nil
}

// escapeMapping escapes = in a path of pg_basebackup's -T OLD=NEW.
func escapeMapping(p string) string { return strings.ReplaceAll(p, "=", `\=`) }

// writePassfile writes the standby's password file (standbyPassfile, mode
// 0600, the run-as user's) with password, or removes it when there is no
// password; it returns its path, or "" when there is none. The standby
// directory is root's (0711): the file is written under a new name and
// renamed over the old.
func (m *Manager) writePassfile(name, password string) (string, error) {
	p := m.standbyPassfile(name)
	if password == "" {
		if err := os.Remove(p); err != nil && !os.IsNotExist(err) {
			return "", errs.FromOS(err, p, "cannot remove the standby's password file")
		}
		return "", nil
	}
	tmp := p + ".new-" + fsutil.RandomTag()
	f, err := os.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_EXCL|syscall.O_NOFOLLOW, 0o600)
	if err != nil {
		return "", errs.FromOS(err, tmp, "cannot write the standby's password file")
	}
	_, err = f.WriteString(pgdata.PassfileLine(password))
	if o := m.o.User; err == nil && o != nil {
		err = f.Chown(o.UID, o.GID)
	}
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp, p)
	}
	if err != nil {
		_ = os.Remove(tmp)
		return "", errs.FromOS(err, p, "cannot write the standby's password file")
	}
	return p, nil
}

// finishStandbyConf rewrites the base backup's postgresql.auto.conf in
// dir (the run-as user's) with the user's rights: primary_conninfo
// without the password pg_basebackup -R put there (naming passfile
// instead), then the primary's hot-standby settings.
func (m *Manager) finishStandbyConf(dir, passfile, settings string) error {
	text, err := m.readAutoConf(dir)
	if err != nil {
		return err
	}
	text, _, err = pgdata.WithoutPassword(text, passfile)
	if err != nil {
		return err
	}
	return instance.WriteFileAs(filepath.Join(dir, "postgresql.auto.conf"), m.o.User, []byte(text+settings))
}

// secureConninfo moves a password out of the primary_conninfo of an
// existing standby (one an earlier pgfork made with pg_basebackup -R) and
// makes it name passfile; it leaves a standby without one alone.
func (m *Manager) secureConninfo(dir, passfile string) error {
	text, err := m.readAutoConf(dir)
	if err != nil {
		return err
	}
	out, _, err := pgdata.WithoutPassword(text, passfile)
	if err != nil || out == text {
		return err
	}
	return instance.WriteFileAs(filepath.Join(dir, "postgresql.auto.conf"), m.o.User, []byte(out))
}

// readAutoConf reads dir's postgresql.auto.conf without following a
// symlink.
func (m *Manager) readAutoConf(dir string) (string, error) {
	d, err := safefs.OpenDir(dir)
	if err != nil {
		return "", errs.FromOS(err, dir, "cannot open the standby's data directory")
	}
	defer d.Close()
	b, err := d.ReadFile("postgresql.auto.conf", 1<<20)
	if err != nil {
		return "", errs.FromOS(err, filepath.Join(dir, "postgresql.auto.conf"), "cannot read the standby's settings")
	}
	return string(b), nil
}

// hotStandbySettings are the settings a hot standby refuses to start with
// below its primary's (PostgreSQL's "insufficient parameter settings").
var hotStandbySettings = []string{"max_connections", "max_worker_processes", "max_wal_senders",
	"max_prepared_transactions", "max_locks_per_transaction"}

// readPrimary reads, over a normal connection of the primary's URL, its
// hotStandbySettings as lines for postgresql.auto.conf (a primary started
// with, say, -c max_wal_senders=20, not in the configuration files the
// base backup copies, would otherwise leave a standby that does not
// start), and its tablespaces outside its data directory (OID → path).
func readPrimary(ctx context.Context, primaryURL string) (settings string, tablespaces map[string]string, err error) {
	cfg, err := pgx.ParseConfig(primaryURL)
	if err != nil {
		return "", nil, errs.Wrap(errs.Usage, err, "bad primary URL")
	}
	delete(cfg.RuntimeParams, "replication")
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	c, err := pgx.ConnectConfig(ctx, cfg)
	if err != nil {
		return "", nil, errs.Wrap(errs.Internal, err, "cannot connect to the primary to read its settings").
			WithHint("the primary's URL must also allow a normal connection (pg_hba.conf), not only replication")
	}
	defer c.Close(context.WithoutCancel(ctx))
	var b strings.Builder
	b.WriteString("\n# pgfork: the primary's values, which a hot standby needs at least\n")
	for _, name := range hotStandbySettings {
		var v string
		if err := c.QueryRow(ctx, "SELECT setting FROM pg_settings WHERE name = $1", name).Scan(&v); err != nil {
			return "", nil, errs.Wrap(errs.Internal, err, "cannot read the primary's %s", name)
		}
		b.WriteString(name + " = " + pgdata.QuoteConf(v) + "\n")
	}
	rows, err := c.Query(ctx, "SELECT oid::text, pg_tablespace_location(oid) FROM pg_tablespace")
	if err != nil {
		return "", nil, errs.Wrap(errs.Internal, err, "cannot read the primary's tablespaces")
	}
	tablespaces = map[string]string{}
	for rows.Next() {
		var oid, loc string
		if err := rows.Scan(&oid, &loc); err != nil {
			return "", nil, errs.Wrap(errs.Internal, err, "cannot read the primary's tablespaces")
		}
		if _, err := strconv.ParseUint(oid, 10, 32); err != nil {
			return "", nil, errs.New(errs.Internal, "the primary names a tablespace by %q, not an OID", oid)
		}
		if filepath.IsAbs(loc) { // pg_default, pg_global and in-place ones: in the data directory
			tablespaces[oid] = loc
		}
	}
	if err := rows.Err(); err != nil {
		return "", nil, errs.Wrap(errs.Internal, err, "cannot read the primary's tablespaces")
	}
	return b.String(), tablespaces, nil
}

// Lag is how far a standby source is behind its primary: the WAL its
// primary wrote that it has not replayed yet, and for how long (the age of
// the last transaction it replayed while it is behind; 0 once caught up),
// and whether it streams from its primary.
type Lag struct {
	Bytes int64 `json:"bytes"`
	// Seconds is null while behind if no transaction was replayed since
	// the standby started (nothing to date the lag by).
	Seconds *float64 `json:"seconds"`
	// Streaming is true while the standby's WAL receiver streams from its
	// primary. A standby that does not for longer than a short grace
	// period has Error set: its branches stay at the last WAL it got.
	Streaming bool `json:"streaming"`
	// Error says why the lag is unknown (the standby or the primary
	// cannot be reached; Bytes and Seconds are then meaningless), or that
	// the standby is not streaming (Bytes and Seconds then say how far
	// behind it is, as far as it can be told).
	Error string `json:"error,omitempty"`
	// measured is true when Bytes and Seconds hold a measure.
	measured bool
}

// NotStreaming begins the Error of a standby's Lag when it does not
// stream from its primary.
const NotStreaming = "not streaming"

// notStreamingGrace is how long a standby may go without streaming (a
// WAL receiver that restarts, a primary that restarts) before it is
// reported as not streaming.
var notStreamingGrace = 15 * time.Second

// StandbyLag measures how far the standby source name is behind: its
// replay position against the primary's current WAL position (asked of the
// primary; when the primary cannot be reached, the newest position the
// primary reported to the standby's WAL receiver). A standby whose WAL
// receiver has not been streaming for notStreamingGrace (since it started,
// or since it was last seen streaming) gets an Error saying so, with the
// last error of its server log.
func (m *Manager) StandbyLag(ctx context.Context, name string) (Lag, error) {
	s, ok := m.source(name)
	if !ok || s.Kind != SourceStandby {
		return Lag{}, errs.New(errs.NotFound, "no standby source named %q", name)
	}
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	e, err := cluster.Get(m.o.Layout, standbyReg(name))
	if err != nil {
		return Lag{}, err
	}
	sock := &instance.Instance{SocketDir: e.SocketDir, Port: e.Port}
	sc, err := pgx.Connect(ctx, sock.ConnString(m.o.SuperUser, "postgres"))
	if err != nil {
		return Lag{}, errs.Wrap(errs.Internal, err, "cannot reach the standby of source %q", name)
	}
	defer sc.Close(context.WithoutCancel(ctx))
	var replay, reported, status *string
	var age *float64
	var uptime float64
	if err := sc.QueryRow(ctx, `SELECT pg_last_wal_replay_lsn()::text,
		extract(epoch FROM now() - pg_last_xact_replay_timestamp())::float8,
		(SELECT latest_end_lsn::text FROM pg_stat_wal_receiver),
		(SELECT status FROM pg_stat_wal_receiver),
		extract(epoch FROM now() - pg_postmaster_start_time())::float8`).Scan(&replay, &age, &reported, &status, &uptime); err != nil {
		return Lag{}, errs.Wrap(errs.Internal, err, "cannot read the standby's replay position (source %q)", name)
	}
	lag := Lag{Streaming: status != nil && *status == "streaming"}
	now := time.Now()
	if lag.Streaming {
		m.streamSeen.Store(name, now)
	} else {
		since := now.Add(-time.Duration(uptime * float64(time.Second)))
		if v, ok := m.streamSeen.Load(name); ok && v.(time.Time).After(since) {
			since = v.(time.Time)
		}
		if d := now.Sub(since); d > notStreamingGrace {
			lag.Error = fmt.Sprintf(NotStreaming+" from its primary for %s: branches of the source stay at the WAL it last received",
				d.Round(time.Second))
			if why := lastLogError(m.standbyDir(name)); why != "" {
				lag.Error += "; its server log says: " + why
			}
		}
	}
	if replay == nil {
		if lag.Error != "" {
			return lag, nil
		}
		return Lag{}, errs.New(errs.Internal, "the standby of source %q has replayed nothing yet", name)
	}
	var primary string
	if pc, err := pgx.Connect(ctx, s.PrimaryURL); err == nil {
		err = pc.QueryRow(ctx, "SELECT pg_current_wal_lsn()::text").Scan(&primary)
		pc.Close(context.WithoutCancel(ctx))
		if err != nil {
			primary = ""
		}
	}
	if primary == "" {
		if reported == nil {
			if lag.Error != "" {
				return lag, nil
			}
			return Lag{}, errs.New(errs.Internal, "neither the primary of source %q nor its standby's WAL receiver tells its position", name).
				WithHint("check that the primary is up and reachable")
		}
		primary = *reported
	}
	if err := sc.QueryRow(ctx, "SELECT greatest(pg_wal_lsn_diff($1::pg_lsn, $2::pg_lsn), 0)::bigint", primary, *replay).Scan(&lag.Bytes); err != nil {
		return Lag{}, errs.Wrap(errs.Internal, err, "cannot compare WAL positions %s and %s", primary, *replay)
	}
	lag.measured = true
	zero := 0.0
	switch {
	case lag.Bytes == 0:
		lag.Seconds = &zero
	case age != nil:
		a := max(*age, 0)
		lag.Seconds = &a
	}
	return lag, nil
}

// lastLogError returns the last FATAL or ERROR line of the server log in
// dataDir (its last 64 KiB, read without following a symlink), shortened.
func lastLogError(dataDir string) string {
	d, err := safefs.OpenDir(dataDir)
	if err != nil {
		return ""
	}
	defer d.Close()
	f, err := d.OpenRegular(instance.LogFileName)
	if err != nil {
		return ""
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return ""
	}
	const tail = 64 << 10
	off := max(fi.Size()-tail, 0)
	b := make([]byte, fi.Size()-off)
	n, _ := f.ReadAt(b, off)
	lines := strings.Split(string(b[:n]), "\n")
	for i := len(lines) - 1; i >= 0; i-- {
		l := lines[i]
		if j := strings.Index(l, "FATAL:"); j >= 0 {
			l = l[j:]
		} else if j := strings.Index(l, "ERROR:"); j >= 0 {
			l = l[j:]
		} else {
			continue
		}
		if len(l) > 300 {
			l = l[:300] + "…"
		}
		return strings.TrimSpace(l)
	}
	return ""
}

// sourcesWithLag is Sources with each standby's lag measured.
func (m *Manager) sourcesWithLag(ctx context.Context) []Source {
	srcs := m.Sources()
	for i, s := range srcs {
		if s.Kind != SourceStandby {
			continue
		}
		lag, err := m.StandbyLag(ctx, s.Name)
		if err != nil {
			lag = Lag{Error: err.Error()}
		}
		srcs[i].Lag = &lag
	}
	return srcs
}
