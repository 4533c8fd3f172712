package pool

// Sizes are a pool's defaults: databases kept ready when idle (Initial),
// at most as misses grow it (Max), created at once (Parallel), and at
// most as the demand it learned fills it (Learned, ≥ Max).
type Sizes struct {
	Initial, Max, Parallel, Learned int
}

// DefaultSizes returns the pool defaults for a server on cpus cores whose
// copies share blocks (clone: PostgreSQL 18 with file_copy_method = clone
// on a reflink filesystem) or are full copies, in place of IntegreSQL's
// constants (2, 8 and 2 on every machine).
//
// Measured by BenchmarkCreateRate (issue 33) on 2 shared cores under load
// 6–16, 25 MB template, medians of 5 rounds: PostgreSQL 18 with clone made
// 20–40 databases/s at 2 sessions and no more at 4 (19.9 vs 28.8, 39.8 vs
// 32.2); PostgreSQL 15's full copies 22–27 at 2 and 30–31 at 4. A creation
// is CPU and checkpoint bound, so Parallel stays at the cores. What a
// bigger pool costs differs: a clone shares every block of the template
// (a ready database is a few hundred small files), a full copy takes the
// template's size in disk each. So with clone the pool keeps 4 per core
// ready and grows to 64 per core; with full copies it keeps IntegreSQL's 1
// and 4 per core.
//
// Max with clone is sized for the demand a pool learns (Config.Learn: the
// fresh databases one run takes, filled ahead): BenchmarkSecondRun, a
// CI-shaped suite of 60 tests on 4 workers (25 MB template, every test
// writes) on PostgreSQL 18 with clone, 2 cores under load 28–38: with 16
// per core (32) the pool could not hold the run's 60 and its second run
// after a restart took 2.78x its floor (p99 wait 759 ms, the rest waiting
// for creations); with 64 per core it holds them and took 1.49x (p50 wait
// 0.1 ms, p99 0.5 ms), against 2.70x (p99 434 ms) for a pool that only
// grows by misses.
//
// Learned is what a learned demand may fill a pool to, beyond Max: 256
// per core with clones (bench's JS and Rust suites, 300 and 200 writing
// tests on 2 cores, waited for creations on their second run with 128:
// 3.2x and 3.1x their floors on the volume), and Max with full copies,
// whose disk SpaceMax weighs when the server's free space is known.
// Misses grow a pool only to Max: a first run misses on every acquire,
// and a creation beyond what the waiting tests take costs them CPU and
// checkpoints while they wait.
func DefaultSizes(clone bool, cpus int) Sizes {
	cpus = max(cpus, 1)
	if clone {
		return Sizes{Initial: 4 * cpus, Max: 64 * cpus, Parallel: cpus, Learned: 256 * cpus}
	}
	return Sizes{Initial: cpus, Max: 4 * cpus, Parallel: cpus, Learned: 4 * cpus}
}

// MaxDiskAuto as ManagerConfig.MaxDiskBytes asks for the default cap: the
// caller sets it to AutoMaxDisk of the free space where the copies live
// (the Manager treats it as no cap if nobody does).
const MaxDiskAuto int64 = -1

// AutoMaxDisk is the default disk cap of test databases for a filesystem
// with free bytes free: 1/SpaceShare of it, the share each pool's size is
// taken from, so that the cap bounds the pools together where one alone
// could take a share.
func AutoMaxDisk(free int64) int64 { return free / SpaceShare }

// SpaceShare is the part of a filesystem's free space (1/SpaceShare) that
// the copies of one template may take when they are full copies (SpaceMax).
const SpaceShare = 4

// SpaceMax returns the Max of a pool of full copies of a template of size
// bytes, on a filesystem with free bytes available when the pool starts:
// as many copies as fit in 1/SpaceShare of it, no fewer than the full-copy
// default (DefaultSizes(false, cpus).Max) and no more than a learned
// demand fills clones to (DefaultSizes(true, cpus).Learned: 256 per core). 0 when free or size is unknown (≤ 0): the caller
// keeps its Max.
//
// A learning pool (Config.Learn) keeps as many ready as one run of its
// template took, within Max. With full copies every creation copies the
// template: measured in bench's volume section (80 writing tests on 4
// workers, 187 MB template, PostgreSQL 18 on ext4, 2 cores) a pool of 8
// made the second run wait for creations at 6.5–7.9 databases/s, 11.7x
// its floor; a pool that holds the run fills between runs and hands out
// ready databases. Disk is what bounds it: each ready copy takes the
// template's size, so the share is of the free space, the rest left to
// the tests' writes and everything else on the disk.
func SpaceMax(free, size int64, cpus int) int {
	if free <= 0 || size <= 0 {
		return 0
	}
	cpus = max(cpus, 1)
	lo, hi := DefaultSizes(false, cpus).Max, DefaultSizes(true, cpus).Learned
	n := free / SpaceShare / size
	return int(min(max(n, int64(lo)), int64(hi)))
}

// Given says which of a pool's sizes the user chose (a flag or an
// IntegreSQL variable); the others come from DefaultSizes.
type Given struct {
	Initial, Max, Parallel bool
}

// Apply sets the sizes of cfg not given to d's, keeping Initial ≤ Max:
// a given Max bounds a default Initial, a given Initial raises a default
// Max. Without a given Initial, pools learn their demand (LearnDemand),
// up to d.Learned unless the user gave Max (their number bounds it).
func (d Sizes) Apply(cfg ManagerConfig, given Given) ManagerConfig {
	if !given.Parallel {
		cfg.Parallel = d.Parallel
	}
	cfg.LearnMax = 0
	if !given.Max {
		cfg.Max = max(d.Max, cfg.Initial*boolInt(given.Initial))
		cfg.LearnMax = max(d.Learned, cfg.Max)
	}
	if !given.Initial {
		cfg.Initial = min(d.Initial, cfg.Max)
	}
	// A pool learns how many databases its template's runs take and keeps
	// that many ready, unless the user chose how many (their number wins).
	cfg.LearnDemand = !given.Initial
	return cfg
}

func boolInt(b bool) int {
	if b {
		return 1
	}
	return 0
}
