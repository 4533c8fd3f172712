// Package managed runs the PostgreSQL server that `pgfork serve` manages
// itself when no external server is given: created on first use, kept
// across restarts, its client role and password made sure of.
package managed

import (
	"context"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgfork/pgfork/instance"
	"github.com/pgfork/pgfork/internal/errs"
	"github.com/pgfork/pgfork/internal/proc"
	"github.com/pgfork/pgfork/internal/secret"
	"github.com/pgfork/pgfork/pgdata"
	"github.com/pgfork/pgfork/pool"
)

// DefaultRole is the role a managed cluster hands out to clients.
const DefaultRole = "pgfork"

// BootstrapRole is the managed cluster's bootstrap superuser (initdb -U).
const BootstrapRole = "postgres"

// Options describe the PostgreSQL server that `pgfork serve` runs
// itself when no --pg-url is given.
type Options struct {
	BinDir string
	Env    []string
	Dir    string // holds pgdata/ and the client role's password; kept across restarts
	User   *instance.OSUser
	Clone  bool   // set file_copy_method = clone (PostgreSQL 18 on a CoW filesystem)
	Role   string // client role (default DefaultRole), password-authenticated
	// LeastPrivilege makes the client role a non-superuser that may create
	// databases; by default it is a superuser of this private cluster, as
	// IntegreSQL's users usually connect (CREATE EXTENSION, CREATE ROLE…).
	LeastPrivilege bool
	// Password of the client role; empty: a random one kept in Dir.
	Password string
	Settings map[string]string
}

// Server is a running managed server.
type Server struct {
	Inst     *instance.Instance
	AdminURL string // superuser over the private Unix socket
	Conn     pool.ConnInfo
}

// Start creates the cluster on first use (initdb; host connections
// need a password), starts it on 127.0.0.1 with the test profile (on the
// port of its last start when that is free, else on a free one), and
// makes sure the client role exists with its password.
func Start(ctx context.Context, o Options) (*Server, error) {
	if o.Role == "" {
		o.Role = DefaultRole
	}
	if o.Role == BootstrapRole {
		return nil, errs.New(errs.Usage, "role %q is the managed cluster's bootstrap superuser; pgfork does not hand it out or change it", o.Role).
			WithHint("leave the test user unset: the managed cluster hands out its own superuser role %q", DefaultRole)
	}
	data := filepath.Join(o.Dir, "pgdata")
	if err := os.MkdirAll(o.Dir, 0o755); err != nil {
		return nil, errs.Wrap(errs.OSKind(err), err, "cannot create %s", o.Dir)
	}
	if _, err := os.Stat(filepath.Join(data, "PG_VERSION")); err != nil {
		_ = os.RemoveAll(data) // a half-made cluster from an interrupted first start
		if err := instance.InitDB(ctx, instance.InitOptions{BinDir: o.BinDir, Env: o.Env, DataDir: data, User: o.User, NoSync: true}); err != nil {
			return nil, err
		}
		// The superuser connects only over the private socket; TCP clients
		// (the test databases' users) must give a password.
		hba := "local all all trust\nhost all all 127.0.0.1/32 scram-sha-256\nhost all all ::1/128 scram-sha-256\n"
		// Written with the server user's rights: its superusers (serve's
		// clients) own the data directory's files, and root must not
		// follow a pg_hba.conf they replaced by a symlink.
		if err := instance.WriteFileAs(filepath.Join(data, "pg_hba.conf"), o.User, []byte(hba)); err != nil {
			return nil, err
		}
	}
	if err := recoverLeftover(ctx, data); err != nil {
		return nil, err
	}
	pw := o.Password
	if pw == "" {
		var err error
		if pw, err = secret.Password(filepath.Join(o.Dir, "password")); err != nil {
			return nil, err
		}
	}
	settings := map[string]string{"max_connections": "300", "password_encryption": "scram-sha-256"}
	if o.Clone {
		settings["file_copy_method"] = "clone"
	}
	for k, v := range o.Settings {
		settings[k] = v
	}
	// The port of the last start when it is free (printed URLs stay
	// right across a restart); else, or if it is taken meanwhile, a free one.
	cfg := instance.Config{BinDir: o.BinDir, Env: o.Env, DataDir: data, User: o.User,
		TCP: true, Profile: instance.Test, Settings: settings, Port: previousPort(o.Dir)}
	inst, err := instance.Start(ctx, cfg)
	if err != nil && cfg.Port != 0 && ctx.Err() == nil {
		cfg.Port = 0
		inst, err = instance.Start(ctx, cfg)
	}
	if err != nil {
		return nil, err
	}
	rememberPort(o.Dir, inst.Port)
	// The superuser goes over the private socket (trust); TCP needs passwords.
	q := url.Values{"host": {inst.SocketDir}, "port": {strconv.Itoa(inst.Port)}, "user": {"postgres"}}
	m := &Server{Inst: inst, AdminURL: "postgres:///postgres?" + instance.EncodeQuery(q),
		Conn: pool.ConnInfo{Host: "127.0.0.1", Port: inst.Port, Username: o.Role, Password: pw}}
	if err := EnsureRole(ctx, m.AdminURL, o.Role, pw, !o.LeastPrivilege); err != nil {
		_ = inst.Stop(context.Background(), instance.Fast)
		return nil, err
	}
	return m, nil
}

// Dir is where the managed server of a PostgreSQL major lives below base
// (<state>/serve): base/<major>, holding pgdata/ and the client role's
// password. Each major has its own cluster, so one state directory serves
// any major: `serve --pg 15` after `serve --pg 18` starts 15's own cluster
// (a data directory of another major cannot be started, and an upgrade of a
// cache of test templates is not worth its time).
func Dir(base string, major int) string { return filepath.Join(base, strconv.Itoa(major)) }

// MoveLegacy moves the managed server of the layout before Dir (base/pgdata
// and base/password, one major for the whole state directory) to Dir(base,
// its major), stopping a server a killed serve left running on it first
// (recoverLeftover's rules). It does nothing when there is none, or when
// that major's directory exists already.
func MoveLegacy(ctx context.Context, base string) error {
	// A move a crash cut short after its first rename is finished.
	if ents, err := os.ReadDir(base); err == nil {
		for _, e := range ents {
			if n, ok := strings.CutSuffix(e.Name(), ".moving"); ok && e.IsDir() {
				if _, err := os.Lstat(filepath.Join(base, n)); os.IsNotExist(err) {
					if _, err := os.Stat(filepath.Join(base, e.Name(), "pgdata", "PG_VERSION")); err == nil {
						_ = os.Rename(filepath.Join(base, e.Name()), filepath.Join(base, n))
					}
				}
			}
		}
	}
	old := filepath.Join(base, "pgdata")
	major, err := pgdata.Version(old)
	if err != nil {
		return nil // no legacy cluster (or not one to move)
	}
	dst := Dir(base, major)
	if _, err := os.Lstat(dst); err == nil {
		return nil
	}
	if err := recoverLeftover(ctx, old); err != nil {
		return err
	}
	if _, err := os.Stat(filepath.Join(old, "postmaster.pid")); err == nil {
		return errs.New(errs.Busy, "a server still runs on %s", old).WithPath(old).
			WithHint("stop it, then start pgfork serve again")
	}
	tmp := dst + ".moving"
	_ = os.RemoveAll(tmp)
	if err := os.Mkdir(tmp, 0o755); err != nil {
		return errs.FromOS(err, tmp, "cannot move the managed server to its major's directory")
	}
	if err := os.Rename(old, filepath.Join(tmp, "pgdata")); err != nil {
		return errs.FromOS(err, old, "cannot move the managed server to its major's directory")
	}
	if err := os.Rename(filepath.Join(base, "password"), filepath.Join(tmp, "password")); err != nil && !os.IsNotExist(err) {
		return errs.FromOS(err, base, "cannot move the managed server's password")
	}
	if err := os.Rename(tmp, dst); err != nil {
		return errs.FromOS(err, dst, "cannot move the managed server to its major's directory")
	}
	return nil
}

// recoverLeftover stops the postmaster a killed `pgfork serve` left running
// on data, so the managed cluster starts again with its data and state, and
// removes the private socket directory it used. Only a process that
// instance.Attach proves to be that postmaster is signalled (pidfd, owner,
// executable, working directory); a pid file naming anything else is never
// acted on by a signal: a live stranger under a reused pid means the
// postmaster that wrote the file is gone, so the stale file is removed (as
// PostgreSQL would refuse to start while it names a live process), and a
// pid that cannot be a process makes the start fail with what to do.
func recoverLeftover(ctx context.Context, data string) error {
	pf, err := instance.ReadPidFile(data)
	if err != nil {
		return nil // no pid file, or one PostgreSQL rewrites itself
	}
	if !proc.Valid(pf.Pid) {
		return errs.New(errs.Busy, "postmaster.pid names pid %d, which cannot be a process", pf.Pid).WithPath(data).
			WithHint("make sure no server runs on this data directory, then remove postmaster.pid")
	}
	if inst, err := instance.Attach(data); err == nil {
		sctx, cancel := context.WithTimeout(ctx, time.Minute)
		defer cancel()
		if err := inst.Stop(sctx, instance.Fast); err != nil {
			return errs.Wrap(errs.Busy, err, "the leftover server (pid %d) does not stop", pf.Pid).WithPath(data)
		}
	} else if proc.Alive(pf.Pid) {
		if err := os.Remove(filepath.Join(data, "postmaster.pid")); err != nil && !os.IsNotExist(err) {
			return errs.FromOS(err, data, "cannot remove the stale postmaster.pid")
		}
	}
	// instance.Start makes the socket directory as <tmp>/pgfork-*; the
	// leftover's is removed only when it is one of those and its server is gone.
	if _, err := os.Stat(filepath.Join(data, "postmaster.pid")); err != nil && pf.SocketDir != "" &&
		filepath.Dir(pf.SocketDir) == filepath.Clean(os.TempDir()) && strings.HasPrefix(filepath.Base(pf.SocketDir), "pgfork-") {
		_ = os.RemoveAll(pf.SocketDir)
	}
	return nil
}

// Stop stops the managed server cleanly.
func (m *Server) Stop(ctx context.Context) error { return m.Inst.Stop(ctx, instance.Fast) }

// EnsureRole creates (or updates) the login role clients get, with
// password pw: a superuser when superuser is set (the private managed
// cluster, where migrations may create extensions and roles), else a role
// that may create databases but is not a superuser. It never alters the
// cluster's bootstrap superuser (the role that owns the cluster) nor the
// role it connects as: demoting or re-keying either would lock pgfork, and
// everyone else, out of the cluster.
func EnsureRole(ctx context.Context, adminURL, role, pw string, superuser bool) error {
	c, err := pgx.Connect(ctx, adminURL)
	if err != nil {
		return errs.Wrap(errs.Internal, err, "cannot connect to the server")
	}
	defer c.Close(context.Background())
	var (
		exists, bootstrap, self bool
	)
	// The bootstrap superuser has oid 10 (BOOTSTRAP_SUPERUSERID).
	if err := c.QueryRow(ctx, `SELECT count(*) > 0, coalesce(bool_or(oid = 10), false), coalesce(bool_or(rolname = current_user), false)
		FROM pg_roles WHERE rolname = $1`, role).Scan(&exists, &bootstrap, &self); err != nil {
		return errs.Wrap(errs.Internal, err, "cannot read roles")
	}
	if bootstrap || self {
		return errs.New(errs.Usage, "role %q is the cluster's bootstrap superuser; pgfork does not hand it out or change it", role).
			WithHint("leave the test user unset: the managed cluster hands out its own superuser role %q", DefaultRole)
	}
	verb := "ALTER"
	if !exists {
		verb = "CREATE"
	}
	attrs := " LOGIN CREATEDB NOSUPERUSER"
	if superuser {
		attrs = " LOGIN SUPERUSER"
	}
	// Only the SCRAM verifier is sent (the password reaches no server log);
	// a password pgfork generated gets a verifier that costs the clients no
	// noticeable CPU (instance.GeneratedPasswordIterations).
	lit := "'" + strings.ReplaceAll(instance.ScramVerifier(pw), "'", "''") + "'"
	sql := verb + " ROLE " + pgx.Identifier{role}.Sanitize() + attrs + " PASSWORD " + lit
	if _, err := c.Exec(ctx, sql); err != nil {
		return errs.Wrap(errs.Internal, err, "cannot %s role %s", strings.ToLower(verb), role)
	}
	return nil
}
