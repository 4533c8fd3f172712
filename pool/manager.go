package pool

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"sort"
	"strconv"
	"sync"
	"time"

	"github.com/pgfork/pgfork/internal/errs"
)

// MaxID is the largest test database id accepted from a client.
const MaxID = 1<<31 - 1

// ParseID parses a test database id from a client: decimal digits only.
func ParseID(s string) (int, bool) {
	if s == "" || len(s) > 10 {
		return 0, false
	}
	for _, c := range s {
		if c < '0' || c > '9' {
			return 0, false
		}
	}
	n, err := strconv.Atoi(s)
	if err != nil || n > MaxID {
		return 0, false
	}
	return n, true
}

// ManagerConfig shapes a Manager.
type ManagerConfig struct {
	Prefix       string // database name prefix (default "pgfork")
	Owner        string // owner of template and test databases
	Initial      int    // databases each pool keeps ready
	Max          int    // databases per pool
	Parallel     int    // concurrent creations per pool
	MaxDatabases int    // global limit on test databases across pools; 0: none
	MinLifetime  time.Duration
	// IdleTimeout: after this long without a request, a pool drops the
	// ready databases it grew beyond Initial (0: pool.DefaultIdleTimeout;
	// negative: never).
	IdleTimeout time.Duration
	// FinalizeTimeout bounds how long GetTestDatabase waits for a template
	// being initialized to be finalized.
	FinalizeTimeout time.Duration
	// GetTimeout bounds how long GetTestDatabase waits for a ready database.
	GetTimeout time.Duration
	// RootTemplate is what template databases are created from (template0).
	RootTemplate string
	Observer     Observer
	// NoPersist keeps template state in memory only.
	NoPersist bool
	// LearnDemand: each pool keeps as many databases ready as the biggest
	// run of its template took (recorded with the template's state, so it
	// holds across restarts), within Max, and fills to that as soon as the
	// template is ready and after every run (Config.Learn). Set by
	// Sizes.Apply unless the user gave Initial.
	LearnDemand bool
	// LearnMax, above Max, is how many databases a pool's learned demand
	// may fill it to; misses grow it only to Max (Config.GrowMax). 0:
	// Max. Set by Sizes.Apply unless the user gave Max.
	LearnMax int
	// MaxBySize, when set and the store is a Sizer, gives each pool its
	// Max from its template's size in bytes when the pool starts (full
	// copies take that much disk each; see SpaceMax); a result ≤ 0, or a
	// size the store cannot tell, keeps LearnMax (or Max). Misses grow a
	// pool no further than Max all the same (Config.GrowMax): only its
	// learned demand fills it beyond.
	MaxBySize func(templateBytes int64) int
	// MaxDiskBytes caps the disk the test databases of all pools take
	// (issue 58: a state directory grew to 324-645 MB): ready ones, those
	// in use, those given back and waiting for their recreation, and the
	// used copies renamed away and waiting for their drop, each counted
	// at its template's size (pg_database_size; the store must be a
	// Sizer). A database is made, and a used copy kept for a drop in the
	// background, only while that leaves the total within the cap, or
	// when the pools have none (a cap smaller than one copy still serves
	// one at a time); else a recreation drops the used copy first, and the
	// least recently used idle pool gives up its ready ones, as for
	// MaxDatabases. Kept databases are outside it (never dropped for it),
	// and so are copies that share their template's blocks (reflink
	// clones: BlockSharer), which take no disk of their own. 0 (or less):
	// no cap. MaxDiskAuto asks the caller that knows where the copies live
	// (serve) to set it from that filesystem's free space.
	MaxDiskBytes int64
	// RunGap: hand-outs further apart than this are two runs (0:
	// DefaultRunGap).
	RunGap time.Duration
	// KeptMax bounds the databases kept for inspection per template
	// (Keep), outside Max (0: DefaultKeptMax).
	KeptMax int
	// Log receives what the manager does on its own that a user may want
	// to know (kept databases dropped beyond KeptMax); nil: discarded.
	Log *slog.Logger
}

// TemplateState is the state of a template.
type TemplateState int

// Template states.
const (
	TemplateInitializing TemplateState = iota
	TemplateFinalized
	TemplateDiscarded
)

type template struct {
	hash       string
	db         string
	state      TemplateState
	demand     int    // from the template's record
	kept       []Kept // kept before the restart, for its pool
	ready      []Kept // left ready by the last clean stop, for its pool
	finalizing bool
	finalized  chan struct{} // closed when finalized or discarded
	pool       *Pool
}

// Manager holds the templates and their pools.
type Manager struct {
	cfg       ManagerConfig
	store     Store
	mu        sync.Mutex
	templates map[string]*template
	discarded map[string]bool
	// going holds, by hash, a channel closed once a template discarded or
	// reset has had its pool's databases, its template database and its
	// record dropped: a new template of the hash has the same names, and
	// waits for it (InitializeTemplate), or those drops could remove its
	// databases under its clients.
	going map[string]chan struct{}
	total int // test databases reserved across pools
	// bytes is the disk the reserved test databases and the used copies
	// waiting for their drop take (MaxDiskBytes).
	bytes    int64
	evicting int
	closed   bool
	// storeClosed: the store is closed (after the pools), so nothing
	// more can be recorded. Between closed and storeClosed the pools
	// still record their last runs (saveDemand).
	storeClosed bool
}

// NewManager returns a manager whose templates and test copies live in
// store (dbstore.New for databases in one server, clusterstore for whole
// clusters). Call Open before use.
func NewManager(cfg ManagerConfig, store Store) (*Manager, error) {
	if cfg.Prefix == "" {
		cfg.Prefix = "pgfork"
	}
	if !ValidPrefix(cfg.Prefix) {
		return nil, errs.New(errs.Usage, "database prefix %q is not valid", cfg.Prefix).WithHint("use 1-20 lower-case letters, digits or _, starting with a letter")
	}
	if cfg.RootTemplate == "" {
		cfg.RootTemplate = "template0"
	}
	if cfg.Max <= 0 {
		cfg.Max = 32
	}
	if cfg.Initial > cfg.Max {
		cfg.Initial = cfg.Max
	}
	if cfg.FinalizeTimeout <= 0 {
		cfg.FinalizeTimeout = time.Minute
	}
	if cfg.GetTimeout <= 0 {
		cfg.GetTimeout = time.Minute
	}
	if cfg.KeptMax <= 0 {
		cfg.KeptMax = DefaultKeptMax
	}
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	return &Manager{cfg: cfg, store: store,
		templates: map[string]*template{}, discarded: map[string]bool{}, going: map[string]chan struct{}{}}, nil
}

// Open drops test copies left by a previous run (their state is unknown
// after a crash) and brings back finalized templates, whose pools refill in
// the background. Templates that were still initializing are dropped:
// their migrations never finished. Test database ids are small and reused
// per template, with their names, as IntegreSQL's.
func (m *Manager) Open(ctx context.Context) error {
	recs, _, err := m.store.Recover(ctx, m.cfg.Prefix, m.cfg.Prefix+"_test_", !m.cfg.NoPersist)
	if err != nil {
		return err
	}
	kept, err := m.kept(ctx)
	if err != nil {
		return err
	}
	ready, err := m.readyLeft(ctx)
	if err != nil {
		return err
	}
	for _, r := range recs {
		exists, err := m.store.TemplateExists(ctx, r.Name)
		if err != nil {
			return err
		}
		if r.State != "finalized" || !exists || !ValidHash(r.Hash) || r.Name != m.templateName(r.Hash) {
			if exists && r.Name == m.templateName(r.Hash) {
				_ = m.store.DropTemplate(ctx, r.Name)
			}
			_ = m.forget(ctx, r.Hash)
			continue
		}
		t := &template{hash: r.Hash, db: r.Name, state: TemplateFinalized, demand: r.Demand, finalized: make(chan struct{}),
			kept: kept[r.Hash], ready: ready[r.Hash]}
		delete(kept, r.Hash)
		delete(ready, r.Hash)
		close(t.finalized)
		m.mu.Lock()
		m.templates[r.Hash] = t
		m.mu.Unlock()
		t.pool = m.newPool(ctx, t)
		t.kept, t.ready = nil, nil
	}
	// Kept and ready databases of templates gone go too.
	for _, ks := range ready {
		kept[""] = append(kept[""], ks...)
	}
	for _, ks := range kept {
		for _, k := range ks {
			if err := m.store.Drop(ctx, k.Name); err != nil {
				return err
			}
		}
	}
	return nil
}

// kept returns the databases kept before the restart (a KeptStore's) by
// template, oldest first.
func (m *Manager) kept(ctx context.Context) (map[string][]Kept, error) {
	ks, ok := m.store.(KeptStore)
	if !ok || m.cfg.NoPersist {
		return nil, nil
	}
	list, err := ks.Kept(ctx, m.cfg.Prefix)
	if err != nil {
		return nil, err
	}
	sort.SliceStable(list, func(i, j int) bool { return list[i].At.Before(list[j].At) })
	by := map[string][]Kept{}
	for _, k := range list {
		if k.Name == m.TestName(k.Hash, k.ID) {
			by[k.Hash] = append(by[k.Hash], k)
		}
	}
	return by, nil
}

// readyLeft returns the fresh databases the last clean stop left ready
// (a ReadyStore's), by template; the store forgets them as it hands them
// over, so that after a crash they are swept as any other test copy.
func (m *Manager) readyLeft(ctx context.Context) (map[string][]Kept, error) {
	rs, ok := m.store.(ReadyStore)
	if !ok || m.cfg.NoPersist {
		return nil, nil
	}
	list, err := rs.TakeReady(ctx, m.cfg.Prefix)
	if err != nil {
		return nil, err
	}
	by := map[string][]Kept{}
	for _, k := range list {
		by[k.Hash] = append(by[k.Hash], k)
	}
	return by, nil
}

// saveReady records the fresh databases a pool leaves ready as it closes,
// for the next start (Config.OnReadyLeft); if that fails they are swept
// then, as any other test copy.
func (m *Manager) saveReady(ctx context.Context, left []Kept) {
	rs, ok := m.store.(ReadyStore)
	if !ok {
		return
	}
	if err := rs.SaveReady(ctx, m.cfg.Prefix, left); err != nil {
		m.cfg.Log.Warn("cannot record the ready databases for the next start: it makes them again", "databases", len(left), "err", err)
	}
}

func (m *Manager) save(ctx context.Context, hash, db, state string, demand int) error {
	if m.cfg.NoPersist {
		return nil
	}
	return m.store.Save(ctx, m.cfg.Prefix, Record{Hash: hash, Name: db, State: state, Demand: demand})
}

// saveDemand records a bigger run of template t, for the next start.
func (m *Manager) saveDemand(t *template, demand int) {
	m.mu.Lock()
	if t.state != TemplateFinalized || m.templates[t.hash] != t || m.storeClosed || demand <= t.demand {
		m.mu.Unlock()
		return
	}
	t.demand = demand
	m.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := m.save(ctx, t.hash, t.db, "finalized", demand); err != nil {
		m.cfg.Log.Warn("cannot record the demand of a template's pool", "template", t.hash, "demand", demand, "err", err)
	}
}

func (m *Manager) forget(ctx context.Context, hash string) error {
	if m.cfg.NoPersist {
		return nil
	}
	return m.store.Forget(ctx, m.cfg.Prefix, hash)
}

func (m *Manager) dbName(kind, hash, suffix string) string {
	return DatabaseName(m.cfg.Prefix, kind, hash, suffix)
}

func (m *Manager) templateName(hash string) string { return m.dbName("template", hash, "") }

// TestName returns the database name of test database id of a template.
func (m *Manager) TestName(hash string, id int) string {
	return m.dbName("test", hash, fmt.Sprintf("_%03d", id))
}

func (m *Manager) newPool(ctx context.Context, t *template) *Pool {
	hash := t.hash
	_, persistKept := m.store.(KeptStore)
	_, persistReady := m.store.(ReadyStore)
	copyBytes := m.copyBytes(ctx, t)
	return New(Config{CopyBytes: copyBytes,
		Hash: hash, Template: t.db, Owner: m.cfg.Owner,
		Name:    func(id int) string { return m.TestName(hash, id) },
		Initial: m.cfg.Initial, Max: m.maxOf(ctx, t), GrowMax: m.cfg.Max, Parallel: m.cfg.Parallel,
		MinLifetime: m.cfg.MinLifetime, IdleTimeout: m.cfg.IdleTimeout, Limiter: m, Observer: m.cfg.Observer,
		Demand: t.demand, Learn: m.cfg.LearnDemand, RunGap: m.cfg.RunGap,
		OnDemand: func(n int) { m.saveDemand(t, n) },
		KeptMax:  m.cfg.KeptMax, PersistKept: persistKept && !m.cfg.NoPersist, Kept: t.kept,
		PersistReady: persistReady && !m.cfg.NoPersist, OnReadyLeft: m.saveReady, Ready: t.ready,
		OnKeptDropped: func(name string, keptFor time.Duration, err error) {
			if err != nil {
				m.cfg.Log.Warn("more kept databases than allowed: cannot drop the oldest", "template", hash, "database", name, "max", m.cfg.KeptMax, "err", err)
				return
			}
			m.cfg.Log.Info("more kept databases than allowed: dropped the oldest", "template", hash, "database", name,
				"kept_for", keptFor.Round(time.Second), "max", m.cfg.KeptMax)
		},
	}, m.store)
}

// copyBytes is the disk one test database of t takes, as MaxDiskBytes
// counts it: its template's size, or 0 (no cap, copies that share their
// template's blocks, a store that cannot tell).
func (m *Manager) copyBytes(ctx context.Context, t *template) int64 {
	if m.cfg.MaxDiskBytes <= 0 {
		return 0
	}
	if b, ok := m.store.(BlockSharer); ok && b.SharesBlocks() {
		return 0
	}
	sz, ok := m.store.(Sizer)
	if !ok {
		return 0
	}
	size, err := sz.TemplateSize(ctx, t.db)
	if err != nil {
		m.cfg.Log.Warn("cannot measure a template: its copies are not counted against the disk cap", "template", t.hash, "err", err)
		return 0
	}
	if size > m.cfg.MaxDiskBytes {
		m.cfg.Log.Warn("the disk cap is smaller than one copy of a template: one copy at a time", "template", t.hash,
			"template_bytes", size, "max_disk_bytes", m.cfg.MaxDiskBytes)
	}
	return size
}

// maxOf is the Max of t's pool: MaxBySize of its template's size when
// the store can tell it, else the configured LearnMax (or Max).
func (m *Manager) maxOf(ctx context.Context, t *template) int {
	most := max(m.cfg.Max, m.cfg.LearnMax)
	sz, ok := m.store.(Sizer)
	if m.cfg.MaxBySize == nil || !ok {
		return most
	}
	size, err := sz.TemplateSize(ctx, t.db)
	if err != nil {
		m.cfg.Log.Warn("cannot measure a template: its pool keeps the default maximum", "template", t.hash, "max", most, "err", err)
		return most
	}
	n := m.cfg.MaxBySize(size)
	if n <= 0 {
		return most
	}
	m.cfg.Log.Info("pool sized by disk: full copies of the template fit in its share of the free space",
		"template", t.hash, "template_bytes", size, "max", n)
	return n
}

// Template describes a template database.
type Template struct {
	Hash     string
	Database string
	Endpoint Endpoint // where clients reach it
}

// InitializeTemplate creates an empty template database for hash, to be
// migrated by the caller and then finalized. A hash that is initializing or
// finalized gets ErrTemplateExists.
func (m *Manager) InitializeTemplate(ctx context.Context, hash string) (Template, error) {
	if !ValidHash(hash) {
		return Template{}, errs.New(errs.Usage, "invalid template hash")
	}
	m.mu.Lock()
	for {
		if m.closed {
			m.mu.Unlock()
			return Template{}, errs.Wrap(errs.Busy, ErrClosed, "server is shutting down")
		}
		if _, ok := m.templates[hash]; ok {
			m.mu.Unlock()
			return Template{}, errs.Wrap(errs.Exists, ErrTemplateExists, "template %s", hash)
		}
		gone := m.going[hash]
		if gone == nil {
			break
		}
		m.mu.Unlock()
		select {
		case <-gone:
		case <-ctx.Done():
			return Template{}, errs.Wrap(errs.Interrupted, ctx.Err(),
				"template %s: waiting for the databases of the one discarded before it to be dropped", hash)
		}
		m.mu.Lock()
	}
	t := &template{hash: hash, db: m.templateName(hash), state: TemplateInitializing, finalized: make(chan struct{})}
	m.templates[hash] = t
	delete(m.discarded, hash)
	m.mu.Unlock()

	fail := func(err error) (Template, error) {
		m.mu.Lock()
		if m.templates[hash] == t {
			delete(m.templates, hash)
		}
		m.mu.Unlock()
		close(t.finalized)
		return Template{}, err
	}
	if err := m.save(ctx, hash, t.db, "initializing", 0); err != nil {
		return fail(err)
	}
	if err := m.store.CreateTemplate(ctx, t.db, m.cfg.Owner, m.cfg.RootTemplate); err != nil {
		_ = m.forget(context.WithoutCancel(ctx), hash)
		return fail(err)
	}
	return Template{Hash: hash, Database: t.db, Endpoint: m.store.Endpoint(t.db)}, nil
}

func (m *Manager) lookup(hash string) (*template, error) {
	if !ValidHash(hash) {
		return nil, errs.New(errs.Usage, "invalid template hash")
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	t := m.templates[hash]
	if t == nil {
		if m.discarded[hash] {
			return nil, errs.Wrap(errs.NotFound, ErrTemplateDiscarded, "template %s", hash)
		}
		return nil, errs.Wrap(errs.NotFound, ErrTemplateNotFound, "template %s", hash)
	}
	return t, nil
}

// FinalizeTemplate marks a template ready to clone and starts its pool.
// Finalizing twice is fine.
func (m *Manager) FinalizeTemplate(ctx context.Context, hash string) error {
	t, err := m.lookup(hash)
	if err != nil {
		return err
	}
	m.mu.Lock()
	if t.state != TemplateInitializing || t.finalizing {
		m.mu.Unlock()
		return nil
	}
	t.finalizing = true
	m.mu.Unlock()
	err = m.store.FinalizeTemplate(ctx, t.db)
	if err == nil {
		err = m.save(ctx, hash, t.db, "finalized", 0)
	}
	if err != nil {
		m.mu.Lock()
		t.finalizing = false
		m.mu.Unlock()
		return err
	}
	// The pool starts filling at once, which reserves room under m.mu:
	// create it without holding the lock.
	p := m.newPool(ctx, t)
	m.mu.Lock()
	if t.state != TemplateInitializing || m.templates[hash] != t {
		m.mu.Unlock()
		p.dropAllOnClose()
		return p.Close(ctx, true) // discarded meanwhile
	}
	t.state = TemplateFinalized
	t.pool = p
	close(t.finalized)
	m.mu.Unlock()
	return nil
}

// DiscardTemplate drops a template, its pool and its test databases.
// Requests waiting for it get ErrTemplateDiscarded.
func (m *Manager) DiscardTemplate(ctx context.Context, hash string) error {
	t, err := m.lookup(hash)
	if errors.Is(err, ErrTemplateDiscarded) {
		return errs.Wrap(errs.NotFound, ErrTemplateNotFound, "template %s", hash)
	}
	if err != nil {
		return err
	}
	m.mu.Lock()
	if m.templates[hash] != t {
		m.mu.Unlock()
		return errs.Wrap(errs.NotFound, ErrTemplateNotFound, "template %s", hash)
	}
	delete(m.templates, hash)
	m.discarded[hash] = true
	prev := t.state
	t.state = TemplateDiscarded
	p := t.pool
	m.going[hash] = make(chan struct{})
	m.mu.Unlock()
	if prev == TemplateInitializing {
		close(t.finalized)
	}
	return m.dropTemplate(ctx, t, p)
}

// dropTemplate drops template t's pool p (nil: none) with its databases,
// its template database and its record, and then lets a new template of
// its hash be made (the going channel DiscardTemplate or ResetAll set).
func (m *Manager) dropTemplate(ctx context.Context, t *template, p *Pool) error {
	defer func() {
		m.mu.Lock()
		if ch := m.going[t.hash]; ch != nil {
			close(ch)
			delete(m.going, t.hash)
		}
		m.mu.Unlock()
	}()
	var first error
	if p != nil {
		p.dropAllOnClose()
		first = p.Close(ctx, true)
	}
	if err := m.store.DropTemplate(ctx, t.db); err != nil && first == nil {
		first = err
	}
	if err := m.forget(ctx, t.hash); err != nil && first == nil {
		first = err
	}
	return first
}

// ResetAll forgets every template, dropping their pools, test databases and
// template databases (IntegreSQL's DELETE /api/v1/admin/templates).
func (m *Manager) ResetAll(ctx context.Context) error {
	m.mu.Lock()
	ts := m.templates
	m.templates = map[string]*template{}
	m.discarded = map[string]bool{}
	for _, t := range ts {
		if t.state == TemplateInitializing {
			close(t.finalized)
		}
		t.state = TemplateDiscarded
		m.going[t.hash] = make(chan struct{})
	}
	m.mu.Unlock()
	var first error
	for _, t := range ts {
		if err := m.dropTemplate(ctx, t, t.pool); err != nil && first == nil {
			first = err
		}
	}
	if err := m.sweep(ctx); err != nil && first == nil {
		first = err
	}
	return first
}

// TestDatabase is a database handed out by GetTestDatabase.
type TestDatabase struct {
	Hash string
	DB
	Endpoint Endpoint // where the client reaches it
	// Kept is how many databases of the template are kept for inspection
	// (Keep) and KeptMax how many may be, when this one was handed out.
	Kept, KeptMax int
}

// GetTestDatabase waits (up to FinalizeTimeout) for the template to be
// finalized and then (up to GetTimeout) for a ready database, and hands it
// out.
func (m *Manager) GetTestDatabase(ctx context.Context, hash string) (TestDatabase, error) {
	t, err := m.lookup(hash)
	if err != nil {
		return TestDatabase{}, err
	}
	select {
	case <-t.finalized:
	default:
		timer := time.NewTimer(m.cfg.FinalizeTimeout)
		select {
		case <-t.finalized:
			timer.Stop()
		case <-timer.C:
			return TestDatabase{}, errs.Wrap(errs.Busy, ErrTimeout,
				"template %s was not finalized within %s", hash, m.cfg.FinalizeTimeout).
				WithHint("the process that initialized it must apply its migrations and finalize it (PUT /api/v1/templates/%s)", hash)
		case <-ctx.Done():
			timer.Stop()
			return TestDatabase{}, errs.Wrap(errs.Interrupted, ctx.Err(), "waiting for template %s", hash)
		}
	}
	m.mu.Lock()
	state, p := t.state, t.pool
	m.mu.Unlock()
	if state != TemplateFinalized || p == nil {
		return TestDatabase{}, errs.Wrap(errs.NotFound, ErrTemplateDiscarded, "template %s", hash)
	}
	gctx, cancel := context.WithTimeout(ctx, m.cfg.GetTimeout)
	defer cancel()
	db, err := p.Acquire(gctx)
	if err != nil {
		m.mu.Lock()
		closed := m.closed
		m.mu.Unlock()
		if closed {
			return TestDatabase{}, errs.Wrap(errs.Busy, ErrClosed, "server is shutting down")
		}
		if errors.Is(err, ErrClosed) {
			return TestDatabase{}, errs.Wrap(errs.NotFound, ErrTemplateDiscarded, "template %s", hash)
		}
		return TestDatabase{}, err
	}
	st := p.Stats()
	return TestDatabase{Hash: hash, DB: db, Endpoint: m.store.Endpoint(db.Name), Kept: st.Kept, KeptMax: st.KeptMax}, nil
}

func (m *Manager) poolOf(hash string) (*Pool, error) {
	t, err := m.lookup(hash)
	if err != nil {
		if errors.Is(err, ErrTemplateDiscarded) {
			return nil, errs.Wrap(errs.NotFound, ErrTemplateNotFound, "template %s", hash)
		}
		return nil, err
	}
	m.mu.Lock()
	p := t.pool
	m.mu.Unlock()
	if p == nil {
		return nil, errs.Wrap(errs.NotFound, ErrTestNotFound, "template %s is not finalized", hash)
	}
	return p, nil
}

// Unlock gives test database id back as is, for reuse.
func (m *Manager) Unlock(ctx context.Context, hash string, id int) error {
	p, err := m.poolOf(hash)
	if err != nil {
		return err
	}
	return p.Unlock(id)
}

// Keep keeps test database id, in use, for inspection (its test failed):
// outside the pool's Max, under its own cap (KeptMax per template, the
// oldest dropped beyond it), and with a KeptStore across restarts. Giving
// it back later (Unlock or Recreate) drops it.
func (m *Manager) Keep(ctx context.Context, hash string, id int) error {
	p, err := m.poolOf(hash)
	if err != nil {
		return err
	}
	if err := p.Keep(id); err != nil {
		return err
	}
	if ks, ok := m.store.(KeptStore); ok && !m.cfg.NoPersist {
		return ks.SaveKept(ctx, m.cfg.Prefix, Kept{Hash: hash, ID: id, Name: m.TestName(hash, id), At: time.Now()})
	}
	return nil
}

// Recreate gives test database id back to be recreated in the background.
func (m *Manager) Recreate(ctx context.Context, hash string, id int) error {
	p, err := m.poolOf(hash)
	if err != nil {
		return err
	}
	return p.Recreate(id)
}

// TryReserve implements Limiter: it counts one more test database against
// the global limit, and when the limit is reached starts evicting the least
// recently used idle pool (other than p) in the background.
func (m *Manager) TryReserve(p *Pool) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	if (m.cfg.MaxDatabases <= 0 || m.total < m.cfg.MaxDatabases) && m.diskRoom(p) {
		m.total++
		m.bytes += p.cfg.CopyBytes
		return true
	}
	if m.evicting > 0 {
		return false
	}
	var victim *Pool
	for _, t := range m.templates {
		q := t.pool
		if q == nil || q == p || !q.Idle() {
			continue
		}
		if victim == nil || q.LastUsed().Before(victim.LastUsed()) {
			victim = q
		}
	}
	if victim == nil {
		return false
	}
	m.evicting++
	go func() {
		n := victim.Evict(context.Background())
		m.mu.Lock()
		m.evicting--
		m.mu.Unlock()
		if n == 0 {
			p.Kick()
		}
	}()
	return false
}

// diskRoom says whether one more database of p fits under MaxDiskBytes:
// the copies there leave room for it, or there are none. Called with m.mu
// held.
func (m *Manager) diskRoom(p *Pool) bool {
	return m.cfg.MaxDiskBytes <= 0 || p.cfg.CopyBytes <= 0 || m.bytes <= 0 || m.bytes+p.cfg.CopyBytes <= m.cfg.MaxDiskBytes
}

// HasRoom says whether one more database of p fits under MaxDiskBytes
// (the emptiers drop used copies at once when it does not).
func (m *Manager) HasRoom(p *Pool) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.diskRoom(p)
}

// TryReserveUsed implements Limiter: it counts a used copy of p that
// waits for its drop against MaxDiskBytes, if it fits.
func (m *Manager) TryReserveUsed(p *Pool) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	if !m.diskRoom(p) {
		return false
	}
	m.bytes += p.cfg.CopyBytes
	return true
}

// ReleaseUsed implements Limiter: n used copies of p are dropped.
func (m *Manager) ReleaseUsed(p *Pool, n int) {
	m.mu.Lock()
	m.bytes -= int64(n) * p.cfg.CopyBytes
	m.mu.Unlock()
	m.Release(p, 0) // pools waiting for room get another chance
}

// Release implements Limiter: n test databases of p are gone; pools
// waiting for room get another chance.
func (m *Manager) Release(p *Pool, n int) {
	m.mu.Lock()
	m.total -= n
	m.bytes -= int64(n) * p.cfg.CopyBytes
	var pools []*Pool
	for _, t := range m.templates {
		if t.pool != nil {
			pools = append(pools, t.pool)
		}
	}
	m.mu.Unlock()
	for _, p := range pools {
		go p.Kick()
	}
}

// TemplateStats describes one template for metrics and health.
type TemplateStats struct {
	Hash  string
	State TemplateState
	Pool  Stats
}

// Stats returns every template's state and pool counts, sorted by hash.
func (m *Manager) Stats() (ts []TemplateStats, total int) {
	m.mu.Lock()
	type hp struct {
		hash  string
		state TemplateState
		p     *Pool
	}
	var list []hp
	for h, t := range m.templates {
		list = append(list, hp{h, t.state, t.pool})
	}
	total = m.total
	m.mu.Unlock()
	sort.Slice(list, func(i, j int) bool { return list[i].hash < list[j].hash })
	for _, x := range list {
		s := TemplateStats{Hash: x.hash, State: x.state}
		if x.p != nil {
			s.Pool = x.p.Stats()
		}
		ts = append(ts, s)
	}
	return ts, total
}

// Close stops every pool and drops their test databases (the templates and
// their state stay, for the next start).
func (m *Manager) Close(ctx context.Context) error { return m.shutdown(ctx, true) }

// Stop stops every pool without dropping anything, as a crash would leave
// things; the next Open cleans up.
func (m *Manager) Stop(ctx context.Context) error { return m.shutdown(ctx, false) }

// Ping checks that the server answers.
func (m *Manager) Ping(ctx context.Context) error { return m.store.Ping(ctx) }

func (m *Manager) shutdown(ctx context.Context, drop bool) error {
	m.mu.Lock()
	m.closed = true
	var pools []*Pool
	for _, t := range m.templates {
		if t.pool != nil {
			pools = append(pools, t.pool)
		}
	}
	m.mu.Unlock()
	var first error
	for _, p := range pools {
		if err := p.Close(ctx, drop); err != nil && first == nil {
			first = err
		}
	}
	if !drop {
		return first // as a crash leaves things: the next Recover cleans up
	}
	m.mu.Lock()
	m.storeClosed = true
	m.mu.Unlock()
	if err := m.store.Close(ctx); err != nil && first == nil {
		first = err
	}
	return first
}

// sweep drops the test databases of the store that outlived their pools
// (renamed by a client), when the store can tell them.
func (m *Manager) sweep(ctx context.Context) error {
	if sw, ok := m.store.(Sweeper); ok {
		return sw.Sweep(ctx, true)
	}
	return nil
}
