package branches

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgfork/pgfork/clone"
	"github.com/pgfork/pgfork/cluster"
	"github.com/pgfork/pgfork/instance"
	"github.com/pgfork/pgfork/internal/errs"
	"github.com/pgfork/pgfork/internal/fsutil"
	"github.com/pgfork/pgfork/internal/proc"
	"github.com/pgfork/pgfork/pgdata"
)

// SourceStandby is a physical standby of a remote primary that the Manager
// makes (pg_basebackup -R) on its volume and keeps running: snapshots are
// online clones of it, the primary is never touched again.
const SourceStandby = "standby"

// kindStandby is the registry kind of a standby source's server.
const kindStandby = "standby"

func (m *Manager) standbyDir(name string) string { return filepath.Join(m.dir, "standby", name) }

func standbyReg(name string) string { return "standby." + name }

// ensureStandby makes the standby of s if it does not exist yet (a base
// backup of the primary with its replication settings, built in a private
// directory and renamed when complete) and starts it if it is not running.
func (m *Manager) ensureStandby(ctx context.Context, s Source) error {
	if err := mkdirPrivate(filepath.Join(m.dir, "standby")); err != nil {
		return err
	}
	dir := m.standbyDir(s.Name)
	// A base backup killed mid-way leaves a partial directory: removed.
	if ents, err := os.ReadDir(filepath.Join(m.dir, "standby")); err == nil {
		for _, e := range ents {
			if strings.HasPrefix(e.Name(), ".partial-"+s.Name+"-") {
				_ = removeBelow(filepath.Join(m.dir, "standby"), e.Name())
			}
		}
	}
	if _, err := os.Stat(filepath.Join(dir, "PG_VERSION")); err != nil {
		_ = removeBelow(filepath.Join(m.dir, "standby"), s.Name)
		tmp := filepath.Join(m.dir, "standby", ".partial-"+s.Name+"-"+fsutil.RandomTag())
		if err := os.Mkdir(tmp, 0o700); err != nil {
			return errs.FromOS(err, tmp, "cannot create the standby's directory")
		}
		cmd := exec.CommandContext(ctx, m.o.Installation.Tool("pg_basebackup"), "-d", s.PrimaryURL, "-D", tmp, "-Fp",
			"-X", "stream", "-R", "-c", "fast")
		cmd.Env = append(os.Environ(), m.o.Installation.Env()...)
		// pg_basebackup dies with serve: a kill -9 must not leave it
		// writing into a directory nobody will rename.
		proc.DieWithParent(cmd)
		if out, err := cmd.CombinedOutput(); err != nil {
			_ = removeBelow(filepath.Join(m.dir, "standby"), filepath.Base(tmp))
			return errs.Wrap(errs.Internal, err, "pg_basebackup of source %q failed: %s", s.Name, strings.TrimSpace(string(out))).
				WithHint("check the primary's URL, its REPLICATION role and pg_hba.conf")
		}
		if err := carryPrimarySettings(ctx, s.PrimaryURL, tmp); err != nil {
			_ = removeBelow(filepath.Join(m.dir, "standby"), filepath.Base(tmp))
			return errs.Wrap(errs.KindOf(err), err, "cannot give the standby of source %q its primary's settings", s.Name)
		}
		if o := m.o.User.Owner(); o != nil {
			if err := clone.ChownTree(tmp, o.UID, o.GID); err != nil {
				_ = removeBelow(filepath.Join(m.dir, "standby"), filepath.Base(tmp))
				return errs.FromOS(err, tmp, "cannot give the standby to its user")
			}
		}
		if err := os.Rename(tmp, dir); err != nil {
			return errs.FromOS(err, dir, "cannot put the standby in place")
		}
	}
	if e, err := cluster.Get(m.o.Layout, standbyReg(s.Name)); err == nil && e.State == cluster.Running {
		return nil
	}
	_ = cluster.Down(ctx, m.o.Layout, standbyReg(s.Name), cluster.DownOptions{KeepData: true, Timeout: 10 * time.Second})
	inst := m.o.Installation
	_, err := cluster.StartBranch(ctx, m.o.Layout, cluster.BranchOptions{Name: standbyReg(s.Name), DataDir: dir,
		Kind: kindStandby, Source: "standby of " + s.Name, BinDir: inst.BinDir, Env: inst.Env(), PGVersion: inst.Version,
		PGMajor: inst.Major, User: m.o.User, StartTimeout: 10 * time.Minute})
	return err
}

// hotStandbySettings are the settings a hot standby refuses to start with
// below its primary's (PostgreSQL's "insufficient parameter settings").
var hotStandbySettings = []string{"max_connections", "max_worker_processes", "max_wal_senders",
	"max_prepared_transactions", "max_locks_per_transaction"}

// carryPrimarySettings reads the primary's hotStandbySettings (over a
// normal connection of its URL) and appends them to the base backup's
// postgresql.auto.conf in dir: a primary started with, say,
// -c max_wal_senders=20 (not in its configuration files, which the base
// backup copies) would otherwise leave a standby that does not start.
func carryPrimarySettings(ctx context.Context, primaryURL, dir string) error {
	cfg, err := pgx.ParseConfig(primaryURL)
	if err != nil {
		return errs.Wrap(errs.Usage, err, "bad primary URL")
	}
	delete(cfg.RuntimeParams, "replication")
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	c, err := pgx.ConnectConfig(ctx, cfg)
	if err != nil {
		return errs.Wrap(errs.Internal, err, "cannot connect to the primary to read its settings").
			WithHint("the primary's URL must also allow a normal connection (pg_hba.conf), not only replication")
	}
	defer c.Close(context.WithoutCancel(ctx))
	var b strings.Builder
	b.WriteString("\n# pgfork: the primary's values, which a hot standby needs at least\n")
	for _, name := range hotStandbySettings {
		var v string
		if err := c.QueryRow(ctx, "SELECT setting FROM pg_settings WHERE name = $1", name).Scan(&v); err != nil {
			return errs.Wrap(errs.Internal, err, "cannot read the primary's %s", name)
		}
		b.WriteString(name + " = " + pgdata.QuoteConf(v) + "\n")
	}
	r, err := os.OpenRoot(dir)
	if err != nil {
		return errs.FromOS(err, dir, "cannot open the standby's directory")
	}
	defer r.Close()
	f, err := r.OpenFile("postgresql.auto.conf", os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o600)
	if err != nil {
		return errs.FromOS(err, filepath.Join(dir, "postgresql.auto.conf"), "cannot write the standby's settings")
	}
	if _, err := f.WriteString(b.String()); err != nil {
		f.Close()
		return errs.FromOS(err, filepath.Join(dir, "postgresql.auto.conf"), "cannot write the standby's settings")
	}
	if err := f.Close(); err != nil {
		return errs.FromOS(err, filepath.Join(dir, "postgresql.auto.conf"), "cannot write the standby's settings")
	}
	return nil
}

// Lag is how far a standby source is behind its primary: the WAL its
// primary wrote that it has not replayed yet, and for how long (the age of
// the last transaction it replayed while it is behind; 0 once caught up).
type Lag struct {
	Bytes int64 `json:"bytes"`
	// Seconds is null while behind if no transaction was replayed since
	// the standby started (nothing to date the lag by).
	Seconds *float64 `json:"seconds"`
	// Error says why the lag is unknown (the standby or the primary
	// cannot be reached); Bytes and Seconds are then meaningless.
	Error string `json:"error,omitempty"`
}

// StandbyLag measures how far the standby source name is behind: its
// replay position against the primary's current WAL position (asked of the
// primary; when the primary cannot be reached, the newest position the
// primary reported to the standby's WAL receiver).
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
	var replay, reported *string
	var age *float64
	if err := sc.QueryRow(ctx, `SELECT pg_last_wal_replay_lsn()::text,
		extract(epoch FROM now() - pg_last_xact_replay_timestamp())::float8,
		(SELECT latest_end_lsn::text FROM pg_stat_wal_receiver)`).Scan(&replay, &age, &reported); err != nil {
		return Lag{}, errs.Wrap(errs.Internal, err, "cannot read the standby's replay position (source %q)", name)
	}
	if replay == nil {
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
			return Lag{}, errs.New(errs.Internal, "neither the primary of source %q nor its standby's WAL receiver tells its position", name).
				WithHint("check that the primary is up and reachable")
		}
		primary = *reported
	}
	var lag Lag
	if err := sc.QueryRow(ctx, "SELECT greatest(pg_wal_lsn_diff($1::pg_lsn, $2::pg_lsn), 0)::bigint", primary, *replay).Scan(&lag.Bytes); err != nil {
		return Lag{}, errs.Wrap(errs.Internal, err, "cannot compare WAL positions %s and %s", primary, *replay)
	}
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
