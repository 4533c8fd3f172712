// Package pool keeps pools of ready test databases, one pool per template.
//
// Each database in a pool moves through a small state machine:
//
//	creating ──► ready ──► in use ──unlock──► ready (as is, for reuse)
//	                          │
//	                          └─recreate─► dirty ──► recreating ──► ready (generation+1)
//
// A database is handed to exactly one caller at a time: only Acquire moves a
// database from ready to in use, under the pool's lock. Creation and
// recreation run in the background with bounded concurrency. A caller that
// waits too long gets an error saying why, never a hang.
//
// The Manager (manager.go) holds the pools of all templates, the global
// limit on databases across pools, and the template state that survives a
// restart.
package pool

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/pgfork/pgfork/internal/errs"
)

// Domain errors. The server maps them to HTTP status codes in one place.
var (
	ErrTemplateExists    = errors.New("template is already initialized")
	ErrTemplateNotFound  = errors.New("template not found")
	ErrTemplateDiscarded = errors.New("template was discarded")
	ErrTestNotFound      = errors.New("test database not found")
	ErrTimeout           = errors.New("timed out waiting for a ready database")
	ErrClosed            = errors.New("pool is closed")
	// ErrTestReclaimed is a test database id whose database was reclaimed
	// (held longer than the minimum lifetime with no session, while others
	// waited). It wraps ErrTestNotFound: the API answers 404.
	ErrTestReclaimed = fmt.Errorf("%w: it was reclaimed", ErrTestNotFound)
)

// State is the state of one test database.
type State int

// The states of a test database.
const (
	Creating   State = iota // being created for the first time
	Ready                   // fresh (or unlocked), waiting to be handed out
	InUse                   // handed to exactly one test
	Dirty                   // given back for recreation, queued
	Recreating              // being dropped and cloned again from the template
)

var stateNames = [...]string{"creating", "ready", "in_use", "dirty", "recreating"}

// String returns the state's name as used in metrics and docs.
func (s State) String() string {
	if int(s) < len(stateNames) {
		return stateNames[s]
	}
	return fmt.Sprintf("state(%d)", int(s))
}

// States lists every state, in order.
var States = []State{Creating, Ready, InUse, Dirty, Recreating}

// Creator creates and drops test databases: the recreate function a pool
// is given (injected, so this package holds no SQL). dbstore.SQLCreator
// implements it over an admin connection pool with dbclone's strategies;
// every Store embeds one (clusterstore creates whole clusters instead).
type Creator interface {
	// Create makes database name as a copy of template, owned by owner, and
	// returns the strategy it used.
	Create(ctx context.Context, name, template, owner string) (strategy string, err error)
	// Drop removes database name if it exists. It returns an errs.Busy
	// error when sessions are connected to it (the pool retries later).
	Drop(ctx context.Context, name string) error
}

// Retirer is implemented by creators that can move a database out of its
// name at once (dbstore.SQLCreator: ALTER DATABASE … RENAME, a catalog
// update). A pool recreating a database then renames the used copy away,
// creates the fresh one under the name at once and drops the old copy in
// the background, instead of a DROP and then a CREATE on the path of the
// test that waits for it.
type Retirer interface {
	// Rename renames database from to to. It returns an errs.Busy error
	// when sessions are connected to from (the pool retries).
	Rename(ctx context.Context, from, to string) error
}

// SessionCounter is implemented by creators that can count the sessions
// connected to databases (dbstore.SQLCreator). Without it a pool reclaims a
// database the first time a drop finds it without sessions.
type SessionCounter interface {
	// Sessions returns the sessions of each of names (missing names: none
	// connected, none established).
	Sessions(ctx context.Context, names []string) (map[string]Sessions, error)
}

// Sessions is what a SessionCounter reports of one database.
type Sessions struct {
	// Connected is how many sessions are connected now.
	Connected int
	// Established counts the sessions ever established to the database (a
	// counter the server keeps, PostgreSQL 14+); -1 when unknown. A change
	// between two samples is a session that came and went in between: a
	// holder that reconnects often is seen even when every sample falls
	// between two of its sessions.
	Established int64
}

// Limiter is the global limit on databases across pools (the Manager).
// TryReserve is called with the pool's lock held and must not call back
// into any pool synchronously.
//
// The limit on disk (ManagerConfig.MaxDiskBytes) counts each database at
// p's Config.CopyBytes; TryReserveUsed and ReleaseUsed count the used
// copies renamed away and waiting for their drop, on disk too, against it
// alone (not against the limit on databases).
type Limiter interface {
	TryReserve(p *Pool) bool
	Release(p *Pool, n int)
	TryReserveUsed(p *Pool) bool
	ReleaseUsed(p *Pool, n int)
}

// Observer receives events for metrics. Methods must be fast and must not
// call back into the pool.
type Observer interface {
	Created(hash, strategy string, elapsed time.Duration, err error)
	Waited(hash string, elapsed time.Duration, ok bool)
}

// Config shapes one pool.
type Config struct {
	Hash     string              // template hash (for messages and metrics)
	Template string              // template database name
	Owner    string              // owner of the test databases
	Name     func(id int) string // database name for an id
	// Initial is how many databases the pool keeps ready (or on the way)
	// when idle. Under demand the pool grows: every Acquire that finds
	// nothing ready raises the number kept ahead by one, up to Max, and it
	// falls back to Initial after IdleTimeout without an Acquire.
	Initial int
	// IdleTimeout is how long the pool must go without an Acquire before the
	// ready databases it grew beyond Initial are dropped (default 60 s;
	// negative: never).
	IdleTimeout time.Duration
	// Max bounds the databases of this pool, in any state.
	Max int
	// GrowMax bounds what misses grow the pool's target to (0: Max), and
	// the used copies waiting for their drop; the demand it learned (Learn)
	// fills it up to Max all the same. Misses grow a pool no further than
	// the per-core default (ManagerConfig.Max): during a first run every
	// acquire misses, and each creation beyond what the waiting tests
	// take costs them CPU and checkpoints (with full copies, the
	// template's size in writes) while they wait.
	GrowMax int
	// Parallel bounds concurrent creations/recreations (default 2).
	Parallel int
	// MinLifetime: when the pool is full and a caller waits, a database held
	// for at least this long and seen with no session for at least this long
	// without a break is reclaimed (dropped, and made again from the
	// template under the smallest free id), as IntegreSQL does for clients
	// that never give databases back. Sessions are sampled every
	// MinLifetime/4 (at most every second) while callers wait, with the
	// server's count of sessions established (SessionCounter): a holder that
	// connected at all since the last sample keeps its database, even when
	// every sample falls between two of its sessions.
	// 0 disables reclaiming.
	MinLifetime time.Duration
	// RetryMin and RetryMax bound the backoff while a database to drop or
	// rename is still in use or the template has sessions (defaults 10 ms
	// and 2 s: a test's backend lingers a few milliseconds after its client
	// disconnects).
	RetryMin, RetryMax time.Duration
	Limiter            Limiter  // may be nil
	Observer           Observer // may be nil
	// NextID, when set, hands out ids; nil: the smallest id free in the
	// pool, so ids and names are reused as IntegreSQL reuses them.
	NextID func() int

	// Demand is the most fresh databases one run of this template took
	// (the pool's Demand from an earlier start: Stats().Demand). With
	// Learn the pool keeps max(Initial, min(Demand, Max)) ready or on the
	// way, filling to it at once and after every run, and raises Demand
	// when a run takes more (OnDemand is told). Without Learn it only
	// counts (the user fixed Initial).
	Demand int
	Learn  bool
	// RunGap ends a run: a run is hand-outs each less than RunGap after
	// the one before (default DefaultRunGap).
	RunGap time.Duration
	// OnDemand, when set, is called (without the pool's lock, from its own
	// goroutine) when a run took more fresh databases than any before; a
	// run under way when the pool closes counts as ended, and Close calls
	// OnDemand for it before it returns.
	OnDemand func(demand int)
	// KeptMax bounds the databases kept for inspection (Keep), which are
	// outside Max: beyond it the oldest kept is dropped and OnKeptDropped
	// told. 0: DefaultKeptMax.
	KeptMax int
	// OnKeptDropped, when set, is called after a kept database was dropped
	// to make room for a newer one (err: the drop failed).
	OnKeptDropped func(name string, keptFor time.Duration, err error)
	// PersistKept leaves kept databases in place when the pool closes
	// with drop (the store keeps them across a restart).
	PersistKept bool
	// Kept are the databases kept before a restart (Kept.Hash unused):
	// the pool starts with them kept, their ids taken.
	Kept []Kept
	// PersistReady leaves the fresh ready databases (made from the
	// template, never handed out) in place when the pool closes with drop,
	// and tells OnReadyLeft which, so that the next start of the server
	// hands them out (Ready) instead of making them again. Databases of a
	// template that goes (discard, reset) are dropped all the same.
	PersistReady bool
	OnReadyLeft  func(ctx context.Context, left []Kept)
	// Ready are the fresh databases the last clean stop left (Kept.Hash
	// and At unused): the pool starts with them ready, their ids taken,
	// as many as it keeps ready, within Max and the global limit (those
	// beyond are dropped).
	Ready []Kept
	// CopyBytes is the disk one database of the pool takes, as the
	// Limiter's limit on disk counts it (0: nothing, not limited by disk).
	CopyBytes int64
}

// DefaultRunGap is Config.RunGap's default: hand-outs further apart than
// this are two runs. A suite whose tests take longer gives the pool that
// long to recreate each database, so it needs nothing ready ahead.
const DefaultRunGap = 2 * time.Second

// DefaultKeptMax is Config.KeptMax's default: kept databases per template.
const DefaultKeptMax = 10

// DB is a database handed out by Acquire.
type DB struct {
	ID         int
	Name       string
	Generation uint64
}

type entry struct {
	id    int
	name  string
	state State
	gen   uint64
	since time.Time // when it entered its state
	// idleSince is when the session probe first saw this database (in use)
	// without a session, with none seen since; zero: a session was seen, or
	// no probe ran since it was handed out.
	idleSince time.Time
	// established is Sessions.Established at the probe's last sample (-1:
	// none taken since it was handed out, or unknown).
	established int64
	// reclaiming: a drop to reclaim it runs; release is what its holder
	// asked for meanwhile ("unlock" or "recreate"), applied if the drop
	// finds it in use after all.
	reclaiming bool
	release    string
	// warm: given back as it was (unlock), not made afresh; warm ready
	// databases queue after the fresh ones, so Acquire hands them out first.
	warm bool
	// keptAt: when its holder kept it (Keep); it is then in Pool.kept,
	// outside dbs.
	keptAt time.Time
	// cold: fresh and ready, not opened yet since it was made or since the
	// server's restart (Warmer); noCacheFile: without its catalog cache
	// file, left ready by the last clean stop (the restart removed it) or
	// made by a strategy that does not copy it (CacheFiler; then also
	// madeNoFile, and it is warmed between runs only). Cleared when the
	// warmer takes it or a test does.
	cold, noCacheFile, madeNoFile bool
	// deferred: given back during a run whose rest the pool covered, its
	// recreation waits in Pool.deferred (Dirty, not on the way).
	deferred bool
	// emptying: the used copy of a deferred recreation is being dropped
	// (see emptier); emptied: it is gone, and the recreation only creates;
	// unemptied: the drop failed, the recreation drops it.
	emptying, emptied, unemptied bool
}

type result struct {
	db  DB
	err error
}

type waiter struct{ ch chan result }

// Pool is the pool of test databases of one template.
type Pool struct {
	cfg     Config
	creator Creator
	ctx     context.Context
	cancel  context.CancelFunc
	wg      sync.WaitGroup
	sem     chan struct{}

	mu        sync.Mutex
	dbs       map[int]*entry
	ready     []int // ready ids: fresh ones (longest ready first), then warm ones; Acquire takes the last
	waiters   []*waiter
	closed    bool
	evicted   bool // emptied by the global limit; refills on the next Acquire
	lastErr   error
	lastErrAt time.Time
	kickAt    time.Time // a reclaim retry is scheduled for then
	probing   bool      // the session probe runs
	// target is how many databases the pool keeps ready or on the way
	// beyond its waiters: Initial, grown by misses, shrunk when idle.
	target   int
	misses   int       // acquires that found nothing ready
	shrinkAt time.Time // a shrink check is scheduled for then
	// reclaimed remembers the last ids reclaimed, so that their holders
	// learn why the id is gone (bounded: reclaimedMax).
	reclaimed     map[int]time.Duration
	reclaimedFIFO []int

	// trash holds the names of used copies renamed away by a recreation
	// and not yet dropped (Retirer), trashQ those waiting for a dropper
	// (droppers goroutines, at most Parallel, while there are some;
	// dropsActive of them drop now); trashSeq numbers them (cfg.Name of
	// -trashSeq). pending counts creations started and not finished; drops
	// wait for none (see dropper), on wake.
	trash       map[string]bool
	trashQ      []string
	trashSeq    int
	droppers    int
	dropsActive int
	pending     int
	wake        *sync.Cond

	// kept holds the databases their holders kept for inspection (Keep),
	// outside dbs and Max; keptOrder their ids, oldest first.
	kept      map[int]*entry
	keptOrder []int
	// dropping counts, by id, the drops under way of databases that left
	// the pool (shrunk, evicted, kept and given back): their ids are not
	// reused until the drop ends, or a new database under the same name
	// could be made first and dropped by it, under its holder.
	dropping map[int]int
	// demand is the most fresh databases a run took; run counts the
	// current run's, runActive says a run-end check is scheduled.
	demand      int
	run         int
	runActive   bool
	lastHandOut time.Time
	// deferred are databases given back for recreation during a run
	// whose rest the ready ones cover (Recreate): recreated when it ends.
	// emptiers: the emptiers that drop their used copies meanwhile.
	deferred []*entry
	emptiers int
	// lastGiveBack: the last Recreate, for the emptiers' pause (dropPauseLocked).
	lastGiveBack time.Time

	// warming: the warmer goroutine runs; warmingNow: it is connecting
	// to a ready database (counted in Stats.Warming).
	warming    bool
	warmingNow bool
	// warmingName is the database the warmer connects to now.
	warmingName string
	// unflushed: a creation ended since the last flush began; ranSince: a
	// run ended since then; flushing: a Flusher.Flush runs (maybeFlush).
	unflushed, ranSince, flushing bool

	inUse    atomic.Int64
	nwaiters atomic.Int64
	lastUsed atomic.Int64 // unix nanos of the last Acquire
}

// DefaultIdleTimeout is Config.IdleTimeout's default.
const DefaultIdleTimeout = 60 * time.Second

// New starts a pool and begins filling it to cfg.Initial in the background.
// Ids are the smallest free ones from 0 (or come from cfg.NextID): a
// database reclaimed, evicted or failed frees its id and name for the next.
func New(cfg Config, creator Creator) *Pool {
	if cfg.Parallel <= 0 {
		cfg.Parallel = 2
	}
	if cfg.Max <= 0 {
		cfg.Max = 1
	}
	if cfg.Initial > cfg.Max {
		cfg.Initial = cfg.Max
	}
	if cfg.GrowMax <= 0 || cfg.GrowMax > cfg.Max {
		cfg.GrowMax = cfg.Max
	}
	if cfg.IdleTimeout == 0 {
		cfg.IdleTimeout = DefaultIdleTimeout
	}
	if cfg.RetryMin <= 0 {
		cfg.RetryMin = 10 * time.Millisecond
	}
	if cfg.RetryMax <= 0 {
		cfg.RetryMax = 2 * time.Second
	}
	if cfg.RunGap <= 0 {
		cfg.RunGap = DefaultRunGap
	}
	if cfg.KeptMax <= 0 {
		cfg.KeptMax = DefaultKeptMax
	}
	ctx, cancel := context.WithCancel(context.Background())
	p := &Pool{cfg: cfg, creator: creator, ctx: ctx, cancel: cancel,
		sem: make(chan struct{}, cfg.Parallel), trash: map[string]bool{},
		dbs: map[int]*entry{}, reclaimed: map[int]time.Duration{}, kept: map[int]*entry{}, dropping: map[int]int{},
		demand: max(cfg.Demand, 0)}
	p.target = p.base()
	p.wake = sync.NewCond(&p.mu)
	p.lastUsed.Store(time.Now().UnixNano())
	p.mu.Lock()
	// Every kept id is taken before the first creation picks one.
	for _, k := range cfg.Kept {
		if p.kept[k.ID] == nil {
			p.kept[k.ID] = &entry{id: k.ID, name: k.Name, state: InUse, since: k.At, keptAt: k.At}
			p.keptOrder = append(p.keptOrder, k.ID)
		}
	}
	for len(p.keptOrder) > p.cfg.KeptMax {
		p.dropKept(p.kept[p.keptOrder[0]], true)
	}
	p.adoptReady(cfg.Ready)
	p.fill()
	p.mu.Unlock()
	return p
}

// adoptReady takes the fresh databases a clean stop left (Config.Ready) as
// ready ones, as many as the pool keeps ready (its target), within Max and
// the global limit; it drops the others in the background. Called with
// p.mu held, before anything is created.
//
// The ids of those it drops stay taken (dropping) until their drop has
// ended: else the pool's first creations take the smallest free ids,
// theirs among them, and a drop that comes after a new copy was made
// under the same name removes it under the test it is handed to (issue
// 58: `database "…_000" does not exist` for about 10 s after a restart
// that adopted fewer than were left). A name the pool holds, adopted or
// kept, is never dropped.
func (p *Pool) adoptReady(left []Kept) {
	var extra []Kept
	for _, k := range left {
		_, taken := p.dbs[k.ID]
		if taken || p.kept[k.ID] != nil || k.Name != p.cfg.Name(k.ID) || len(p.ready) >= p.target ||
			len(p.dbs) >= p.cfg.Max || p.cfg.Limiter != nil && !p.cfg.Limiter.TryReserve(p) {
			extra = append(extra, k)
			continue
		}
		e := &entry{id: k.ID, name: k.Name, state: Ready, since: time.Now(), cold: true, noCacheFile: true}
		p.dbs[k.ID] = e
		p.ready = append(p.ready, k.ID)
	}
	p.startWarmer()
	held := map[string]bool{}
	for _, e := range p.dbs {
		held[e.name] = true
	}
	for _, e := range p.kept {
		held[e.name] = true
	}
	var gone []*entry
	for _, k := range extra {
		if held[k.Name] {
			continue
		}
		e := &entry{id: k.ID, name: k.Name}
		p.dropping[e.id]++
		gone = append(gone, e)
	}
	if len(gone) == 0 {
		return
	}
	p.wg.Add(1)
	go func() {
		defer p.wg.Done()
		for _, e := range gone {
			_ = p.creator.Drop(context.WithoutCancel(p.ctx), e.name)
			p.dropEnded(e)
		}
	}()
}

// startWarmer starts the warmer when the store can warm (Warmer) and a
// database is ready to warm. Called with p.mu held.
func (p *Pool) startWarmer() {
	w, ok := p.creator.(Warmer)
	if !ok || p.warming || p.closed || !p.anyCold() {
		return
	}
	p.warming = true
	p.wg.Add(1)
	go p.warmer(w)
}

// warmer warms the cold ready databases (Warmer.Warm), one at a time, in
// the order they are handed out.
//
// Between runs (no run goes on, no creation is on the way, no test waits)
// it opens the next WarmAhead of them (Warm with open). That costs the
// server several times what it saves the test (dbstore's warmSQL: 19–20 ms
// against 1–2 ms), so it uses the time between runs and never the cores of
// a run; and the server's shared buffers hold the catalog pages of a few
// dozen copies, not of every one a learned demand keeps ready. Beyond them
// it connects only to those without their catalog cache file (a restart
// removed it, or a strategy that does not copy it made them: CacheFiler),
// which writes the file, without opening their relations.
//
// During a run it only connects to those a clean stop left without the
// file (not to those a strategy made without it), and of them only to the
// next WarmAhead to be handed out: a test that found none would build it,
// so the connection moves that work off its path (measured in
// docs/server.md, "Demand, filled ahead"), but a restart that adopted a
// learned demand's copies (hundreds) connected to all of them at once, at
// ~70 a second on 2 cores, beside the run's tests (issue 33: the JS client's
// auto-started serve). A test that takes a database first pays for it
// itself, as it did before. The warmer stops when none is
// left to warm or the pool closes; a run's end or a creation starts it
// again.
func (p *Pool) warmer(w Warmer) {
	defer p.wg.Done()
	p.mu.Lock()
	defer p.mu.Unlock()
	for {
		between := p.pending == 0 && len(p.waiters) == 0 && !p.runActive
		e, ahead := p.nextCold(!between)
		if p.closed || e == nil && !p.anyCold() {
			p.warming = false
			return
		}
		if e == nil {
			p.wake.Wait() // broadcast when the last creation ends, a run ends, a hand-out, and by Close
			continue
		}
		e.noCacheFile, e.madeNoFile = false, false
		open := between && ahead
		if open {
			e.cold = false
		}
		p.warmingNow, p.warmingName = true, e.name
		p.mu.Unlock()
		ctx, cancel := context.WithTimeout(p.ctx, warmTimeout)
		// Its relations opened (their catalog pages read into shared
		// buffers) only among the next WarmAhead: the buffers hold a few
		// dozen copies' pages, and an open costs the server 19-20 ms.
		_ = w.Warm(ctx, e.name, open) // best effort: its test connects all the same
		cancel()
		p.mu.Lock()
		p.warmingNow, p.warmingName = false, ""
	}
}

// WarmAhead is how many of the ready databases handed out next a pool
// opens between runs (Warmer).
const WarmAhead = 32

// nextCold returns the ready database to warm that is handed out first
// (p.ready's last): with fileOnly one among the next WarmAhead whose
// catalog cache file a restart removed, else a cold one among the next
// WarmAhead or one without its file; nil if none. Called with p.mu held.
func (p *Pool) nextCold(fileOnly bool) (e *entry, ahead bool) {
	for i := len(p.ready) - 1; i >= 0; i-- {
		if p.toWarm(i, fileOnly) {
			return p.dbs[p.ready[i]], i >= len(p.ready)-WarmAhead
		}
	}
	return nil, false
}

// anyCold reports whether a ready database is still to warm between runs.
// Called with p.mu held.
func (p *Pool) anyCold() bool {
	e, _ := p.nextCold(false)
	return e != nil
}

// toWarm says whether p.ready[i] is still to warm (see nextCold). Called
// with p.mu held.
func (p *Pool) toWarm(i int, fileOnly bool) bool {
	e := p.dbs[p.ready[i]]
	ahead := i >= len(p.ready)-WarmAhead
	if fileOnly {
		// During a run, only the adopted: copies made during a cold run
		// are made beside its tests already, and the cores are theirs.
		return e.noCacheFile && !e.madeNoFile && ahead
	}
	return e.noCacheFile || e.cold && ahead
}

// warmTimeout bounds one Warmer.Warm.
const warmTimeout = 10 * time.Second

// base is how many databases the pool keeps ready or on the way when
// idle: Initial, or with Learn the most a run took, within Max. Called
// with p.mu held.
func (p *Pool) base() int {
	if !p.cfg.Learn {
		return p.cfg.Initial
	}
	return max(p.cfg.Initial, min(p.demand, p.cfg.Max))
}

// Hash returns the template hash of the pool.
func (p *Pool) Hash() string { return p.cfg.Hash }

// LastUsed returns when the pool last handed out a database.
func (p *Pool) LastUsed() time.Time { return time.Unix(0, p.lastUsed.Load()) }

// Idle reports whether no database is in use and nobody waits.
func (p *Pool) Idle() bool { return p.inUse.Load() == 0 && p.nwaiters.Load() == 0 }

// Acquire hands out a ready database, waiting until ctx is done. The
// database is in use until Unlock or Recreate. On timeout the error (kind
// Busy, wrapping ErrTimeout) says why no database was ready.
func (p *Pool) Acquire(ctx context.Context) (DB, error) {
	start := time.Now()
	p.lastUsed.Store(start.UnixNano())
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return DB{}, errs.Wrap(errs.Busy, ErrClosed, "template %s", p.cfg.Hash)
	}
	p.evicted = false
	p.startRun()
	if n := len(p.ready); n > 0 {
		// The last first: a database just given back by unlock is the
		// next one handed out, even if fresh ones became ready since (as
		// IntegreSQL's clients expect, and its pages are still in cache);
		// then the most recently made, and the longest ready stay at the
		// front, where shrink drops them.
		id := p.ready[n-1]
		p.ready = p.ready[:n-1]
		db := p.handOut(p.dbs[id])
		p.resumeDeferred(false)
		p.fill()
		p.mu.Unlock()
		p.observeWait(start, true)
		return db, nil
	}
	// A miss: demand outran the pool. Keep one more ready from now on.
	p.misses++
	p.target = max(p.target, min(p.target+1, p.cfg.GrowMax))
	w := &waiter{ch: make(chan result, 1)}
	p.waiters = append(p.waiters, w)
	p.nwaiters.Add(1)
	p.resumeDeferred(true)
	p.fill()
	p.mu.Unlock()

	select {
	case r := <-w.ch:
		p.observeWait(start, r.err == nil)
		return r.db, r.err
	case <-ctx.Done():
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.removeWaiter(w) {
		p.observeWait(start, false)
		return DB{}, p.timeoutError(time.Since(start), ctx.Err())
	}
	// Served in the meantime: give the database back rather than leak it.
	r := <-w.ch
	if r.err == nil {
		if e := p.dbs[r.db.ID]; e != nil && e.state == InUse {
			p.inUse.Add(-1)
			p.becomeReady(e, true)
		}
	}
	p.observeWait(start, false)
	return DB{}, p.timeoutError(time.Since(start), ctx.Err())
}

func (p *Pool) observeWait(start time.Time, ok bool) {
	if p.cfg.Observer != nil {
		p.cfg.Observer.Waited(p.cfg.Hash, time.Since(start), ok)
	}
}

// timeoutError explains why no database was ready. Called with p.mu held.
func (p *Pool) timeoutError(waited time.Duration, cause error) error {
	c := p.countsLocked()
	var b strings.Builder
	fmt.Fprintf(&b, "no database of template %s became ready within %s: %d in use, %d being created or recreated, %d of at most %d exist",
		p.cfg.Hash, waited.Round(time.Millisecond), c[InUse], c[Creating]+c[Dirty]+c[Recreating], len(p.dbs), p.cfg.Max)
	if p.lastErr != nil && time.Since(p.lastErrAt) < time.Minute {
		fmt.Fprintf(&b, "; last creation error: %v", p.lastErr)
	}
	kind := errs.Busy
	if errors.Is(cause, context.Canceled) {
		kind = errs.Interrupted
	}
	e := errs.Wrap(kind, ErrTimeout, "%s", b.String())
	if c[InUse] >= p.cfg.Max {
		e = e.WithHint("unlock or recreate databases when tests end, or raise the pool maximum")
	}
	return e
}

func (p *Pool) removeWaiter(w *waiter) bool {
	for i, x := range p.waiters {
		if x == w {
			p.waiters = append(p.waiters[:i], p.waiters[i+1:]...)
			p.nwaiters.Add(-1)
			return true
		}
	}
	return false
}

// handOut marks e in use and returns it; a fresh one counts toward the
// run's demand. Called with p.mu held.
func (p *Pool) handOut(e *entry) DB {
	if !e.warm {
		p.run++
	}
	p.lastHandOut = time.Now()
	e.cold, e.noCacheFile, e.madeNoFile = false, false, false
	e.state = InUse
	e.since = time.Now()
	e.idleSince, e.established = time.Time{}, -1
	p.inUse.Add(1)
	if p.warming {
		p.wake.Broadcast() // a warmer waiting during a run: the next WarmAhead moved on
	}
	return DB{ID: e.id, Name: e.name, Generation: e.gen}
}

// becomeReady gives e to the first waiter or queues it as ready: a warm one
// (given back as it was) at the end, a fresh one before the warm ones.
// Called with p.mu held.
func (p *Pool) becomeReady(e *entry, warm bool) {
	if len(p.waiters) > 0 {
		w := p.waiters[0]
		p.waiters = p.waiters[1:]
		p.nwaiters.Add(-1)
		e.warm = warm
		w.ch <- result{db: p.handOut(e)}
		return
	}
	e.state = Ready
	e.since = time.Now()
	e.warm = warm
	e.cold = !warm
	at := len(p.ready)
	for !warm && at > 0 && p.dbs[p.ready[at-1]].warm {
		at--
	}
	p.ready = slices.Insert(p.ready, at, e.id)
	p.startWarmer()
	if len(p.ready) > p.base() {
		p.scheduleShrink(p.cfg.IdleTimeout)
	}
}

// startRun notes a hand-out: the first after a pause starts a run, whose
// end is checked RunGap later. Called with p.mu held.
func (p *Pool) startRun() {
	if p.runActive {
		return
	}
	p.runActive = true
	time.AfterFunc(p.cfg.RunGap, p.endRun)
}

// endRun ends the run once RunGap passed without a request or a hand-out
// and nobody waits (else checks again then): a run that took more fresh databases than any before raises
// the demand, and with Learn the pool fills up to it at once, so that the
// next run finds them ready.
func (p *Pool) endRun() {
	p.mu.Lock()
	last := p.LastUsed()
	if p.lastHandOut.After(last) {
		last = p.lastHandOut
	}
	if idle := time.Since(last); (idle < p.cfg.RunGap || len(p.waiters) > 0) && !p.closed {
		time.AfterFunc(max(p.cfg.RunGap-idle, p.cfg.RunGap/4), p.endRun)
		p.mu.Unlock()
		return
	}
	p.runActive = false
	n := p.run
	p.run = 0
	p.resumeDeferred(true)
	grew := n > p.demand
	if grew {
		p.demand = n
		p.target = max(p.target, p.base())
	}
	p.fill() // what the run held back (see fill)
	p.ranSince = true
	p.maybeFlush()
	p.startWarmer()
	p.wake.Broadcast() // a warmer waiting for the run's end
	closed := p.closed
	p.mu.Unlock()
	if grew && !closed && p.cfg.OnDemand != nil {
		p.cfg.OnDemand(n)
	}
}

// scheduleShrink arranges a shrink check in d. Called with p.mu held.
func (p *Pool) scheduleShrink(d time.Duration) {
	if p.cfg.IdleTimeout < 0 {
		return
	}
	at := time.Now().Add(d)
	if !p.shrinkAt.IsZero() && !p.shrinkAt.After(at) && time.Now().Before(p.shrinkAt) {
		return // one is due before then; it reschedules itself if needed
	}
	p.shrinkAt = at
	time.AfterFunc(d+time.Millisecond, p.shrink)
}

// shrink drops the ready databases beyond Initial that have been ready for
// IdleTimeout once the pool went IdleTimeout without an Acquire, and lowers
// what it keeps ahead back to Initial; before then it checks again when
// that time comes.
func (p *Pool) shrink() {
	p.mu.Lock()
	p.shrinkAt = time.Time{}
	base := p.base()
	if p.closed || len(p.ready) <= base && p.target <= base {
		p.mu.Unlock()
		return
	}
	if idle := time.Since(p.LastUsed()); idle < p.cfg.IdleTimeout {
		p.scheduleShrink(p.cfg.IdleTimeout - idle)
		p.mu.Unlock()
		return
	}
	p.target = base
	var gone []*entry
	for len(p.ready) > base {
		e := p.dbs[p.ready[0]] // the longest ready
		if age := time.Since(e.since); age < p.cfg.IdleTimeout {
			p.scheduleShrink(p.cfg.IdleTimeout - age) // just made: give it its time
			break
		}
		p.ready = p.ready[1:]
		gone = append(gone, e)
		p.leaveForDrop(e)
	}
	if len(gone) > 0 {
		p.wg.Add(1)
		go func() {
			defer p.wg.Done()
			for _, e := range gone {
				_ = p.creator.Drop(context.WithoutCancel(p.ctx), e.name)
				p.dropEnded(e)
				if p.cfg.Limiter != nil {
					p.cfg.Limiter.Release(p, 1)
				}
			}
		}()
	}
	p.mu.Unlock()
}

// leaveForDrop takes e out of the pool for a drop the caller makes
// without p.mu, keeping its id (and so its name) from reuse until
// dropEnded. Called with p.mu held.
func (p *Pool) leaveForDrop(e *entry) {
	delete(p.dbs, e.id)
	p.dropping[e.id]++
}

// dropEnded frees the id of e, dropped (or not) since leaveForDrop or
// dropKept. Called without p.mu.
func (p *Pool) dropEnded(e *entry) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.dropping[e.id]--; p.dropping[e.id] <= 0 {
		delete(p.dropping, e.id)
	}
}

// Unlock gives a database back as it is, for reuse by the next test
// (IntegreSQL's unlock: for tests that did not modify it).
func (p *Pool) Unlock(id int) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if k := p.kept[id]; k != nil {
		p.dropKept(k, false) // what a failed test left: never handed out again
		return nil
	}
	e := p.dbs[id]
	if e == nil {
		return p.notFound(id)
	}
	if e.state != InUse {
		return nil // already given back: nothing to do (as IntegreSQL)
	}
	if e.reclaiming {
		e.release = "unlock"
		return nil
	}
	p.inUse.Add(-1)
	p.becomeReady(e, true)
	return nil
}

// Recreate gives a database back for recreation from the template; the work
// happens in the background and the database becomes ready again with its
// generation increased.
func (p *Pool) Recreate(id int) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.lastGiveBack = time.Now()
	if k := p.kept[id]; k != nil {
		p.dropKept(k, false)
		return nil
	}
	e := p.dbs[id]
	if e == nil {
		return p.notFound(id)
	}
	if e.state != InUse {
		return nil
	}
	if e.reclaiming {
		e.release = "recreate"
		return nil
	}
	p.inUse.Add(-1)
	e.state = Dirty
	e.since = time.Now()
	limit, batched := p.batchLimitLocked()
	if p.coveredLocked() || batched && limit <= 0 {
		// The ready ones and those on the way cover the rest of the run,
		// or (Batcher) nobody waits and it would take another batch:
		// recreate when it ends, or when a test needs it (fill), not
		// while the run's tests want the cores.
		e.deferred = true
		p.deferred = append(p.deferred, e)
		// No back-pressure here: a give-back that waited for the drops
		// (tried, issue 58) made a suite's second run wait on them (the
		// volume section, PostgreSQL 18: per-test wait p50 49.6 ms against
		// 4.9 ms without, 2.64x the floor against 1.51x). What a stop
		// leaves the next start drops before it serves, and the disk cap
		// (ManagerConfig.MaxDiskBytes) bounds the total.
		p.startEmptier()
		return nil
	}
	p.spawn(e, e.name)
	return nil
}

// batchLimitLocked is how many more creations (new databases or deferred
// recreations) the pool may start now when its store makes copies in
// batches (Batcher) and a run goes on whose rest is not known (ok false
// otherwise: then Max, the target and, with a known rest, coveredLocked
// bound them). It is enough for the tests waiting, or the copies the
// store can make without another batch, whichever is more, less those on
// the way. Counting those on the way against the spare copies too keeps
// it on the safe side: one may have taken its copy's room already. So a
// batch starts only for a test that waits with nothing on the way for it,
// and a run's end finds at most the spare copies of the last batch made
// ahead. Called with p.mu held.
func (p *Pool) batchLimitLocked() (limit int, ok bool) {
	b, isBatcher := p.creator.(Batcher)
	if !isBatcher || !p.runActive || p.closed {
		return 0, false
	}
	if _, known := p.restLocked(); known {
		return 0, false
	}
	spare, batched := b.Spare(p.cfg.Template)
	if !batched {
		return 0, false
	}
	return max(len(p.waiters), spare) - p.onTheWayLocked(), true
}

// resumeOneLocked starts the first deferred recreation (the emptier
// starts it once it has dropped its used copy, if it drops it now) and
// reports whether there was one. Called with p.mu held.
func (p *Pool) resumeOneLocked() bool {
	if p.closed || len(p.deferred) == 0 {
		return false
	}
	e := p.deferred[0]
	p.deferred = p.deferred[1:]
	e.deferred = false
	if p.dbs[e.id] == e && e.state == Dirty && !e.emptying {
		p.spawn(e, p.usedCopy(e))
	}
	return true
}

// startEmptier starts an emptier while fewer than Parallel run and a used
// copy waits for one. Called with p.mu held.
func (p *Pool) startEmptier() {
	if p.emptiers >= p.cfg.Parallel || p.closed {
		return
	}
	p.emptiers++
	p.wg.Add(1)
	go p.emptier()
}

// emptier drops the used copies of the deferred recreations (Recreate)
// under their names, as they are given back (Parallel emptiers at most,
// one at a time each): the entry
// keeps the name (no hand-out and no other drop can take it) and its
// recreation, at the run's end, only creates. Before, the used copies
// waited under their names for the run's end, and the clients' glue
// stops serve a second after its run, before that: every used copy of the
// run was left to the stop's drop budget, which dropped some and left the
// rest for the next start (issue 58: 23-34 a stop, state folders of
// 324-645 MB). A DROP DATABASE of a used copy in the managed server (no
// fsync) takes a few tens of milliseconds beside the run's tests.
func (p *Pool) emptier() {
	defer p.wg.Done()
	p.mu.Lock()
	defer p.mu.Unlock()
	for {
		var e *entry
		for _, d := range p.deferred {
			if !d.emptied && !d.emptying && !d.unemptied {
				e = d
				break
			}
		}
		if p.closed || e == nil {
			p.emptiers--
			return
		}
		if wait := p.dropPauseLocked(); wait > 0 {
			t := time.AfterFunc(wait, func() {
				p.mu.Lock()
				p.wake.Broadcast()
				p.mu.Unlock()
			})
			p.wake.Wait()
			t.Stop()
			continue
		}
		e.emptying = true
		p.mu.Unlock()
		err := p.retry(func() error { return p.creator.Drop(p.ctx, e.name) })
		p.mu.Lock()
		e.emptying = false
		if err == nil {
			e.emptied = true
		} else if p.ctx.Err() == nil {
			e.unemptied = true
			p.lastErr, p.lastErrAt = err, time.Now()
		}
		if !e.deferred && !p.closed && p.dbs[e.id] == e && e.state == Dirty {
			p.spawn(e, p.usedCopy(e)) // resumed while it was dropped
		}
		p.wake.Broadcast() // whoever waits on the pool: a creation waiting for disk room, Close
	}
}

// dropIdle is how long a run must have been quiet (no request, hand-out
// or give-back in this pool) before the emptiers drop its used copies.
// A drop beside a run's tests takes the cores they want: a test cluster
// stopped and its 2,358 files removed (PostgreSQL 15-17), or a DROP
// DATABASE, which forces a checkpoint that writes the running tests'
// dirty pages. Dropping each copy as it came back made the bench's second
// run 2.3-2.4x its floor on the volume with PostgreSQL 15, against
// 1.33-1.50x when the drops waited for the run (issue 60). The clients'
// glue stops serve a second after a run's last test: the pause is short
// enough for the drops to go in that second.
const dropIdle = 200 * time.Millisecond

// roomer is a Limiter that can tell whether another copy of p fits under
// its disk cap (Manager).
type roomer interface{ HasRoom(p *Pool) bool }

// dropPauseLocked is how long the emptiers wait before their next drop:
// during a run, until it has been quiet for dropIdle; never when a test
// waits, the pool closes, or the disk cap has no room for another copy of
// a pool of full copies (the drop makes that room). Called with p.mu held.
func (p *Pool) dropPauseLocked() time.Duration {
	if !p.runActive || p.closed || len(p.waiters) > 0 {
		return 0
	}
	if r, ok := p.cfg.Limiter.(roomer); ok && p.cfg.CopyBytes > 0 && !r.HasRoom(p) {
		return 0
	}
	last := p.LastUsed()
	for _, t := range []time.Time{p.lastHandOut, p.lastGiveBack} {
		if t.After(last) {
			last = t
		}
	}
	return dropIdle - time.Since(last)
}

// usedCopy is what the recreation of e drops first: its name, unless the
// emptier dropped it. Called with p.mu held.
func (p *Pool) usedCopy(e *entry) string {
	if e.emptied {
		return ""
	}
	return e.name
}

// coveredLocked reports whether the databases ready or on the way cover
// what the run under way is expected to take still (its demand learned
// from earlier runs, less what it took): recreations can wait for its
// end. A run that takes more misses, and the miss starts them
// (resumeDeferred). Measured (issue 33): with Parallel to spare, as it
// was, a pool filled to exactly its demand never deferred, and the second
// run recreated beside its tests; and a pool whose Max holds less than
// the demand (full copies, sized by disk: 258 of bench js's 300) counted
// only the ready ones, so every test's database was recreated beside the
// tests instead of the 42 missing. Counting those on the way makes a run
// recreate only its shortfall. Called with p.mu held.
func (p *Pool) coveredLocked() bool {
	rest, ok := p.restLocked()
	return ok && len(p.ready)+p.onTheWayLocked() >= rest
}

// onTheWayLocked counts the databases being created or recreated, or
// given back and waiting for a creation slot: all but the deferred among
// those not ready and not in use. Called with p.mu held.
func (p *Pool) onTheWayLocked() int {
	n := 0
	for _, e := range p.dbs {
		if e.state == Creating || e.state == Recreating || e.state == Dirty && !e.deferred {
			n++
		}
	}
	return n
}

// restLocked is how many more fresh databases the run under way is
// expected to take: its learned demand less what it took, while it took
// no more than that (ok false: no run, nothing learned, or a run bigger
// than any before). Called with p.mu held.
func (p *Pool) restLocked() (rest int, ok bool) {
	if !p.cfg.Learn || !p.runActive || p.demand <= 0 || p.run > p.demand {
		return 0, false
	}
	return p.demand - p.run, true
}

// resumeDeferred starts the recreations deferred while the ready databases
// covered the run: all of them (the run ended, or the pool closes), or
// while they no longer cover it. During a run of unknown size on a store
// that makes copies in batches, fill starts them instead, as many as the
// tests need (batchLimitLocked). Called with p.mu held.
func (p *Pool) resumeDeferred(all bool) {
	if p.closed {
		return // Close drops them
	}
	if _, batched := p.batchLimitLocked(); !batched { // else fill resumes as many as a test needs
		for len(p.deferred) > 0 && (all || !p.coveredLocked()) {
			p.resumeOneLocked()
		}
	}
	p.wake.Broadcast() // drops waiting for the run's end may go
}

// Keep takes database id, in use, out of the pool for inspection (its
// test failed): it stays as it is under its name, outside Max, until it is
// given back (Unlock or Recreate drop it) or more than KeptMax newer ones
// are kept (the oldest is dropped). The pool makes another database in its
// place.
func (p *Pool) Keep(id int) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.kept[id] != nil {
		return nil
	}
	e := p.dbs[id]
	if e == nil {
		return p.notFound(id)
	}
	if e.state != InUse {
		return errs.Wrap(errs.NotFound, ErrTestNotFound, "template %s, id %d: only a database handed out and not given back can be kept", p.cfg.Hash, id)
	}
	if e.reclaiming {
		e.release = "keep"
		return nil
	}
	p.keepLocked(e, time.Now())
	return nil
}

// keepLocked moves e from the pool to the kept databases, dropping the
// oldest beyond KeptMax, and refills. Called with p.mu held.
func (p *Pool) keepLocked(e *entry, at time.Time) {
	if p.dbs[e.id] == e {
		delete(p.dbs, e.id)
		p.inUse.Add(-1)
		if p.cfg.Limiter != nil {
			p.cfg.Limiter.Release(p, 1)
		}
	}
	e.keptAt = at
	p.kept[e.id] = e
	p.keptOrder = append(p.keptOrder, e.id)
	for len(p.keptOrder) > p.cfg.KeptMax {
		p.dropKept(p.kept[p.keptOrder[0]], true)
	}
	p.fill()
}

// Adopt brings back a database kept before a restart: kept, as Keep
// leaves it, since at.
func (p *Pool) Adopt(id int, name string, at time.Time) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed || p.dbs[id] != nil || p.kept[id] != nil {
		return
	}
	p.keepLocked(&entry{id: id, name: name, state: InUse, since: at}, at)
}

// dropKept forgets kept database e and drops it in the background;
// evicted: to make room (OnKeptDropped is told). Called with p.mu held.
func (p *Pool) dropKept(e *entry, evicted bool) {
	if p.closed {
		return // Close drops it (or leaves it for the next start)
	}
	delete(p.kept, e.id)
	p.keptOrder = slices.DeleteFunc(p.keptOrder, func(id int) bool { return id == e.id })
	p.dropping[e.id]++
	p.wg.Add(1)
	go func() {
		defer p.wg.Done()
		defer p.dropEnded(e)
		// Someone may be looking at it: wait a while for their session
		// to end, not forever.
		ctx, cancel := context.WithTimeout(context.WithoutCancel(p.ctx), time.Minute)
		defer cancel()
		var err error
		for backoff := p.cfg.RetryMin; ; backoff = min(backoff*2, p.cfg.RetryMax) {
			if err = p.creator.Drop(ctx, e.name); err == nil || !errs.IsBusy(err) {
				break
			}
			select {
			case <-time.After(backoff):
				continue
			case <-ctx.Done():
			}
			break
		}
		if evicted && p.cfg.OnKeptDropped != nil {
			p.cfg.OnKeptDropped(e.name, time.Since(e.keptAt), err)
		}
	}()
}

// notFound is the error for an id the pool does not hold: reclaimed ones
// say so. Called with p.mu held.
func (p *Pool) notFound(id int) error {
	if held, ok := p.reclaimed[id]; ok {
		return errs.Wrap(errs.NotFound, ErrTestReclaimed, "template %s, id %d: held for %s while others waited, with no session for at least %s",
			p.cfg.Hash, id, held.Round(time.Millisecond), p.cfg.MinLifetime).
			WithHint("unlock or recreate databases when a test ends, stay connected while using one, or raise the minimum lifetime")
	}
	return errs.Wrap(errs.NotFound, ErrTestNotFound, "template %s, id %d", p.cfg.Hash, id)
}

// reclaimedMax bounds how many reclaimed ids a pool remembers.
const reclaimedMax = 1024

func (p *Pool) rememberReclaimed(id int, held time.Duration) {
	p.reclaimed[id] = held
	p.reclaimedFIFO = append(p.reclaimedFIFO, id)
	if len(p.reclaimedFIFO) > reclaimedMax {
		delete(p.reclaimed, p.reclaimedFIFO[0])
		p.reclaimedFIFO = p.reclaimedFIFO[1:]
	}
}

// fill starts creations so that target databases (during a run whose
// demand is known, no more than its rest) are ready or on the way, plus
// one per waiter, within cfg.Max and the global limit (during a run of
// unknown size on a Batcher store, no more than batchLimitLocked allows,
// the deferred recreations first); when full,
// it reclaims databases in use for longer than MinLifetime for waiters.
// Called with p.mu held.
func (p *Pool) fill() {
	if p.closed || p.evicted {
		return
	}
	inflight := p.onTheWayLocked()
	want := p.target
	if rest, ok := p.restLocked(); ok {
		// A run under way whose demand is known needs only its rest:
		// creating more would compete with its tests for the cores. The
		// pool fills to target again when the run ends.
		want = min(want, rest)
	}
	deficit := want + len(p.waiters) - len(p.ready) - inflight
	if limit, ok := p.batchLimitLocked(); ok {
		// A run of unknown size on a store that makes copies in batches:
		// no batch ahead of demand, and the databases given back come
		// first (their ids are the pool's already).
		deficit = min(deficit, limit)
		for deficit > 0 && p.resumeOneLocked() {
			deficit--
			inflight++
		}
	}
	for deficit > 0 && len(p.dbs) < p.cfg.Max {
		if p.cfg.Limiter != nil && !p.cfg.Limiter.TryReserve(p) {
			break
		}
		e := p.newEntry()
		p.spawn(e, "")
		deficit--
		inflight++
	}
	uncovered := len(p.waiters) - inflight
	if uncovered <= 0 || p.cfg.MinLifetime <= 0 {
		return
	}
	for _, e := range p.dbs {
		if e.reclaiming {
			uncovered-- // its replacement is on the way
		}
	}
	if uncovered <= 0 {
		return
	}
	var cands []*entry
	for _, e := range p.dbs {
		if e.state == InUse && !e.reclaiming {
			cands = append(cands, e)
		}
	}
	sort.Slice(cands, func(i, j int) bool { return cands[i].since.Before(cands[j].since) })
	now := time.Now()
	_, canCount := p.creator.(SessionCounter)
	probe := false
	for _, old := range cands {
		if uncovered == 0 {
			break
		}
		if age := now.Sub(old.since); age < p.cfg.MinLifetime {
			p.scheduleKick(p.cfg.MinLifetime - age)
			break
		}
		if canCount && (old.idleSince.IsZero() || now.Sub(old.idleSince) < p.cfg.MinLifetime) {
			probe = true // not yet seen without sessions for long enough
			continue
		}
		old.reclaiming = true
		p.reclaim(old)
		uncovered--
	}
	if probe {
		p.probeSessions()
	}
}

// reclaim drops e (in use, held too long with no session) once, in the
// background: if it is gone, e's id is retired (a late unlock by its holder
// gets ErrTestReclaimed) and a new database is created under a new id; if a
// session came back, e stays with its holder. Called with p.mu held.
func (p *Pool) reclaim(e *entry) {
	if p.closed {
		return // Close drops it
	}
	p.wg.Add(1)
	go func() {
		defer p.wg.Done()
		err := p.creator.Drop(p.ctx, e.name)
		p.mu.Lock()
		defer p.mu.Unlock()
		if p.closed || p.dbs[e.id] != e {
			return
		}
		e.reclaiming = false
		if err != nil {
			if !errs.IsBusy(err) {
				p.lastErr, p.lastErrAt = err, time.Now()
			}
			e.idleSince = time.Time{}
			switch e.release {
			case "keep":
				p.keepLocked(e, time.Now())
			case "unlock":
				p.inUse.Add(-1)
				p.becomeReady(e, true)
			case "recreate":
				p.inUse.Add(-1)
				e.state, e.since = Dirty, time.Now()
				p.spawn(e, e.name)
			}
			e.release = ""
			p.fill()
			return
		}
		delete(p.dbs, e.id)
		p.inUse.Add(-1)
		if e.release == "" {
			p.rememberReclaimed(e.id, time.Since(e.since))
		}
		n := p.newEntry()
		p.spawn(n, "")
	}()
}

// probeSessions samples the sessions of databases in use while callers
// wait, recording for each since when it has had none, until nobody waits.
// Called with p.mu held.
func (p *Pool) probeSessions() {
	sc, ok := p.creator.(SessionCounter)
	if !ok || p.probing || p.closed {
		return
	}
	p.probing = true
	interval := min(max(p.cfg.MinLifetime/4, 10*time.Millisecond), time.Second)
	p.wg.Add(1)
	go func() {
		defer p.wg.Done()
		for {
			p.mu.Lock()
			var names []string
			for _, e := range p.dbs {
				if e.state == InUse && !e.reclaiming {
					names = append(names, e.name)
				}
			}
			if p.closed || len(p.waiters) == 0 || len(names) == 0 {
				p.probing = false
				p.mu.Unlock()
				return
			}
			p.mu.Unlock()
			counts, err := sc.Sessions(p.ctx, names)
			p.mu.Lock()
			if err == nil {
				now := time.Now()
				for _, e := range p.dbs {
					if e.state != InUse || e.reclaiming {
						continue
					}
					c, seen := counts[e.name]
					if !seen {
						c = Sessions{Established: -1}
					}
					// A session now, or one that came and went since the
					// last sample (the server's count of sessions moved).
					came := c.Established >= 0 && e.established >= 0 && c.Established != e.established
					e.established = c.Established
					if c.Connected > 0 || came {
						e.idleSince = time.Time{}
					} else if e.idleSince.IsZero() {
						e.idleSince = now
					}
				}
				p.fill()
			}
			p.mu.Unlock()
			select {
			case <-time.After(interval):
			case <-p.ctx.Done():
				p.mu.Lock()
				p.probing = false
				p.mu.Unlock()
				return
			}
		}
	}()
}

func (p *Pool) scheduleKick(d time.Duration) {
	at := time.Now().Add(d)
	if !p.kickAt.IsZero() && p.kickAt.Before(at) && time.Now().Before(p.kickAt) {
		return
	}
	p.kickAt = at
	time.AfterFunc(d+time.Millisecond, p.Kick)
}

// Kick re-evaluates the pool's refill (after the global limit freed room).
func (p *Pool) Kick() {
	p.mu.Lock()
	p.fill()
	p.mu.Unlock()
}

func (p *Pool) newEntry() *entry {
	id := p.freeID()
	if p.cfg.NextID != nil {
		id = p.cfg.NextID()
	}
	e := &entry{id: id, name: p.cfg.Name(id), state: Creating, since: time.Now()}
	p.dbs[id] = e
	// An id reused for a new database no longer names a reclaimed one.
	delete(p.reclaimed, id)
	return e
}

// freeID returns the smallest id no database of the pool has: ids stay
// small and come back with their database names, as IntegreSQL's do.
// Called with p.mu held.
func (p *Pool) freeID() int {
	for id := 0; ; id++ {
		if _, used := p.dbs[id]; !used && p.kept[id] == nil && p.dropping[id] == 0 {
			return id
		}
	}
}

// spawn creates e in the background, dropping dropFirst before (the old
// copy of a database being recreated or reclaimed). Called with p.mu held.
// A closed pool starts nothing: Close waits for the work started before it
// (a WaitGroup may not grow while it is waited on) and drops e itself.
func (p *Pool) spawn(e *entry, dropFirst string) {
	if p.closed {
		return
	}
	p.wg.Add(1)
	p.pending++
	go func() {
		defer p.wg.Done()
		defer func() {
			p.mu.Lock()
			p.pending--
			if p.pending == 0 {
				p.wake.Broadcast()
				p.maybeFlush()
			}
			p.mu.Unlock()
		}()
		if dropFirst == e.name {
			// Recreation: rename the used copy away (before taking a
			// creation slot: its holder's backend may linger a moment)
			// and drop it in the background.
			if retired, err := p.retire(e.name); err != nil {
				p.failed(e, err)
				return
			} else if retired {
				dropFirst = ""
			}
		}
		select {
		case p.sem <- struct{}{}:
		case <-p.ctx.Done():
			return
		}
		defer func() { <-p.sem }()
		p.mu.Lock()
		if e.state == Dirty {
			e.state = Recreating
			e.since = time.Now()
		}
		// From here its name may exist again: Close drops it.
		e.emptied, e.unemptied = false, false
		p.mu.Unlock()
		strategy, err := p.build(e, dropFirst)
		if err != nil {
			p.failed(e, err)
			return
		}
		p.prewarm(e.name, strategy)
		cf, ok := p.creator.(CacheFiler)
		noFile := ok && !cf.CarriesCacheFile(strategy)
		p.mu.Lock()
		defer p.mu.Unlock()
		if p.closed || p.dbs[e.id] != e {
			return
		}
		if e.state == Recreating {
			e.gen++
		}
		p.unflushed = true
		e.noCacheFile, e.madeNoFile = noFile, noFile // cleared when the warmer or a test takes it
		p.becomeReady(e, false)
		p.fill()
	}()
}

// prewarm reads copy name, just made by strategy, ahead into the page
// cache (Prewarmer) unless a test waits for a database: then the copy is
// its, at once (see Prewarmer for why and what it saved). Nor during a
// run of unknown size on a Batcher store: it makes copies for the tests
// that wait and the spare ones of the batch they started, which the run's
// next tests take at once, and the read-ahead (every catalog of the
// copy, where a test reads a few of their pages) costs more CPU than it
// saves them. Measured (issue 60, bench's volume section, PostgreSQL 15,
// first run in CPU time against its bound, in turns under load 10-22):
// 1.11-1.21x without, 1.30-1.52x with; docs/server.md, "Cloned clusters".
func (p *Pool) prewarm(name, strategy string) {
	pw, ok := p.creator.(Prewarmer)
	if !ok {
		return
	}
	p.mu.Lock()
	awaited := len(p.waiters) > 0
	_, batched := p.batchLimitLocked()
	p.mu.Unlock()
	if !awaited && !batched {
		pw.Prewarm(p.ctx, name, strategy)
	}
}

// flushTimeout bounds one Flusher.Flush.
const flushTimeout = 5 * time.Minute

// maybeFlush writes the databases made since the last flush to disk
// (Flusher) once the pool has settled after a run: the run ended, no other
// is under way and nothing is being made. Not after a fill that no run
// ended before (a template just finalized, a start): its run follows at
// once, and a flush (syncfs: the whole filesystem, whatever else is dirty
// on it, such as a build's output) would compete with it. Measured (bench
// rust, ext4): with a flush after the first fill, the cold run took 32.6 s
// instead of 10-21 s. One flush at a time; creations that end during it
// are flushed after the next run. Called with p.mu held.
func (p *Pool) maybeFlush() {
	f, ok := p.creator.(Flusher)
	if !ok || p.closed || p.flushing || !p.unflushed || !p.ranSince || p.runActive || p.pending > 0 {
		return
	}
	p.flushing, p.unflushed, p.ranSince = true, false, false
	p.wg.Add(1)
	go func() {
		defer p.wg.Done()
		ctx, cancel := context.WithTimeout(p.ctx, flushTimeout)
		_ = f.Flush(ctx) // best effort: the kernel writes them back all the same
		cancel()
		p.mu.Lock()
		defer p.mu.Unlock()
		p.flushing = false
		p.maybeFlush()
	}()
}

// failed forgets e after its creation failed. Called without p.mu.
func (p *Pool) failed(e *entry, err error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed || p.dbs[e.id] != e {
		return
	}
	delete(p.dbs, e.id)
	p.lastErr, p.lastErrAt = err, time.Now()
	if p.cfg.Limiter != nil {
		p.cfg.Limiter.Release(p, 1)
	}
}

// retire renames database name away and drops it in the background, when
// the creator can rename (Retirer) and fewer than GrowMax used copies wait
// for their drop; it reports whether it did. Called without p.mu.
func (p *Pool) retire(name string) (bool, error) {
	r, ok := p.creator.(Retirer)
	if !ok {
		return false, nil
	}
	p.mu.Lock()
	if len(p.trash) >= p.cfg.GrowMax {
		// Drops do not keep up (a long run of recreations): this one drops
		// first, so the used copies never exceed the pool's own size
		// (GrowMax: a pool sized by the disk does not pile up full copies
		// waiting for their drop either).
		p.mu.Unlock()
		return false, nil
	}
	if p.cfg.Limiter != nil && !p.cfg.Limiter.TryReserveUsed(p) {
		// The limit on disk is reached: the used copy goes before its
		// fresh one is made, as beyond GrowMax.
		p.mu.Unlock()
		return false, nil
	}
	p.trashSeq++
	trash := p.cfg.Name(-p.trashSeq)
	// Known before the rename: a Close that cancels it may find the
	// server did it all the same, and drops the name if it exists.
	p.trash[trash] = true
	p.mu.Unlock()
	if err := p.retry(func() error { return r.Rename(p.ctx, name, trash) }); err != nil {
		if p.ctx.Err() == nil {
			p.mu.Lock()
			delete(p.trash, trash)
			p.releaseUsed(1)
			p.mu.Unlock()
		}
		if errs.Is(err, errs.Unsupported) {
			return false, nil // a store whose creator cannot: drop, then create
		}
		return false, err
	}
	p.mu.Lock()
	p.trashQ = append(p.trashQ, trash)
	if p.droppers < p.cfg.Parallel && !p.closed {
		p.droppers++
		p.wg.Add(1)
		go p.dropper()
	}
	p.mu.Unlock()
	return true, nil
}

// releaseUsed tells the Limiter that n used copies renamed away are gone
// (or no longer the pool's to drop). Called with p.mu held.
func (p *Pool) releaseUsed(n int) {
	if p.cfg.Limiter != nil && n > 0 {
		p.cfg.Limiter.ReleaseUsed(p, n)
	}
}

// dropper drops the used copies that recreations renamed away, Parallel
// at a time when no creation is on the way and no run covered by the ready
// databases goes on (coveredLocked): a DROP DATABASE costs the
// server about what a CREATE does (BenchmarkCreateRate: bare CREATE and
// DROP at 14–25 db/s against CREATE alone at 20–37 under load), so while
// tests wait for databases the drops wait, unless half of GrowMax pile
// up (all of it for clones, below); then one at a time (at GrowMax a recreation drops before it creates:
// see retire). Measured (bench's volume section, 80 writing tests on 4
// workers, full copies of a 187 MB template on ext4, PostgreSQL 18): with
// the bound at a disk-sized Max of 99 the used copies piled up for the
// whole first run, which took 36.9 s; bounded by GrowMax (8), 9.5 s.
// Clones (BlockSharer) cost no disk while they wait, but their drop the
// server's CPU as their creation does (a DROP DATABASE unlinks the few
// hundred files a clone is): they wait until GrowMax pile up. Measured
// (issue 33: 80 writing tests on 4 workers, a 187 MB template,
// PostgreSQL 18 with clone on the XFS image, 2 cores, first run on a
// fresh serve, 3 runs each in turns): 3.28-3.74 s with drops from half of
// GrowMax (64) on, 2.76-3.00 s from GrowMax (128).
func (p *Pool) dropper() {
	defer p.wg.Done()
	p.mu.Lock()
	defer p.mu.Unlock()
	wait := max(p.cfg.GrowMax/2, 1)
	if b, ok := p.creator.(BlockSharer); ok && b.SharesBlocks() {
		wait = p.cfg.GrowMax
	}
	for {
		if p.closed || len(p.trashQ) == 0 {
			p.droppers--
			return // Close drops what is left
		}
		if p.pending > 0 && (len(p.trashQ) < wait || p.dropsActive > 0) || p.coveredLocked() {
			p.wake.Wait()
			continue
		}
		name := p.trashQ[0]
		p.trashQ = p.trashQ[1:]
		p.dropsActive++
		p.mu.Unlock()
		err := p.retry(func() error { return p.creator.Drop(p.ctx, name) })
		p.mu.Lock()
		p.dropsActive--
		p.wake.Broadcast() // another dropper may go now
		if err == nil {
			delete(p.trash, name)
			p.releaseUsed(1)
		} else if p.ctx.Err() == nil {
			p.lastErr, p.lastErrAt = err, time.Now()
		}
	}
}

// build drops dropFirst (retrying while sessions are connected) and clones
// e from the template (retrying while the template has sessions), and
// returns the strategy the creator used. A
// database left under e's name (by a crash, or a drop that failed) is
// dropped when the creation finds it, not looked for before each one.
func (p *Pool) build(e *entry, dropFirst string) (string, error) {
	if dropFirst != "" {
		if err := p.retry(func() error { return p.creator.Drop(p.ctx, dropFirst) }); err != nil {
			return "", err
		}
	}
	start := time.Now()
	var strategy string
	// CREATE DATABASE is not cancelled when the pool closes: a cancelled
	// statement can still commit on the server after the client gave up, and
	// the database would outlive the pool's final drops. Close waits for it
	// instead (p.wg) and drops it with the rest.
	createCtx := context.WithoutCancel(p.ctx)
	dropped := false
	err := p.retry(func() error {
		var err error
		strategy, err = p.creator.Create(createCtx, e.name, p.cfg.Template, p.cfg.Owner)
		if errs.IsExists(err) && !dropped {
			dropped = true
			if err := p.retry(func() error { return p.creator.Drop(p.ctx, e.name) }); err != nil {
				return err
			}
			strategy, err = p.creator.Create(createCtx, e.name, p.cfg.Template, p.cfg.Owner)
		}
		return err
	})
	if p.cfg.Observer != nil && !errors.Is(err, context.Canceled) {
		p.cfg.Observer.Created(p.cfg.Hash, strategy, time.Since(start), err)
	}
	return strategy, err
}

// retry runs f until it succeeds, fails with an error other than an
// errs.Busy one (sessions connected, a lock held), or the pool closes.
func (p *Pool) retry(f func() error) error {
	backoff := p.cfg.RetryMin
	for {
		err := f()
		if err == nil || !errs.IsBusy(err) {
			return err
		}
		select {
		case <-time.After(backoff):
		case <-p.ctx.Done():
			return p.ctx.Err()
		}
		backoff = min(backoff*2, p.cfg.RetryMax)
	}
}

// Evict drops the pool's ready databases if nobody uses the pool, for the
// global limit. The pool refills on its next Acquire. It returns how many
// databases it dropped.
func (p *Pool) Evict(ctx context.Context) int {
	p.mu.Lock()
	if p.closed || len(p.waiters) > 0 || p.inUse.Load() > 0 || len(p.ready) == 0 {
		p.mu.Unlock()
		return 0
	}
	p.evicted = true
	p.target = p.base()
	var gone []*entry
	for _, id := range p.ready {
		gone = append(gone, p.dbs[id])
		p.leaveForDrop(p.dbs[id])
	}
	p.ready = nil
	p.mu.Unlock()
	n := 0
	for _, e := range gone {
		if err := p.creator.Drop(ctx, e.name); err == nil {
			n++
		}
		p.dropEnded(e)
		if p.cfg.Limiter != nil {
			p.cfg.Limiter.Release(p, 1)
		}
	}
	return n
}

// Close stops the pool: waiters get ErrClosed, background work stops, and
// with drop every database of the pool is dropped. It returns the first
// drop error.
func (p *Pool) Close(ctx context.Context, drop bool) error {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return nil
	}
	p.closed = true
	// The run under way ends here: a server stopped right after its
	// tests (the clients' auto-started serve) must still learn what
	// they took, or its next start fills only Initial.
	ran := p.run
	grew := p.runActive && ran > p.demand
	if grew {
		p.demand = ran
	}
	p.runActive, p.run = false, 0
	for _, w := range p.waiters {
		w.ch <- result{err: errs.Wrap(errs.Busy, ErrClosed, "template %s", p.cfg.Hash)}
	}
	p.waiters = nil
	p.nwaiters.Store(0)
	p.cancel()
	p.wake.Broadcast()
	var early []string
	released := 0
	if drop {
		early, released = p.idleForDropLocked()
	}
	p.mu.Unlock()
	// The databases no work of the pool touches are dropped now, while
	// that work ends (a CREATE DATABASE under way is waited for, not
	// cancelled: see build). Before, every drop waited for it: a serve
	// stopped while copies were made (full copies: 0.5-1 s under load)
	// spent its whole drop budget waiting and dropped none (issue 58:
	// "dropped 0 test databases; 26 left for the next start to drop").
	earlyErr := make(chan error, 1)
	go func() {
		var first error
		for _, name := range early {
			if err := p.creator.Drop(ctx, name); err != nil && first == nil {
				first = err
			}
		}
		earlyErr <- first
	}()
	if grew && p.cfg.OnDemand != nil {
		p.cfg.OnDemand(ran)
	}
	p.wg.Wait()
	first := <-earlyErr

	p.mu.Lock()
	var names []string
	var left []Kept
	for _, e := range p.dbs {
		if drop && p.cfg.PersistReady && p.cfg.OnReadyLeft != nil && e.state == Ready && !e.warm {
			left = append(left, Kept{Hash: p.cfg.Hash, ID: e.id, Name: e.name, At: e.since})
			continue
		}
		if e.emptied {
			continue // dropped by the emptier
		}
		names = append(names, e.name)
	}
	for name := range p.trash {
		names = append(names, name)
	}
	p.releaseUsed(len(p.trash))
	if !p.cfg.PersistKept {
		for _, e := range p.kept {
			names = append(names, e.name)
		}
	}
	p.kept, p.keptOrder = map[int]*entry{}, nil
	p.deferred = nil
	p.trash = map[string]bool{}
	p.trashQ = nil
	n := len(p.dbs) + released
	p.dbs = map[int]*entry{}
	p.ready = nil
	p.mu.Unlock()
	if drop {
		if len(left) > 0 && p.cfg.OnReadyLeft != nil {
			p.cfg.OnReadyLeft(ctx, left)
		}
		for _, name := range names {
			if err := p.creator.Drop(ctx, name); err != nil && first == nil {
				first = err
			}
		}
	}
	if p.cfg.Limiter != nil && n > 0 {
		p.cfg.Limiter.Release(p, n)
	}
	return first
}

// idleForDropLocked takes out of the pool, for Close to drop at once,
// the databases that no goroutine of the pool works on: those in use (not
// being reclaimed), the ready ones Close does not leave for the next
// start (not the one the warmer connects to), the used ones whose
// recreation waits for the run's end, the used copies renamed away and
// waiting for a dropper, and the kept ones it does not leave. It returns
// their names and how many of them were the pool's (for the Limiter).
// Called with p.mu held, once the pool is closed.
func (p *Pool) idleForDropLocked() (names []string, taken int) {
	for id, e := range p.dbs {
		idle := false
		switch e.state {
		case InUse:
			idle = !e.reclaiming
		case Ready:
			leave := p.cfg.PersistReady && p.cfg.OnReadyLeft != nil && !e.warm
			idle = !leave && e.name != p.warmingName
		case Dirty:
			idle = e.deferred && !e.emptying
			if idle && e.emptied { // its used copy is gone already
				delete(p.dbs, id)
				taken++
				continue
			}
		}
		if idle {
			names = append(names, e.name)
			delete(p.dbs, id)
			taken++
		}
	}
	p.ready = slices.DeleteFunc(p.ready, func(id int) bool { return p.dbs[id] == nil })
	for _, name := range p.trashQ {
		names = append(names, name)
		delete(p.trash, name)
		p.releaseUsed(1)
	}
	p.trashQ = nil
	if !p.cfg.PersistKept {
		for id, e := range p.kept {
			names = append(names, e.name)
			delete(p.kept, id)
		}
		p.keptOrder = nil
	}
	return names, taken
}

// dropAllOnClose makes Close drop the kept and the ready databases too
// (their template goes: discard, reset).
func (p *Pool) dropAllOnClose() {
	p.mu.Lock()
	p.cfg.PersistKept, p.cfg.PersistReady = false, false
	p.mu.Unlock()
}

// Stats are the pool's counts by state.
type Stats struct {
	ByState map[State]int
	Waiters int
	Total   int
	Max     int
	// Target is how many databases the pool now keeps ready or on the way
	// (Initial, grown by demand); Misses counts acquires that found none
	// ready and waited for one.
	Target int
	Misses int
	// Dropping counts used copies renamed away by recreations and not yet
	// dropped (outside Total; at most Config.GrowMax).
	Dropping int
	// Kept counts databases kept for inspection (outside Total and Max;
	// at most KeptMax).
	Kept, KeptMax int
	// Demand is the most fresh databases one run took; Base what the pool
	// keeps ready or on the way when idle (Initial, or with Learn Demand
	// within Max).
	Demand, Base int
	// Flushing: the pool writes the databases it made to disk (Flusher).
	Flushing bool
	// Warming counts the fresh ready databases, of the next WarmAhead
	// handed out, the pool has not connected to yet (Warmer), the one it
	// connects to now included.
	Warming int
}

// Stats returns the pool's current counts.
func (p *Pool) Stats() Stats {
	p.mu.Lock()
	defer p.mu.Unlock()
	return Stats{ByState: p.countsLocked(), Waiters: len(p.waiters), Total: len(p.dbs), Max: p.cfg.Max, Target: p.target, Misses: p.misses,
		Dropping: len(p.trash), Kept: len(p.kept), KeptMax: p.cfg.KeptMax, Demand: p.demand, Base: p.base(), Warming: p.warmingLocked(), Flushing: p.flushing}
}

// warmingLocked counts the ready databases still to warm (of the next
// WarmAhead), the one warmed now included. Called with p.mu held.
func (p *Pool) warmingLocked() int {
	n := boolInt(p.warmingNow)
	if _, ok := p.creator.(Warmer); !ok {
		return n
	}
	for i := range p.ready {
		n += boolInt(p.toWarm(i, false))
	}
	return n
}

func (p *Pool) countsLocked() map[State]int {
	c := map[State]int{}
	for _, e := range p.dbs {
		c[e.state]++
	}
	return c
}
