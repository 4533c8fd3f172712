package main

import (
	"context"
	"errors"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/signal"
	"path/filepath"
	"runtime"
	"strconv"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/spf13/cobra"

	"github.com/pgfork/pgfork/clone"
	"github.com/pgfork/pgfork/instance"
	"github.com/pgfork/pgfork/internal/errs"
	"github.com/pgfork/pgfork/pool"
	"github.com/pgfork/pgfork/server"
)

type serveOpts struct {
	listen, pgURL, token, socket     string
	poolInit, poolMax, maxDatabases  int
	parallel                         int
	isolation, strategy, prefix      string
	finalizeTimeout, getTimeout      time.Duration
	minLifetime                      time.Duration
	testUser, testPassword, rootTmpl string
	verbose, canClone                bool
}

func init() { rootCmd.AddCommand(newServeCmd()) }

// env helpers: IntegreSQL's variables give defaults; flags override them.
func envStr(name, def string) string {
	if v, ok := os.LookupEnv(name); ok && v != "" {
		return v
	}
	return def
}

func envInt(name string, def int) int {
	if v, err := strconv.Atoi(os.Getenv(name)); err == nil {
		return v
	}
	return def
}

func envMS(name string, def time.Duration) time.Duration {
	if v, err := strconv.Atoi(os.Getenv(name)); err == nil && v >= 0 {
		return time.Duration(v) * time.Millisecond
	}
	return def
}

// integresqlPGURL builds a URL from INTEGRESQL_PGHOST/PORT/USER/PASSWORD/
// DATABASE, or returns "" when INTEGRESQL_PGHOST is not set.
func integresqlPGURL() string {
	host := os.Getenv("INTEGRESQL_PGHOST")
	if host == "" {
		return ""
	}
	u := &url.URL{Scheme: "postgres", Host: net.JoinHostPort(host, envStr("INTEGRESQL_PGPORT", "5432")),
		Path: "/" + envStr("INTEGRESQL_PGDATABASE", "postgres")}
	user := envStr("INTEGRESQL_PGUSER", "postgres")
	if pw := os.Getenv("INTEGRESQL_PGPASSWORD"); pw != "" {
		u.User = url.UserPassword(user, pw)
	} else {
		u.User = url.User(user)
	}
	u.RawQuery = "sslmode=disable"
	return u.String()
}

func defaultListen() string {
	addr, port := os.Getenv("INTEGRESQL_ADDRESS"), os.Getenv("INTEGRESQL_PORT")
	if addr == "" && port == "" {
		return "127.0.0.1:5000"
	}
	if addr == "" {
		addr = "127.0.0.1" // IntegreSQL listens on all addresses here; pgfork stays on loopback unless told
	}
	if port == "" {
		port = "5000"
	}
	return net.JoinHostPort(addr, port)
}

func newServeCmd() *cobra.Command {
	n := runtime.NumCPU()
	o := &serveOpts{}
	cmd := &cobra.Command{
		Use:   "serve",
		Short: "Serve pools of ready test databases over IntegreSQL's HTTP API",
		Long: `Serve pools of fresh, migrated test databases over HTTP, speaking IntegreSQL's
v1 API exactly, so IntegreSQL's clients (Go, JavaScript, Python, .NET) work
unchanged. Adds /healthz, Prometheus /metrics, /api/openapi.json, a global
limit on databases across pools, and template state that survives restarts.

Without --pg-url it runs its own PostgreSQL (test profile, data kept under
the state directory, TCP on a free port on 127.0.0.1; PostgreSQL 18 with
file_copy_method=clone when installed and the filesystem reflinks) and stops
it cleanly on SIGINT/SIGTERM. Test databases are owned by a password-
authenticated role that is not a superuser. With --pg-url, --can-clone says
the server's data directory reflinks, so the advisor may clone (PostgreSQL 18).

--isolation cluster gives each test a whole PostgreSQL server instead of a
database, for tests that need a superuser or server settings: the template is
migrated in a cluster of its own, shut down on finalize, and every test
cluster is a copy of it (reflink where possible) started on a free port of
127.0.0.1; the config clients get names that server, with a superuser role.
--pool-max, --parallel and --max-databases then count clusters. All clusters
are stopped on SIGINT/SIGTERM; after a crash, the next start cleans up.

It listens on loopback by default; any other address needs --token, and
clients must then send "Authorization: Bearer <token>".

IntegreSQL's environment variables give defaults (see docs/server.md):
INTEGRESQL_ADDRESS, INTEGRESQL_PORT, INTEGRESQL_PGHOST/PGPORT/PGUSER/
PGPASSWORD/PGDATABASE, INTEGRESQL_TEST_PGUSER/TEST_PGPASSWORD,
INTEGRESQL_ROOT_TEMPLATE, INTEGRESQL_DB_PREFIX,
INTEGRESQL_TEST_INITIAL_POOL_SIZE, INTEGRESQL_TEST_MAX_POOL_SIZE,
INTEGRESQL_POOL_MAX_PARALLEL_TASKS, INTEGRESQL_TEMPLATE_FINALIZE_TIMEOUT_MS,
INTEGRESQL_TEST_DB_GET_TIMEOUT_MS, INTEGRESQL_TEST_DB_MINIMAL_LIFETIME_MS.`,
		Example: `  # Run with its own PostgreSQL on 127.0.0.1:5000
  pgfork serve

  # Use an existing server, share on the network with a token
  pgfork serve --pg-url postgres://postgres:secret@db:5432/postgres --listen 0.0.0.0:5000 --token "$TOKEN"

  # A whole server per test (superuser, own settings)
  pgfork serve --isolation cluster --pool-max 8

  # Point an IntegreSQL client at it
  INTEGRESQL_CLIENT_BASE_URL=http://127.0.0.1:5000/api go test ./...`,
		Args: usageArgs(cobra.NoArgs),
		RunE: func(cmd *cobra.Command, args []string) error { return runServe(cmd.Context(), o) },
	}
	f := cmd.Flags()
	f.StringVar(&o.listen, "listen", defaultListen(), "HTTP address (env INTEGRESQL_ADDRESS, INTEGRESQL_PORT)")
	f.StringVar(&o.pgURL, "pg-url", envStr("PGFORK_PG_URL", integresqlPGURL()), "use this PostgreSQL server (a superuser or CREATEDB role) instead of a managed one (env PGFORK_PG_URL, INTEGRESQL_PG*)")
	f.BoolVar(&o.canClone, "can-clone", false, "with --pg-url: the server's data directory is on a reflink filesystem (XFS, btrfs, ZFS 2.2+), so the advisor may pick clone (PostgreSQL 18, file_copy_method=clone)")
	f.StringVar(&o.token, "token", os.Getenv("PGFORK_TOKEN"), "require 'Authorization: Bearer TOKEN' (env PGFORK_TOKEN); needed off loopback")
	f.StringVar(&o.socket, "socket", "", "also listen on this Unix socket (mode 0600)")
	f.IntVar(&o.poolInit, "pool-init", envInt("INTEGRESQL_TEST_INITIAL_POOL_SIZE", n), "databases each pool keeps ready (env INTEGRESQL_TEST_INITIAL_POOL_SIZE)")
	f.IntVar(&o.poolMax, "pool-max", envInt("INTEGRESQL_TEST_MAX_POOL_SIZE", 4*n), "databases per pool at most (env INTEGRESQL_TEST_MAX_POOL_SIZE)")
	f.IntVar(&o.maxDatabases, "max-databases", envInt("PGFORK_MAX_DATABASES", 0), "test databases across all pools at most; idle pools are evicted LRU first (0: no limit)")
	f.IntVar(&o.parallel, "parallel", envInt("INTEGRESQL_POOL_MAX_PARALLEL_TASKS", n), "concurrent creations per pool (env INTEGRESQL_POOL_MAX_PARALLEL_TASKS)")
	f.StringVar(&o.isolation, "isolation", "database", "database (a database per test) or cluster (a whole server per test, superuser; clusters under <state-dir>/serve-clusters)")
	f.StringVar(&o.strategy, "strategy", "auto", "CREATE DATABASE strategy: auto (the advisor picks), default (no STRATEGY clause, as IntegreSQL), wal_log, file_copy, clone")
	f.StringVar(&o.prefix, "db-prefix", envStr("INTEGRESQL_DB_PREFIX", "pgfork"), "database name prefix (env INTEGRESQL_DB_PREFIX)")
	f.DurationVar(&o.finalizeTimeout, "finalize-timeout", envMS("INTEGRESQL_TEMPLATE_FINALIZE_TIMEOUT_MS", time.Minute), "how long a test request waits for its template to be finalized")
	f.DurationVar(&o.getTimeout, "get-timeout", envMS("INTEGRESQL_TEST_DB_GET_TIMEOUT_MS", time.Minute), "how long a test request waits for a ready database")
	f.DurationVar(&o.minLifetime, "min-lifetime", envMS("INTEGRESQL_TEST_DB_MINIMAL_LIFETIME_MS", 250*time.Millisecond), "when a pool is full, reclaim databases held longer than this with no session (0: never)")
	f.StringVar(&o.testUser, "test-user", os.Getenv("INTEGRESQL_TEST_PGUSER"), "role owning test databases (managed default: pgfork; env INTEGRESQL_TEST_PGUSER)")
	f.StringVar(&o.testPassword, "test-password", os.Getenv("INTEGRESQL_TEST_PGPASSWORD"), "its password (env INTEGRESQL_TEST_PGPASSWORD)")
	f.StringVar(&o.rootTmpl, "root-template", envStr("INTEGRESQL_ROOT_TEMPLATE", "template0"), "database new templates are created from (env INTEGRESQL_ROOT_TEMPLATE)")
	f.BoolVarP(&o.verbose, "verbose", "v", false, "log every request")
	return cmd
}

func runServe(ctx context.Context, o *serveOpts) error {
	if o.isolation != "database" && o.isolation != "cluster" {
		return errs.New(errs.Usage, "bad --isolation %q", o.isolation).WithHint("use database or cluster")
	}
	if o.isolation == "cluster" && o.pgURL != "" {
		return errs.New(errs.Usage, "--isolation cluster runs its own clusters and takes no --pg-url").
			WithHint("drop --pg-url (and INTEGRESQL_PGHOST/PGFORK_PG_URL), or use --isolation database")
	}
	if o.canClone && o.pgURL == "" {
		return errs.New(errs.Usage, "--can-clone is for --pg-url").WithHint("the managed server probes its own filesystem")
	}
	if !pool.ValidStrategy(o.strategy) {
		return errs.New(errs.Usage, "bad --strategy %q", o.strategy).WithHint("use auto, default, wal_log, file_copy or clone")
	}
	if o.poolInit < 0 || o.poolMax < 1 || o.parallel < 1 || o.maxDatabases < 0 {
		return errs.New(errs.Usage, "pool sizes must be positive (--pool-init ≥ 0, --pool-max ≥ 1, --parallel ≥ 1)")
	}
	if _, _, err := net.SplitHostPort(o.listen); err != nil {
		return errs.Wrap(errs.Usage, err, "bad --listen %q", o.listen).WithHint("use HOST:PORT, e.g. 127.0.0.1:5000")
	}
	if !server.IsLoopback(o.listen) && o.token == "" {
		return errs.New(errs.Usage, "--listen %s is not a loopback address and no --token was given", o.listen).
			WithHint("anyone who can reach it could create and drop databases: pass --token (or PGFORK_TOKEN), or listen on 127.0.0.1")
	}
	ctx, stop := signal.NotifyContext(ctx, os.Interrupt, syscall.SIGTERM)
	defer stop()
	level := slog.LevelInfo
	if o.verbose {
		level = slog.LevelDebug
	}
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: level}))

	var (
		adminURL string
		conn     server.ConnInfo
		managed  *server.Managed
		canClone bool
		mgr      *pool.Manager
		err      error
	)
	reg := prometheus.NewRegistry()
	metrics := server.NewMetrics(reg)
	mcfg := pool.ManagerConfig{
		Prefix: o.prefix, Initial: o.poolInit, Max: o.poolMax, Parallel: o.parallel,
		MaxDatabases: o.maxDatabases, MinLifetime: o.minLifetime, FinalizeTimeout: o.finalizeTimeout,
		GetTimeout: o.getTimeout, RootTemplate: o.rootTmpl, Observer: metrics,
	}
	if o.isolation == "cluster" {
		store, err := clusterStore(ctx, o)
		if err != nil {
			return err
		}
		conn = store.Conn()
		mcfg.Owner = store.Role()
		if mgr, err = pool.NewStoreManager(mcfg, store); err != nil {
			return err
		}
	} else if o.pgURL == "" {
		m, cc, err := startManagedPG(ctx, o)
		if err != nil {
			return err
		}
		managed, canClone = m, cc
		defer func() {
			sctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			if err := managed.Stop(sctx); err != nil {
				log.Error("stopping PostgreSQL", "err", err)
			} else {
				infof("PostgreSQL stopped")
			}
		}()
		adminURL, conn = m.AdminURL, m.Conn
	} else {
		u, err := url.Parse(o.pgURL)
		if err != nil || u.Host == "" {
			return errs.New(errs.Usage, "bad --pg-url").WithHint("use postgres://user:password@host:port/postgres")
		}
		adminURL = o.pgURL
		port, _ := strconv.Atoi(u.Port())
		if port == 0 {
			port = 5432
		}
		pw, _ := u.User.Password()
		conn = server.ConnInfo{Host: u.Hostname(), Port: port, Username: u.User.Username(), Password: pw}
		if o.testUser != "" {
			conn.Username, conn.Password = o.testUser, o.testPassword
		}
		// pgfork cannot see an external server's filesystem: the user says.
		canClone = o.canClone
	}
	owner := conn.Username
	if mgr == nil {
		admin, err := server.OpenAdmin(ctx, adminURL, int32(2*o.parallel+8))
		if err != nil {
			return err
		}
		defer admin.Close()
		creator := &pool.SQLCreator{Admin: admin, Strategy: o.strategy, CanClone: canClone}
		if err := creator.Probe(ctx); err != nil {
			return err
		}
		mcfg.Owner = owner
		if mgr, err = pool.NewManager(mcfg, admin, creator); err != nil {
			return err
		}
	}
	if err := mgr.Open(ctx); err != nil {
		return err
	}
	srv := server.New(server.Config{Manager: mgr, Conn: conn, Token: o.token, Logger: log, Registry: reg, Metrics: metrics})
	hs := &http.Server{Handler: srv, ReadHeaderTimeout: 10 * time.Second}

	ln, err := net.Listen("tcp", o.listen)
	if err != nil {
		return errs.Wrap(errs.Busy, err, "cannot listen on %s", o.listen).WithHint("choose another --listen port")
	}
	errc := make(chan error, 2)
	go func() { errc <- hs.Serve(ln) }()
	if o.socket != "" {
		_ = os.Remove(o.socket)
		old := syscall.Umask(0o177)
		sl, err := net.Listen("unix", o.socket)
		syscall.Umask(old)
		if err != nil {
			return errs.Wrap(errs.Permission, err, "cannot listen on %s", o.socket)
		}
		if err := os.Chmod(o.socket, 0o600); err != nil {
			return errs.Wrap(errs.OSKind(err), err, "cannot chmod %s", o.socket)
		}
		defer os.Remove(o.socket)
		go func() { errc <- hs.Serve(sl) }()
	}
	if o.isolation == "cluster" {
		infof("pgfork serve: http://%s/api (a PostgreSQL cluster per test on %s, superuser %s)", ln.Addr(), conn.Host, owner)
	} else {
		infof("pgfork serve: http://%s/api (PostgreSQL on %s:%d, test databases owned by %s)", ln.Addr(), conn.Host, conn.Port, owner)
	}
	if g.json {
		_ = printJSON(os.Stdout, map[string]any{"listen": ln.Addr().String(), "socket": o.socket, "pg_host": conn.Host, "pg_port": conn.Port})
	}
	select {
	case <-ctx.Done():
		infof("shutting down")
	case err := <-errc:
		if err != nil && !errors.Is(err, http.ErrServerClosed) {
			return errs.Wrap(errs.Internal, err, "HTTP server failed")
		}
	}
	sctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	_ = hs.Shutdown(sctx)
	if err := mgr.Close(sctx); err != nil {
		log.Warn("dropping test databases", "err", err)
	}
	return nil
}

// clusterStore prepares cluster isolation: clusters under
// <state>/serve-clusters, the empty base cluster from the template cache.
func clusterStore(ctx context.Context, o *serveOpts) (*server.ClusterStore, error) {
	lay := layout()
	if err := lay.Ensure(); err != nil {
		return nil, errs.FromOS(err, lay.Root, "cannot create the state directory")
	}
	pg, err := findPG()
	if err != nil {
		return nil, err
	}
	user, err := instance.ResolveUser(g.runAs)
	if err != nil {
		return nil, err
	}
	dir := filepath.Join(lay.Root, "serve-clusters")
	infof("a cluster per test: %s, clusters in %s", pg, dir)
	return server.NewClusterStore(server.ClusterOptions{Dir: dir, Layout: lay, PG: pg, User: user,
		Role: o.testUser, Password: o.testPassword})
}

// startManagedPG starts (creating on first use) the server's own PostgreSQL
// under <state>/serve, on PostgreSQL 18 with file_copy_method=clone when
// that is the newest found and the state directory reflinks.
func startManagedPG(ctx context.Context, o *serveOpts) (*server.Managed, bool, error) {
	lay := layout()
	if err := lay.Ensure(); err != nil {
		return nil, false, errs.FromOS(err, lay.Root, "cannot create the state directory")
	}
	inst, err := findPG()
	if err != nil {
		return nil, false, err
	}
	user, err := instance.ResolveUser(g.runAs)
	if err != nil {
		return nil, false, err
	}
	dir := filepath.Join(lay.Root, "serve")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, false, errs.Wrap(errs.OSKind(err), err, "cannot create %s", dir)
	}
	useClone := false
	if inst.Major >= 18 {
		if pr, err := clone.Probe(ctx, dir, dir); err == nil && pr.SharesBlocks {
			useClone = true
		}
	}
	infof("starting %s%s", inst, map[bool]string{true: " with file_copy_method=clone", false: ""}[useClone])
	m, err := server.StartManaged(ctx, server.ManagedOptions{BinDir: inst.BinDir, Env: inst.Env(), Dir: dir, User: user, Clone: useClone, Role: o.testUser})
	if err != nil {
		return nil, false, err
	}
	if o.testPassword != "" {
		m.Conn.Password = o.testPassword
		if err := server.EnsureRole(ctx, m.AdminURL, m.Conn.Username, o.testPassword); err != nil {
			_ = m.Stop(context.Background())
			return nil, false, err
		}
	}
	return m, useClone, nil
}
