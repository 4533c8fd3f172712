// Package serve builds what `pgfork serve` serves, one constructor per
// mode: NewManaged (pgfork's own PostgreSQL, databases in it), NewExternal
// (a server given by URL, databases in it) and NewClusterIsolation (a
// cluster per template and per test). Each returns a Backend: an opened
// pool.Manager over the mode's store, the connection info clients get, and
// everything the mode runs, all of it released by Backend.Close. The HTTP
// layer (package server) is handed the Backend's Manager and Conn; it
// knows nothing of the mode.
package serve

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgfork/pgfork/clone"
	"github.com/pgfork/pgfork/instance"
	"github.com/pgfork/pgfork/internal/errs"
	"github.com/pgfork/pgfork/internal/statedir"
	"github.com/pgfork/pgfork/pgbin"
	"github.com/pgfork/pgfork/pool"
	"github.com/pgfork/pgfork/pool/clusterstore"
	"github.com/pgfork/pgfork/pool/dbstore"
	"github.com/pgfork/pgfork/server/managed"
)

// Backend is an opened pool.Manager over one mode's store and what the
// mode runs besides (the admin connection pool, the managed server).
type Backend struct {
	// Manager holds the templates and their pools; it is open.
	Manager *pool.Manager
	// Conn is what clients get in a database's config.
	Conn pool.ConnInfo
	// Owner is the role that owns test databases (the superuser handed out
	// in cluster isolation).
	Owner string
	// SocketDir is the managed server's private Unix socket directory,
	// given to clients on this host that ask for it (server.SocketParam);
	// empty in the other modes.
	SocketDir string
	// Sized says how the pools were sized from the filesystem and the
	// cores, when they were (DBOptions.Given); "" otherwise.
	Sized string
	// Copies is CopiesClusters when the managed mode gives each test a
	// cloned cluster of its own (ManagedOptions.Copies), else "".
	Copies string

	once    sync.Once
	err     error
	closers []func(context.Context) error // run last first
	// drops, in the modes with databases in one server, drops the pools'
	// copies several at once when Close closes the manager (shutdown.go).
	drops *closingDrops
	// onInfo is told what Close left undone; nil: silent.
	onInfo func(string)
}

// Close drops the test copies and closes the manager, then releases what
// the mode runs (the admin pool, then the managed server, given a minute
// of its own to stop). In the modes with databases in one server the
// copies are dropped several at once for at most dropBudget; the next
// start drops what is left. It is safe to call more than once; the first
// error is returned.
func (b *Backend) Close(ctx context.Context) error {
	b.once.Do(func() {
		if b.Manager != nil {
			b.err = b.closeManager(ctx)
		}
		for i := len(b.closers) - 1; i >= 0; i-- {
			if err := b.closers[i](ctx); err != nil && b.err == nil {
				b.err = err
			}
		}
	})
	return b.err
}

// closeManager closes the manager, its pools' copies dropped several at
// once for at most dropBudget when the mode allows (b.drops).
func (b *Backend) closeManager(ctx context.Context) error {
	if b.drops == nil {
		return b.Manager.Close(ctx)
	}
	dctx, cancel := context.WithTimeout(ctx, dropBudget)
	defer cancel()
	b.drops.start(dctx)
	err := b.Manager.Close(ctx)
	summary, derr := b.drops.wait()
	if summary != "" && b.onInfo != nil {
		b.onInfo(summary)
	}
	if err == nil {
		err = derr
	}
	return err
}

// open opens the manager over store; on failure everything the backend
// holds is released.
func (b *Backend) open(ctx context.Context, cfg pool.ManagerConfig, store pool.Store) error {
	mgr, err := pool.NewManager(cfg, store)
	if err != nil {
		_ = store.Close(ctx)
		return err
	}
	b.Manager = mgr
	return mgr.Open(ctx)
}

// fail releases what b holds and returns err.
func (b *Backend) fail(err error) error {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	_ = b.Close(ctx)
	return err
}

// DBOptions are the settings of the modes with databases in one server.
type DBOptions struct {
	// Strategy is how test databases are created (dbstore.Strategy*; ""
	// means auto).
	Strategy string
	// MaxConns bounds the admin connection pool (0: pgx's default).
	MaxConns int32
	// Given, when set, says which pool sizes of the Manager the user chose;
	// the others come from pool.DefaultSizes for whether the server's
	// copies share blocks and the cores. Nil: the Manager's as they are.
	Given *pool.Given
}

// openDB opens the admin pool of adminURL and the manager over
// dbstore.New; canClone tells the strategy advisor the data directory's
// filesystem shares blocks.
func (b *Backend) openDB(ctx context.Context, cfg pool.ManagerConfig, adminURL string, o DBOptions, canClone bool) error {
	admin, err := dbstore.OpenAdmin(ctx, adminURL, o.MaxConns)
	if err != nil {
		return err
	}
	b.closers = append(b.closers, func(context.Context) error { admin.Close(); return nil })
	creator := &dbstore.SQLCreator{Admin: admin, Strategy: o.Strategy, CanClone: canClone}
	b.drops = &closingDrops{SQLCreator: creator}
	if err := creator.Probe(ctx); err != nil {
		return err
	}
	if o.Given != nil {
		shares := creator.SharesBlocks()
		cfg = pool.DefaultSizes(shares, runtime.NumCPU()).Apply(cfg, *o.Given)
		kind := "full copies"
		if shares {
			kind = "clones (reflink, file_copy_method=clone)"
		}
		most := fmt.Sprint(cfg.Max)
		if cfg.LearnDemand && cfg.LearnMax > cfg.Max {
			most = fmt.Sprintf("%d (%d for the demand a run took)", cfg.Max, cfg.LearnMax)
		}
		if dir := creator.DataDir(); !shares && !o.Given.Max && dir != "" {
			// Full copies: each pool holds as many as fit in its share of
			// the free space of the server's data directory (a remote
			// server's path is not ours: statfs fails, Max stays).
			cpus := runtime.NumCPU()
			cfg.MaxBySize = func(size int64) int {
				free, err := clone.FreeBytes(dir)
				if err != nil {
					return 0
				}
				return pool.SpaceMax(free, size, cpus)
			}
			most = fmt.Sprintf("%d (for the demand a run took: %d to %d by the template's size, 1/%d of the free disk)",
				cfg.Max, cfg.Max, pool.DefaultSizes(true, cpus).Learned, pool.SpaceShare)
		}
		b.Sized = fmt.Sprintf("pools: %d ready, at most %s, %d created at once (test databases are %s; %d cores)",
			cfg.Initial, most, cfg.Parallel, kind, runtime.NumCPU())
	}
	cfg.Owner = b.Conn.Username
	return b.open(ctx, cfg, dbstore.New(admin, b.drops))
}

// ManagedOptions shape NewManaged.
type ManagedOptions struct {
	Manager pool.ManagerConfig // Owner is set from the client role
	DB      DBOptions
	// Layout is pgfork's state directory: the server lives in its
	// "serve" folder, one per major (managed.Dir), kept across restarts.
	Layout statedir.Layout
	PG     pgbin.Installation
	User   *instance.OSUser // OS user PostgreSQL runs as (nil: current user)
	// Role and Password of the client role (defaults: managed.DefaultRole,
	// a random password kept beside the server); LeastPrivilege makes it
	// a non-superuser that may create databases.
	Role, Password string
	LeastPrivilege bool
	// Copies is how test copies are made: CopiesDatabases (databases in
	// the managed server), CopiesClusters (a reflink copy of the template's
	// cluster per test) or CopiesAuto/"" (clusters on PostgreSQL 15-17 when
	// the state directory reflinks, see ChooseCopies).
	Copies string
	// OnInfo is told what is started; nil: silent.
	OnInfo func(msg string)
}

// NewManaged starts (creating on first use) pgfork's own PostgreSQL under
// Layout's serve folder — with file_copy_method=clone on PostgreSQL 18 when
// the folder's filesystem shares blocks — and serves databases in it.
// Close stops the server. With o.Copies choosing clusters (ChooseCopies),
// it serves cloned clusters instead (newManagedClusters).
func NewManaged(ctx context.Context, o ManagedOptions) (*Backend, error) {
	lay := o.Layout
	if err := lay.Ensure(); err != nil {
		return nil, errs.FromOS(err, lay.Root, "cannot create the state directory")
	}
	base := filepath.Join(lay.Root, "serve")
	if err := os.MkdirAll(base, 0o755); err != nil {
		return nil, errs.FromOS(err, base, "cannot create %s", base)
	}
	if err := managed.MoveLegacy(ctx, base); err != nil {
		return nil, err
	}
	dir := managed.Dir(base, o.PG.Major)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, errs.FromOS(err, dir, "cannot create %s", dir)
	}
	if o.Manager.MaxDiskBytes == pool.MaxDiskAuto {
		// The default cap: a quarter of the free space where the copies
		// live, at start (issue 58: a fixed 2 GiB made a CI suite of 80
		// copies of 180 MB wait for each one on its second run).
		free, err := clone.FreeBytes(dir)
		if err != nil {
			return nil, errs.FromOS(err, dir, "cannot read the free space of %s", dir)
		}
		o.Manager.MaxDiskBytes = pool.AutoMaxDisk(free)
	}
	shares := false
	if o.PG.Major >= 18 || o.Copies != CopiesDatabases {
		if pr, err := clone.Probe(ctx, dir, dir); err == nil && pr.SharesBlocks {
			shares = true
		}
	}
	clusters, err := ChooseCopies(o.Copies, o.PG.Major, shares)
	if err != nil {
		return nil, err
	}
	if clusters {
		return newManagedClusters(ctx, o, dir, shares)
	}
	useClone := shares && o.PG.Major >= 18
	if o.OnInfo != nil {
		o.OnInfo("starting " + o.PG.String() + map[bool]string{true: " with file_copy_method=clone", false: ""}[useClone])
	}
	m, err := managed.Start(ctx, managed.Options{BinDir: o.PG.BinDir, Env: o.PG.Env(), Dir: dir, User: o.User,
		Clone: useClone, Role: o.Role, Password: o.Password, LeastPrivilege: o.LeastPrivilege})
	if err != nil {
		return nil, err
	}
	b := &Backend{Conn: m.Conn, Owner: m.Conn.Username, SocketDir: m.Inst.SocketDir}
	b.closers = append(b.closers, func(context.Context) error {
		sctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		start := time.Now()
		err := m.Stop(sctx)
		if err == nil && o.OnInfo != nil {
			// Its shutdown checkpoint is most of a slow stop on a busy disk.
			o.OnInfo(fmt.Sprintf("PostgreSQL stopped in %.2f s", time.Since(start).Seconds()))
		}
		return err
	})
	if err := b.openDB(ctx, o.Manager, m.AdminURL, o.DB, useClone); err != nil {
		return nil, b.fail(err)
	}
	return b, nil
}

// ParseConn is the connection info clients get from an external server's
// URL: its host, port, user and password.
func ParseConn(url string) (pool.ConnInfo, error) {
	pc, err := pgx.ParseConfig(url)
	if err != nil {
		return pool.ConnInfo{}, errs.Wrap(errs.Usage, err, "bad PostgreSQL URL").WithHint("use postgres://user:password@host:port/postgres (PGFORK_PG_URL) or check INTEGRESQL_PG*/PG*").WithCLI("--pg-url")
	}
	return pool.ConnInfo{Host: pc.Host, Port: int(pc.Port), Username: pc.User, Password: pc.Password}, nil
}

// ExternalOptions shape NewExternal.
type ExternalOptions struct {
	Manager pool.ManagerConfig // Owner is set from Conn
	DB      DBOptions
	// AdminURL reaches the server as a superuser or a CREATEDB role.
	AdminURL string
	// Conn is what clients get (ParseConn of AdminURL, or another role);
	// its Username owns the test databases.
	Conn pool.ConnInfo
	// CanClone says the server's data directory is on a filesystem that
	// shares blocks (pgfork cannot see it: the caller says).
	CanClone bool
}

// NewExternal serves databases in the server of AdminURL.
func NewExternal(ctx context.Context, o ExternalOptions) (*Backend, error) {
	b := &Backend{Conn: o.Conn, Owner: o.Conn.Username}
	if err := b.openDB(ctx, o.Manager, o.AdminURL, o.DB, o.CanClone); err != nil {
		return nil, b.fail(err)
	}
	return b, nil
}

// ClusterOptions shape NewClusterIsolation.
type ClusterOptions struct {
	Manager pool.ManagerConfig // Owner is set from the store's role
	// Layout is pgfork's state directory: clusters live in its
	// "serve-clusters" folder; the empty base cluster comes from its
	// template cache.
	Layout statedir.Layout
	PG     pgbin.Installation
	User   *instance.OSUser
	// Role and Password of the superuser handed to clients (defaults:
	// "pgfork", a random password kept beside the clusters).
	Role, Password string
	// OnInfo is told where the clusters live; nil: silent.
	OnInfo func(msg string)
}

// NewClusterIsolation serves a cluster per template and a copy of it,
// started on its own port, per test. Close stops every cluster still
// running.
func NewClusterIsolation(ctx context.Context, o ClusterOptions) (*Backend, error) {
	lay := o.Layout
	if err := lay.Ensure(); err != nil {
		return nil, errs.FromOS(err, lay.Root, "cannot create the state directory")
	}
	dir := filepath.Join(lay.Root, "serve-clusters")
	if o.OnInfo != nil {
		o.OnInfo("a cluster per test: " + o.PG.String() + ", clusters in " + dir)
	}
	st, err := clusterstore.New(clusterstore.Options{Dir: dir, Layout: lay, PG: o.PG, User: o.User,
		Role: o.Role, Password: o.Password})
	if err != nil {
		return nil, err
	}
	b := &Backend{Conn: st.Conn(), Owner: st.Role()}
	cfg := o.Manager
	cfg.Owner = st.Role()
	if err := b.open(ctx, cfg, st); err != nil {
		return nil, b.fail(err)
	}
	return b, nil
}
