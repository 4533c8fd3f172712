package pool

import (
	"context"
	"time"
)

// Store is where templates live and where test copies are made: databases
// inside one server (database isolation, package pool/dbstore) or whole
// clusters, one per test (cluster isolation, package pool/clusterstore).
// The Manager does all its server-side work through it; every backend
// passes the same conformance suite (pool/storetest).
type Store interface {
	// Creator makes and drops test copies; name is the copy's name and
	// template the template's name.
	Creator
	// Recover runs once at start: it removes every test copy whose name
	// starts with testPrefix (a previous run's, state unknown) and, when
	// persist is set, returns the template records of prefix and a run
	// epoch that grows by one on every start.
	Recover(ctx context.Context, prefix, testPrefix string, persist bool) (recs []Record, epoch int, err error)
	// Save records a template's state ("initializing" or "finalized").
	Save(ctx context.Context, prefix string, r Record) error
	// Forget removes a template's record.
	Forget(ctx context.Context, prefix, hash string) error
	// TemplateExists reports whether template name exists.
	TemplateExists(ctx context.Context, name string) (bool, error)
	// CreateTemplate makes an empty template name owned by owner, as a
	// copy of root, replacing a leftover of the same name.
	CreateTemplate(ctx context.Context, name, owner, root string) error
	// FinalizeTemplate makes template name ready to be copied.
	FinalizeTemplate(ctx context.Context, name string) error
	// DropTemplate removes template name, even while clients use it.
	DropTemplate(ctx context.Context, name string) error
	// Endpoint says where clients reach the template or test copy name.
	Endpoint(name string) Endpoint
	// Ping checks that the store works.
	Ping(ctx context.Context) error
	// Close stops what the store runs besides test copies (templates being
	// initialized); they are cleaned up by the next Recover.
	Close(ctx context.Context) error
}

// Record is a template's persisted state; Demand is the most fresh
// databases one run of it took (its pool fills to that at start).
type Record struct {
	Hash, Name, State string
	Demand            int
}

// KeptStore is a Store that keeps the databases clients kept for
// inspection (Manager.Keep) across a restart: Recover leaves the copies
// recorded by SaveKept in place, and Kept lists them (those gone are
// forgotten).
type KeptStore interface {
	SaveKept(ctx context.Context, prefix string, k Kept) error
	Kept(ctx context.Context, prefix string) ([]Kept, error)
}

// ReadyStore is a Store that keeps the fresh test copies a pool had ready
// when the server stopped cleanly, for its next start (Config.Ready):
// Recover leaves the copies recorded by SaveReady in place, and TakeReady
// lists those still there under their names once and forgets them (after
// a crash, they are swept as any other test copy).
type ReadyStore interface {
	SaveReady(ctx context.Context, prefix string, ks []Kept) error
	TakeReady(ctx context.Context, prefix string) ([]Kept, error)
}

// Warmer is a Store whose server builds, per database, caches that the
// first connection to it pays for: PostgreSQL's catalog cache file
// (base/<oid>/pg_internal.init, removed when the server starts) and the
// catalog pages in its shared buffers, which a new copy, under a new oid,
// shares with no other database. Warm connects to database name once,
// which writes the file, and with open also opens its relations, which
// reads the catalog pages a test's statements look up. A pool warms the
// next databases it hands out between runs, and the ready copies a clean
// stop left (Config.Ready) also during a run, without open (see warmer).
type Warmer interface {
	Warm(ctx context.Context, name string, open bool) error
}

// Prewarmer is a Store that reads a copy it has just made ahead into the
// operating system's page cache: a reflink clone is a new file whose pages
// are not cached although its blocks are its template's, and the first
// statements of its test would wait for them (strategy is what Create
// returned; a full copy's pages were just written through the cache, and
// Prewarm leaves it). Best effort: it starts the reads and returns.
//
// A pool prewarms a copy nobody waits for once it is made, not one made
// for a waiting test: that copy goes to its test at once, and the reads
// (all the catalogs', where the test reads the few pages it needs) take
// the cores the test and the next creations want. Measured (issue 33):
// the first run of the bench's volume suite (80 writing tests on 4
// workers, PostgreSQL 18, clone on the XFS image, 2 cores, creations
// bound by the cores) took 3.31-3.40 s with every copy prewarmed, 2.70-2.78
// s without.
type Prewarmer interface {
	Prewarm(ctx context.Context, name, strategy string)
}

// CacheFiler is a Warmer whose copies carry the template's catalog cache
// file or not by the strategy that made them: a copy of the template's
// directory (FILE_COPY, clone) carries it, one made relation by relation
// (WAL_LOG, PostgreSQL's default since 15) does not, and its first
// connection builds it. A pool warms a copy made without it as it warms
// one a restart took it from (see warmer). Measured (issue 33) on
// PostgreSQL 18 on ext4 (a 60-table template, medians of 60, twice): the
// first connection to a WAL_LOG copy took 12.1-12.3 ms and with a short
// transaction 16.4-16.7 ms, against 7.6-7.9 and 12.2-12.9 ms once it had
// been connected to; FILE_COPY copies, 6.4-7.2 ms never connected, the
// same connected once.
type CacheFiler interface {
	Warmer
	CarriesCacheFile(strategy string) bool
}

// BlockSharer is a Store that says whether its copies share blocks with
// their template (reflink clones): then a used copy waiting for its drop
// costs no disk, and a pool lets more of them wait for the run's end (see
// Pool.dropper).
type BlockSharer interface {
	SharesBlocks() bool
}

// Batcher is a Store whose copies come in batches: one costly step makes
// room for several copies, each then cheap (clusterstore's slots: a
// cluster copied and started holds several test databases, each then a
// rename). Spare is how many copies of template tmpl it can make now
// without another batch; batched false when that template's copies do not
// come in batches (a cluster per test copy), and the pool makes them as
// any other store's.
//
// During a run whose size the pool does not know (a template's first run,
// or one bigger than any before) it starts no batch ahead of demand: it
// creates for the tests waiting and, beyond them, only the spare copies;
// a database given back whose recreation would need another batch waits
// for a test to need it, or for the run's end, when the pool fills to
// what it keeps ready (see Pool.batchLimitLocked). Measured on the
// bench's volume section (issue 60: 80 writing tests on 4 workers,
// PostgreSQL 15, clusters of 8 test databases): see docs/server.md,
// "Cloned clusters".
type Batcher interface {
	Spare(tmpl string) (n int, batched bool)
}

// Flusher is a Store whose server's new copies sit in the page cache
// until the kernel writes them back: full copies are the template's size
// each, written back 30 s after they were made (Linux's
// dirty_expire_centisecs), as a wave that the next run meets. Flush
// writes them now. A pool flushes once it has settled after a run (the run
// ended, nothing being made) and made some: the disk's work falls between
// runs, not into the next one (see Pool.maybeFlush). Measured (issue 33): 200
// full copies of an 11 MB template on ext4 made at once left 2.2 GB dirty;
// a test's connection and transaction on them took 11-15 ms (p50) until
// the write-back began 30 s later and 22-30 ms for the 20 s it lasted.
type Flusher interface {
	Flush(ctx context.Context) error
}

// Kept is a test copy a client kept: its template, id and name, since when.
type Kept struct {
	Hash string
	ID   int
	Name string
	At   time.Time
}

// Endpoint is where a client reaches a database: Host and Port empty when
// it is on the server the API hands out by default, and the database's name
// on that server. SocketDir is the private Unix socket directory of a
// server of its own (Port set), for local clients that may reach it.
type Endpoint struct {
	Host      string
	Port      int
	Database  string
	SocketDir string
}

// Sizer is a Store that knows how much disk a template takes: a full copy
// of it takes as much (ManagerConfig.MaxBySize).
type Sizer interface {
	TemplateSize(ctx context.Context, name string) (int64, error)
}

// Sweeper is a Store that can drop every test copy it made, whatever its
// name is now (a client may rename its test database).
type Sweeper interface {
	// Sweep drops the recorded test copies that still exist; with
	// renamedOnly, only those no longer named <prefix>_test_… (the others
	// belong to live pools).
	Sweep(ctx context.Context, renamedOnly bool) error
}

// ConnInfo is what clients get in a database's config: where the server
// is and the role to use.
type ConnInfo struct {
	Host     string
	Port     int
	Username string
	Password string
	Params   map[string]string
}
