package serve

import (
	"context"
	"errors"
	"log/slog"
	"net"
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/pgfork/pgfork/instance"
	"github.com/pgfork/pgfork/internal/errs"
	"github.com/pgfork/pgfork/internal/statedir"
	"github.com/pgfork/pgfork/pgbin"
	"github.com/pgfork/pgfork/pool"
	"github.com/pgfork/pgfork/server"
	"github.com/pgfork/pgfork/server/managed"
)

// Isolation modes of Options.Isolation.
const (
	IsolationDatabase = "database" // a database per test, in one server
	IsolationCluster  = "cluster"  // a whole cluster per test
)

// Options shape Run. The caller (the CLI) has checked them: ranges, the
// token's form, the allow-list parsed.
type Options struct {
	// Layout is pgfork's state directory; one Run at a time holds it
	// (LockState).
	Layout statedir.Layout
	// Listen is the TCP address of the HTTP API (HOST:PORT).
	Listen string
	// Socket, when set, is a Unix socket the API is served on too (0600).
	Socket string
	// Token, when set, is required of every client (server.Config.Token);
	// Branches need one.
	Token string
	// AllowFrom, when set, admits clients from these networks only
	// (loopback always).
	AllowFrom []*net.IPNet
	// AllowedHosts are host names clients reach the server by, admitted
	// in Host without a token (server.Config.AllowedHosts); the listen
	// address's host, when a name, is added.
	AllowedHosts []string
	// MaxConns bounds open HTTP connections.
	MaxConns int

	// Isolation is IsolationDatabase or IsolationCluster.
	Isolation string
	// ExternalURL names an external server (a superuser or a CREATEDB
	// role) for IsolationDatabase; "" runs the managed server.
	ExternalURL string
	// CanClone says the external server's data directory shares blocks.
	CanClone bool
	// Copies is how the managed mode makes test copies (Copies*; "": auto).
	Copies string
	// Strategy is how test databases are created (dbstore.Strategy*).
	Strategy string
	// Manager configures the pools (Observer is set by Run: its metrics).
	Manager pool.ManagerConfig
	// PoolGiven, when set, says which of Manager's pool sizes the user
	// chose: in database isolation the others are picked from the
	// server's filesystem and the cores (pool.DefaultSizes). Nil: as given.
	PoolGiven *pool.Given
	// Role and Password: the role clients get (defaults per mode);
	// RoleGiven says the caller chose Role explicitly (not an inherited
	// environment default). LeastPrivilege: a CREATEDB role, not a
	// superuser, in the managed server.
	Role, Password string
	RoleGiven      bool
	LeastPrivilege bool
	// FindPG finds the PostgreSQL build and the OS user it runs as, for
	// the modes that run PostgreSQL themselves; called only by them.
	FindPG func() (pgbin.Installation, *instance.OSUser, error)

	// Why says why this mode was chosen, for the log.
	Why string
	// Log receives the server's log; nil: discarded.
	Log *slog.Logger
	// OnInfo is told what is started and stopped; nil: silent.
	OnInfo func(msg string)
	// OnReady is called once the API listens.
	OnReady func(Ready)
	// Branches, when set, serves branches of its sources too
	// (/api/v2/branches, the page on /ui; see serve/branches.go).
	Branches *BranchOptions
	// Lifetime, when set, ends Run (cleanly, as when ctx is done) once the
	// process that started serve exits or its lease is let go.
	Lifetime Lifetime
}

// Ready is what Run tells OnReady once it listens.
type Ready struct {
	Listen    net.Addr
	Socket    string
	Isolation string
	// Conn is what clients get (in cluster isolation: the host of the
	// clusters; each test gets a port of its own).
	Conn pool.ConnInfo
	// Owner is the role that owns test databases (the superuser handed
	// out in cluster isolation).
	Owner string
	// Copies is CopiesClusters when the managed mode gives each test a
	// cloned cluster (Conn's port is then 0: each test gets its own).
	Copies string
}

// Run serves the pools of o until ctx is done or the HTTP server fails:
// it takes the state directory (LockState), opens the mode's Backend,
// listens on o.Listen (and o.Socket), serves, then shuts the HTTP server
// down and closes the Backend (dropping test copies, stopping what it
// runs) on every exit path. Once ctx is done both happen at once and
// within about 2 s (shutdown.go): the HTTP server gives requests in
// progress httpGrace, then closes every connection.
func Run(ctx context.Context, o Options) error {
	// With branches the pools take the admin token only (issue 57, rule
	// 1): without one serve does not start, whatever it listens on.
	if err := server.RequireAdminToken(o.Token, o.Branches != nil); err != nil {
		return err
	}
	log := o.Log
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	if o.OnInfo == nil {
		o.OnInfo = func(string) {}
	}
	ctx, stopLife := o.Lifetime.watch(ctx, o.OnInfo)
	defer stopLife()
	err := run(ctx, o, log)
	if err != nil && lifetimeOver(ctx) {
		// Ended while starting: what it started is released, nothing failed.
		log.Info("stopped while starting", "err", err)
		return nil
	}
	return err
}

// run is Run once the lifetime is watched.
func run(ctx context.Context, o Options, log *slog.Logger) error {
	reg := prometheus.NewRegistry()
	metrics := server.NewMetrics(reg)
	o.Manager.Observer = metrics
	// One serve per state directory: a second one would take the first
	// one's managed PostgreSQL away (issue 19, F19).
	release, err := LockState(o.Layout, o.Listen)
	if err != nil {
		return err
	}
	defer release()
	b, err := openBackend(ctx, o, log)
	if err != nil {
		return err
	}
	// Every exit path from here drops the test copies and stops what the
	// backend runs (after the HTTP server's shutdown below).
	b.onInfo = o.OnInfo
	closeBackend := func() {
		sctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if err := b.Close(sctx); err != nil {
			log.Warn("shutting down the backend", "err", err)
		}
	}
	defer closeBackend()
	if b.Sized != "" {
		o.OnInfo(b.Sized)
	}
	cfg := server.Config{Manager: b.Manager, Conn: b.Conn, Token: o.Token, AllowFrom: o.AllowFrom, AllowedHosts: o.AllowedHosts,
		Logger: log, Registry: reg, Metrics: metrics, SocketDir: b.SocketDir}
	if h, _, err := net.SplitHostPort(o.Listen); err == nil && h != "" && net.ParseIP(h) == nil {
		cfg.AllowedHosts = append(cfg.AllowedHosts[:len(cfg.AllowedHosts):len(cfg.AllowedHosts)], h)
	}
	if o.Branches != nil {
		// The branches keep running when serve stops: the next Run finds them.
		bm, err := openBranches(ctx, o)
		if err != nil {
			return err
		}
		defer bm.Close()
		if o.Branches.LeaveStopped {
			// Runs before Close, after the HTTP server is shut down.
			defer func() {
				sctx, cancel := context.WithTimeout(context.Background(), time.Minute)
				defer cancel()
				bm.StopAll(sctx)
			}()
		}
		reg.MustRegister(bm.Collector())
		ectx, stopExpiry := context.WithCancel(ctx)
		defer stopExpiry()
		go expireBranches(ectx, bm, o.Branches.Idle)
		for _, sch := range o.Branches.Schedules {
			go snapshotOnSchedule(ectx, bm, sch, log)
		}
		cfg.Branches, cfg.BranchTokens = branchAPI{bm}, append(append([]string(nil), o.Branches.Tokens...), o.Branches.AdminTokens...)
	}
	srv := server.New(cfg)
	hopts := server.HTTPOptions{LongestWait: o.Manager.FinalizeTimeout + o.Manager.GetTimeout, MaxConns: o.MaxConns, Allowed: srv.AllowsIP}
	hs := server.NewHTTPServer(srv, hopts)

	if !server.IsLoopback(o.Listen) && o.Token == "" && len(o.AllowFrom) == 0 {
		log.Warn("INSECURE: listening beyond loopback with no token and no allow-list; anyone who reaches this port can create, read and drop its databases", "listen", o.Listen)
	}
	ln, err := net.Listen("tcp", o.Listen)
	if err != nil {
		return errs.Wrap(errs.Busy, err, "cannot listen on %s", o.Listen).WithHint("choose another port").WithCLI("--listen HOST:PORT")
	}
	recordOwner(o.Layout, ln.Addr().String())
	errc := make(chan error, 2)
	go func() { errc <- hs.Serve(hopts.Listen(ln)) }()
	if o.Socket != "" {
		sl, err := server.ListenUnix(o.Socket)
		if err != nil {
			_ = hs.Close()
			return err
		}
		defer sl.Close() // removes the socket
		go func() { errc <- hs.Serve(hopts.Listen(sl)) }()
	}
	if o.OnReady != nil {
		o.OnReady(Ready{Listen: ln.Addr(), Socket: o.Socket, Isolation: o.Isolation, Conn: b.Conn, Owner: b.Owner, Copies: b.Copies})
	}
	select {
	case <-ctx.Done():
		o.OnInfo("shutting down")
	case err := <-errc:
		if err != nil && !errors.Is(err, http.ErrServerClosed) {
			return errs.Wrap(errs.Internal, err, "HTTP server failed")
		}
	}
	// The pools close while the HTTP server winds down: requests waiting
	// for a database are answered 503 at once, and nothing waits for an
	// idle connection (shutdown.go).
	closed := make(chan struct{})
	go func() { defer close(closed); closeBackend() }()
	shutdownHTTP(hs)
	<-closed
	return nil
}

// openBackend opens the Backend of o's mode: a cluster per test, the
// managed PostgreSQL (no external server named), or the external server.
func openBackend(ctx context.Context, o Options, log *slog.Logger) (*Backend, error) {
	db := DBOptions{Strategy: o.Strategy, MaxConns: int32(2*o.Manager.Parallel + 8), Given: o.PoolGiven}
	if o.Manager.MaxDiskBytes == pool.MaxDiskAuto && (o.ExternalURL != "" || o.Isolation == IsolationCluster) {
		// An external server's disk is not ours to measure, and a cluster
		// per test is bounded by its pool's size: no default cap.
		o.Manager.MaxDiskBytes = 0
	}
	switch {
	case o.Isolation == IsolationCluster:
		pg, user, err := o.FindPG()
		if err != nil {
			return nil, err
		}
		log.Info("running a PostgreSQL cluster per test: "+pg.String(), "because", o.Why)
		return NewClusterIsolation(ctx, ClusterOptions{Manager: o.Manager, Layout: o.Layout, PG: pg, User: user,
			Role: o.Role, Password: o.Password, OnInfo: o.OnInfo})
	case o.ExternalURL == "":
		if o.Role == managed.BootstrapRole && !o.RoleGiven {
			// IntegreSQL's usual INTEGRESQL_TEST_PGUSER=postgres: the managed
			// cluster's own superuser, which pgfork never hands out or alters.
			log.Warn("INTEGRESQL_TEST_PGUSER names the managed cluster's bootstrap superuser; handing out the managed superuser role instead",
				"role", managed.DefaultRole)
			o.Role, o.Password = "", ""
		}
		pg, user, err := o.FindPG()
		if err != nil {
			log.Info("running pgfork's own (managed) PostgreSQL server", "because", o.Why)
			return nil, err
		}
		log.Info("running pgfork's own (managed) PostgreSQL server: "+pg.String(), "because", o.Why)
		return NewManaged(ctx, ManagedOptions{Manager: o.Manager, DB: db, Layout: o.Layout, PG: pg, User: user,
			Role: o.Role, Password: o.Password, LeastPrivilege: o.LeastPrivilege, Copies: o.Copies, OnInfo: o.OnInfo})
	default:
		conn, err := ParseConn(o.ExternalURL)
		if err != nil {
			return nil, err
		}
		admin := conn.Username
		if o.Role != "" {
			conn.Username, conn.Password = o.Role, o.Password
		}
		log.Info("using an external PostgreSQL server", "host", conn.Host, "port", conn.Port, "user", admin, "because", o.Why)
		// pgfork cannot see an external server's filesystem: the caller says.
		return NewExternal(ctx, ExternalOptions{Manager: o.Manager, DB: db, AdminURL: o.ExternalURL, Conn: conn, CanClone: o.CanClone})
	}
}
