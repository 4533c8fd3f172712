package serve

import (
	"context"
	"fmt"
	"path/filepath"
	"runtime"

	"github.com/pgfork/pgfork/internal/errs"
	"github.com/pgfork/pgfork/internal/secret"
	"github.com/pgfork/pgfork/pool"
	"github.com/pgfork/pgfork/pool/clusterstore"
	"github.com/pgfork/pgfork/server/managed"
)

// How the managed mode makes test copies (ManagedOptions.Copies, serve
// --copies).
const (
	CopiesAuto      = "auto"      // ChooseCopies decides
	CopiesDatabases = "databases" // a database per test in the managed server
	CopiesClusters  = "clusters"  // a reflink copy of the template's cluster per test
)

// ChooseCopies says whether the managed mode gives each test a cloned
// cluster (true) or a database in the managed server (false), for copies
// (a Copies* value, "" meaning auto), the PostgreSQL major and whether the
// state directory's filesystem shares blocks.
//
// Auto picks clusters on PostgreSQL 15-17 on a reflink filesystem: there
// CREATE DATABASE is always a full copy of the template (file_copy_method
// = clone arrived in 18), while a reflink copy of a stopped cluster costs
// its metadata only. Measured on the XFS image, 187 MB template, 2 shared
// cores under load: a database copy made by PostgreSQL 15 took 240 ms at
// the median (serve's suite of 80 writing tests: 5.4x its floor, 6.2x on
// the second run); a cloned cluster is ~1,300 reflinked files and a start
// (docs/server.md, "Cloned clusters"). PostgreSQL 18 clones databases
// itself, and without reflink a cluster copy is a full copy of every
// database in it: both keep databases.
func ChooseCopies(copies string, major int, sharesBlocks bool) (bool, error) {
	switch copies {
	case CopiesDatabases:
		return false, nil
	case CopiesClusters:
		return true, nil
	case CopiesAuto, "":
		return major < 18 && sharesBlocks, nil
	}
	return false, errs.New(errs.Usage, "bad copies mode %q", copies).WithHint("use auto, databases or clusters").WithCLI("--copies")
}

// clusterSettings are the settings of the managed mode's cloned clusters
// over the store's own (shared_buffers=32MB, max_connections=100): each
// serves one test, and a pool of them runs at once, so shared memory is
// small (measured: 13 MB PSS per idle PostgreSQL 15 cluster).
var clusterSettings = map[string]string{"shared_buffers": "16MB"}

// clusterSlots is how many test databases one cloned cluster of the
// managed mode holds at most (clusterstore.Options.Slots; when the slots
// must be full copies, fewer for a template over
// clusterstore.SlotBudget / 7).
const clusterSlots = 8

// ClusterSizes are the pool defaults of cloned clusters on cpus cores
// (reflink: sharesBlocks; else pool.DefaultSizes' full copies): 4 ready
// per core, up to 48 per core, 6 made at once per core. A ready cluster
// costs no disk, ~13 MB of memory while it waits (a pool grows to the
// demand it sees and drops what it grew after --pool-idle), and a
// creation is half waiting on a server to start. Measured with
// BenchmarkManagedCopies (80 writing tests on 4 workers, 187 MB template,
// PostgreSQL 15 on the XFS image, 2 cores under load 26-51): with at most
// 32 ready and 2 at once, first run 10.4x the floor and the second 7.2x
// (wait p50 2.1 s: 48 tests waited for a creation); at most 96 and 4 at
// once, 5.3x and 1.39x (first run 40.0 s, wait p50 0.1 ms, p99 0.3 ms),
// where databases in the managed server ran 17.7x and 12.5x; at most 96
// and 6 at once (these sizes on 2 cores), first run 35.6 s (3.65x) and
// 1.15x.
//
// Since a cloned cluster holds up to clusterSlots test databases, most
// creations take a database of a cluster already started (a rename and a
// first connection) and wait, 6 at a time, for the one being started:
// with 3 per core at once, one cluster started at a time. 6 per core at
// once (two started at a time on 2 cores) measured, same suite, quiet
// (load 3.5-4.6), in turns: first run 2.86 s and 2.29 s (3.4x and 2.9x
// the floor, wait p50 4.4 and 10.2 ms) against 3.33 s and 2.48 s (6.5x
// and 4.7x, wait p50 87 and 75 ms) with 3 per core.
func ClusterSizes(sharesBlocks bool, cpus int) pool.Sizes {
	cpus = max(cpus, 1)
	if !sharesBlocks {
		return pool.DefaultSizes(false, cpus)
	}
	return pool.Sizes{Initial: 4 * cpus, Max: 48 * cpus, Parallel: 6 * cpus, Learned: 48 * cpus}
}

// newManagedClusters serves the managed mode with a cloned cluster per
// test (pool/clusterstore) under dir (the managed server of this major's
// folder, managed.Dir): the template is migrated in a cluster of its own,
// stopped on finalize, and every test gets a reflink copy of it started on
// a free port of 127.0.0.1. Clients get the same role and password as the
// managed server's (a superuser of its cluster, or a CREATEDB role with
// LeastPrivilege) and nothing else: each cluster holds the template's
// database, that role and the bootstrap superuser, reached over the private
// socket only. The database in each test cluster bears the test's name,
// as in one server. The managed server itself is not started.
func newManagedClusters(ctx context.Context, o ManagedOptions, dir string, shares bool) (*Backend, error) {
	role, pw := o.Role, o.Password
	if role == "" {
		role = managed.DefaultRole
	}
	if role == managed.BootstrapRole {
		return nil, errs.New(errs.Usage, "role %q is the bootstrap superuser of pgfork's clusters; pgfork does not hand it out or change it", role).
			WithHint("leave the test user unset: pgfork hands out its own role %q", managed.DefaultRole)
	}
	if pw == "" {
		// The managed server's: switching --copies keeps the credentials.
		var err error
		if pw, err = secret.Password(filepath.Join(dir, "password")); err != nil {
			return nil, err
		}
	}
	store := filepath.Join(dir, "clusters")
	if o.OnInfo != nil {
		how := "reflink copies"
		if !shares {
			how = "full copies (this filesystem cannot reflink)"
		}
		o.OnInfo(fmt.Sprintf("a cloned cluster per test: %s, %s of the template's cluster in %s (--copies databases for databases in one server)",
			o.PG.String(), how, store))
	}
	st, err := clusterstore.New(clusterstore.Options{Dir: store, Layout: o.Layout, PG: o.PG, User: o.User,
		Role: role, Password: pw, LeastPrivilege: o.LeastPrivilege, Settings: clusterSettings, Lean: true, OwnName: true, Slots: clusterSlots, SharesBlocks: shares})
	if err != nil {
		return nil, err
	}
	b := &Backend{Conn: st.Conn(), Owner: st.Role(), Copies: CopiesClusters}
	cfg := o.Manager
	if o.DB.Given != nil {
		cfg = ClusterSizes(shares, runtime.NumCPU()).Apply(cfg, *o.DB.Given)
		b.Sized = fmt.Sprintf("pools: %d ready clusters, at most %d, %d made at once (test copies are %s of the template's cluster; %d cores)",
			cfg.Initial, cfg.Max, cfg.Parallel, map[bool]string{true: "reflink copies", false: "full copies"}[shares], runtime.NumCPU())
	}
	cfg.Owner = role
	if err := b.open(ctx, cfg, st); err != nil {
		return nil, b.fail(err)
	}
	return b, nil
}
