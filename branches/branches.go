// Package branches keeps the branches `pgfork serve` hands out to a team:
// sources declared to serve (a running cluster, a backup chain), named
// read-only snapshots of them (stopped data directories), and branches (a
// started cluster each, made from a snapshot by a reflink copy, with its
// own TCP port, role and password, owner, TTL and protect flag). Their
// state is one file (state.json) so that they survive a restart of serve.
//
// Every branch comes from a snapshot: one made from a source or another
// branch on the fly (an origin snapshot, removed with the last branch that
// uses it) or a named one. Reset replaces a branch's data directory with a
// new copy of that snapshot and starts it on the same port with the same
// role and password.
package branches

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"io/fs"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgfork/pgfork/clone"
	"github.com/pgfork/pgfork/cluster"
	"github.com/pgfork/pgfork/instance"
	"github.com/pgfork/pgfork/internal/errs"
	"github.com/pgfork/pgfork/internal/flock"
	"github.com/pgfork/pgfork/internal/fsutil"
	"github.com/pgfork/pgfork/internal/statedir"
	"github.com/pgfork/pgfork/pgbin"
	"github.com/pgfork/pgfork/pgdata"
)

// Source kinds.
const (
	SourceCluster = "cluster" // a local running cluster: snapshots by online clone
	SourceBackup  = "backup"  // a backup chain directory: snapshots by restore
)

// Source is what branches are made from, declared to serve.
type Source struct {
	Name string `json:"name"`
	Kind string `json:"kind"`
	// DataDir is a SourceCluster's data directory; ConnString reaches it
	// (empty: from its postmaster.pid, as user postgres).
	DataDir    string `json:"data_dir,omitempty"`
	ConnString string `json:"-"`
	// ConfigDir is where a SourceCluster's postgresql.conf lives when not
	// in DataDir and not found by itself (pgclone.Options.ConfigDir).
	ConfigDir string `json:"-"`
	// PrimaryURL is a SourceStandby's primary (a role with REPLICATION).
	PrimaryURL string `json:"-"`
	// Chain is a SourceBackup's chain directory (made by `pgfork backup`),
	// restored up to Upto (a backup's name; empty: the newest).
	Chain string `json:"chain,omitempty"`
	Upto  string `json:"upto,omitempty"`
	// Backups, instead of Chain, are a SourceBackup's backup directories
	// themselves, the full backup first (pgfork restore --start).
	Backups []string `json:"backups,omitempty"`
	// WALDir and one target make a SourceBackup's snapshots a
	// point-in-time recovery: WAL replayed from the archive up to the
	// target, promoted and shut down cleanly.
	WALDir     string `json:"wal_dir,omitempty"`
	TargetTime string `json:"target_time,omitempty"`
	TargetLSN  string `json:"target_lsn,omitempty"`
	TargetName string `json:"target_name,omitempty"`
	// Lag is a SourceStandby's replication lag, measured by List.
	Lag *Lag `json:"lag,omitempty"`
}

// tempPrefix begins the registry names of temporary servers (tempServerName).
const tempPrefix = "branches.tmp-"

// tempServerName is a fresh registry name for a temporary server (a
// snapshot being prepared or recovered to its target): Open stops and
// forgets every one it finds (the leftover of a crash mid-way) and
// removes its data directory.
func tempServerName() string { return tempPrefix + fsutil.RandomTag() }

// Options configure a Manager.
type Options struct {
	Layout  statedir.Layout
	Sources []Source
	// Installation runs the branches (the sources' major). Unset, each
	// data directory is run by an installation of its own major
	// (pgbin.Find: pgfork pg install's under Layout, then the system's),
	// so that branches of several majors live side by side (pgfork branch
	// without a server); standby sources need it set.
	Installation pgbin.Installation
	// PGBin, with Installation unset, is a bin directory the user named
	// (--pg-bin): it runs the data directories of its major.
	PGBin string
	// User runs the servers when pgfork is root (nil: the current user).
	User *instance.OSUser
	// Host is where branches listen on TCP (default 127.0.0.1).
	Host string
	// MaxBranches is how many branches one owner may have (0: no limit).
	MaxBranches int
	// MaxOwnBytes is how much disk one owner's branches may use of their
	// own (not shared by reflink with their snapshot; 0: no limit):
	// creating a branch is refused once they use that much.
	MaxOwnBytes int64
	// MinFree is the free space (bytes) below which nothing is created.
	MinFree int64
	// AdminTokens see and change every branch.
	AdminTokens []string
	// LeaveStopped makes Open start no branch: those whose server is not
	// running are listed stopped until Start (serve's --branch-restart
	// stopped, which also stops them all when serve exits). Otherwise Open
	// starts every branch not running that Stop did not stop.
	LeaveStopped bool
	// SuperUser is the sources' bootstrap superuser (default postgres).
	SuperUser string
	// SourceMaxAge, when above 0, lets a branch created from a source
	// share the snapshot another branch of that source was made from, if
	// that snapshot began at most this long ago (creates from one source
	// meanwhile wait for the one snapshot being made rather than each
	// making its own). 0: every create from a source takes its own.
	SourceMaxAge time.Duration
	// OnNotice, when set, is told what the caller should know before a
	// long step begins: a source's data copied onto the state directory's
	// filesystem, not cloned (Notice). It may be called from any create.
	OnNotice func(Notice)
	// BranchStore lets a create from a source that names no data
	// directory go to a branch store beside the source (store.go) when
	// the source's filesystem clones and the state directory is on
	// another one: a clone there instead of a copy. pgfork branch on this
	// machine sets it (Local); a serve does not: its tenants' branches
	// stay in the state directory (docs/SECURITY.md).
	BranchStore bool
}

// DefaultSourceMaxAge is the SourceMaxAge pgfork serve uses unless told
// otherwise: a branch "from the source" shows it as of at most a minute ago.
const DefaultSourceMaxAge = time.Minute

// Snapshot is a named, read-only, stopped data directory.
type Snapshot struct {
	Name    string    `json:"name"`
	From    string    `json:"from"` // "source:NAME" or "branch:NAME"
	Owner   string    `json:"owner"`
	Created time.Time `json:"created"`
	// Origin snapshots are made for one branch's creation and removed
	// with the last branch made from them.
	Origin bool `json:"origin,omitempty"`
	// Home is the directory holding it (snap/NAME) when not the state
	// directory's branches directory (home.go).
	Home string `json:"home,omitempty"`
	// Backups, when set, are what the snapshot is: backups restored
	// again for each copy of it, no directory of its own (direct.go).
	Backups []BackupRef `json:"backups,omitempty"`
	// Size and Shared (filled by List): disk used, and how much of it is
	// shared with other files by reflink.
	Size   int64 `json:"size_bytes"`
	Shared int64 `json:"shared_bytes"`
}

// Branch is a started cluster handed out to an owner.
type Branch struct {
	Name     string    `json:"name"`
	Snapshot string    `json:"snapshot"` // the point reset goes back to
	From     string    `json:"from"`     // what it was made from, for the tree view
	Owner    string    `json:"owner"`
	Created  time.Time `json:"created"`
	ResetAt  time.Time `json:"reset_at,omitzero"`
	// Active is when a session was last seen on it (ExpireIdle).
	Active    time.Time     `json:"active_at,omitzero"`
	TTL       time.Duration `json:"ttl_ns,omitempty"`
	Protected bool          `json:"protected"`
	Port      int           `json:"port"`
	Host      string        `json:"host"`
	Role      string        `json:"role"`
	Password  string        `json:"password"`
	// State is "creating" until the branch is complete; a branch found
	// creating when the Manager opens is the leftover of a crash, removed.
	// What callers get says "stopped" for a complete branch whose server
	// is not running, "ready" while it runs.
	State string `json:"state"`
	// Stopped is set by Stop (cleared by Start and Reset): Open does not
	// start the branch again.
	Stopped bool `json:"stopped,omitempty"`
	// Home is the directory holding its snapshot and files (snap/,
	// data/NAME, tblspc/NAME) when not the state directory's branches
	// directory (home.go); DataDir, when set, is its data directory,
	// named by the user (CreateOptions.DataDir), and DataID that
	// directory's identity, recorded before it was put there (PrevID: the
	// one a reset is replacing), proven before it is removed.
	Home    string `json:"home,omitempty"`
	DataDir string `json:"data_dir,omitempty"`
	DataID  fileID `json:"data_id,omitzero"`
	PrevID  fileID `json:"prev_id,omitzero"`
	// Store, when set, is the branch store beside its source that holds
	// its data directory and home: pgfork chose it, no data directory
	// being named (store.go).
	Store string `json:"store,omitempty"`
	// noStore says why no branch store was used for a create whose copy
	// crosses filesystems (Notice.NoStore; not stored).
	noStore string
	// Size and Shared are filled by List and Get (see Snapshot).
	Size   int64 `json:"size_bytes"`
	Shared int64 `json:"shared_bytes"`
	// Conn is URL() in what the Manager returns (not stored).
	Conn string `json:"url,omitempty"`
}

// URL is the branch's connection string.
func (b Branch) URL() string {
	u := url.URL{Scheme: "postgresql", User: url.UserPassword(b.Role, b.Password),
		Host: net.JoinHostPort(b.Host, strconv.Itoa(b.Port)), Path: "/postgres", RawQuery: "sslmode=disable"}
	return u.String()
}

// Expires is when the branch's TTL runs out (zero: never).
func (b Branch) Expires() time.Time {
	if b.TTL <= 0 {
		return time.Time{}
	}
	return b.Created.Add(b.TTL)
}

const (
	stateCreating = "creating"
	stateReady    = "ready"
	stateStopped  = "stopped" // in views only: ready, its server not running
)

type state struct {
	Snapshots []*Snapshot `json:"snapshots"`
	Branches  []*Branch   `json:"branches"`
	// Homes are the homes other than the default one in use (home.go),
	// each recorded before anything is made in it, with its identity.
	Homes   []string          `json:"homes,omitempty"`
	HomeIDs map[string]fileID `json:"home_ids,omitempty"`
	// Stores are the branch stores in use (store.go), with their
	// identities, recorded with the first branch made in them.
	Stores map[string]fileID `json:"stores,omitempty"`
}

// Caller is who asks: the token the request came with.
type Caller struct {
	Token string
}

// Manager owns the branches of one state directory.
type Manager struct {
	o    Options
	dir  string
	lock *flock.Lock
	// mu guards st, pending and busy; the long steps (copies, starts)
	// run without it, so that creates go in parallel and List answers
	// while they run.
	mu sync.Mutex
	st state
	// pending are snapshot names being built; busy are branches being
	// reset (neither is in st yet / changeable now).
	pending map[string]bool
	busy    map[string]bool
	// pendingHome is the home of each named snapshot being built.
	pendingHome map[string]string
	// homeIDs mirrors st.HomeIDs for store, which runs without mu.
	homeIDs sync.Map
	// building holds one lock per source while a shared origin snapshot
	// of it is made (Options.SourceMaxAge).
	building map[string]chan struct{}
	// streamSeen holds, per standby source, when its WAL receiver was
	// last seen streaming (StandbyLag).
	streamSeen sync.Map
	// sizeMu guards snapExtents, the snapshots' extents (sizing.go).
	sizeMu      sync.Mutex
	snapExtents map[string]spans
	// portMu guards held, the listeners that keep the ports of branches
	// whose server is not running (ports.go).
	portMu sync.Mutex
	held   map[string]net.Listener
}

// Dir is where a Manager keeps its files: <state>/branches.
func Dir(lay statedir.Layout) string { return filepath.Join(lay.Root, "branches") }

func (m *Manager) statePath() string { return filepath.Join(m.dir, "state.json") }

// regName is a branch's name in the cluster registry (`pgfork ls`).
func regName(name string) string { return "branch." + name }

// Owner is the identity recorded for a token: a hash, never the token.
func Owner(token string) string {
	h := sha256.Sum256([]byte("pgfork-branches\x00" + token))
	return hex.EncodeToString(h[:8])
}

func (m *Manager) admin(c Caller) bool {
	for _, t := range m.o.AdminTokens {
		if t != "" && t == c.Token {
			return true
		}
	}
	return false
}

// Open takes the branches directory (one Manager at a time), removes what
// a crash left half-built (branches still creating, stray directories),
// and starts every branch whose server is not running, on its own port.
func Open(ctx context.Context, o Options) (*Manager, error) {
	if o.Host == "" {
		o.Host = "127.0.0.1"
	}
	if o.SuperUser == "" {
		o.SuperUser = "postgres"
	}
	for _, s := range o.Sources {
		if err := cluster.ValidateName(s.Name); err != nil {
			return nil, err
		}
		if s.Kind != SourceCluster && s.Kind != SourceBackup && s.Kind != SourceStandby {
			return nil, errs.New(errs.Usage, "source %q: unknown kind %q", s.Name, s.Kind).WithHint("use cluster, backup or standby")
		}
		if s.Kind == SourceStandby && o.Installation.BinDir == "" {
			return nil, errs.New(errs.Usage, "standby source %q needs the PostgreSQL build to keep it with", s.Name)
		}
		if s.Kind == SourceBackup {
			if err := s.recovery().Validate(); err != nil {
				return nil, err
			}
		}
	}
	m := &Manager{o: o, dir: Dir(o.Layout), pending: map[string]bool{}, busy: map[string]bool{}, pendingHome: map[string]string{}, building: map[string]chan struct{}{}}
	if err := o.Layout.Ensure(); err != nil {
		return nil, errs.FromOS(err, o.Layout.Root, "cannot create the state directory")
	}
	// Root's, not writable by others: a root process follows no path in
	// it that another user can change. 0711: the server's user reaches
	// its data directory below.
	for _, d := range []string{m.dir, filepath.Join(m.dir, "snap"), filepath.Join(m.dir, "data"), filepath.Join(m.dir, "tblspc")} {
		if err := mkdirPrivate(d); err != nil {
			return nil, err
		}
	}
	l, err := flock.TryExclusive(filepath.Join(m.dir, "lock"))
	if errors.Is(err, flock.ErrBusy) {
		return nil, errs.New(errs.Busy, "another pgfork process (a serve, or a branch command still running) keeps the branches of %s", o.Layout.Root).
			WithPath(m.dir).WithHint("wait for it to end; if it is a pgfork serve, ask that server for branches")
	}
	if err != nil {
		return nil, errs.FromOS(err, m.dir, "cannot lock the branches")
	}
	m.lock = l
	if b, err := os.ReadFile(m.statePath()); err == nil {
		if err := json.Unmarshal(b, &m.st); err != nil {
			l.Unlock()
			return nil, errs.Wrap(errs.Internal, err, "bad branches state").WithPath(m.statePath())
		}
	} else if !errors.Is(err, fs.ErrNotExist) {
		l.Unlock()
		return nil, errs.FromOS(err, m.statePath(), "cannot read the branches state")
	}
	for h, id := range m.st.HomeIDs {
		m.homeIDs.Store(h, id)
	}
	if err := m.recover(ctx); err != nil {
		l.Unlock()
		return nil, err
	}
	for _, s := range o.Sources {
		if s.Kind != SourceStandby {
			continue
		}
		if err := m.ensureStandby(ctx, s); err != nil {
			l.Unlock()
			return nil, err
		}
	}
	return m, nil
}

func mkdirPrivate(d string) error {
	if err := os.Mkdir(d, 0o711); err != nil && !errors.Is(err, fs.ErrExist) {
		return errs.FromOS(err, d, "cannot create the branches directory")
	}
	fi, err := os.Lstat(d)
	if err != nil {
		return errs.FromOS(err, d, "cannot create the branches directory")
	}
	if !fi.IsDir() {
		return errs.New(errs.Permission, "%s is not a directory", d).WithPath(d)
	}
	if st, ok := fi.Sys().(*syscall.Stat_t); ok && int(st.Uid) != os.Geteuid() {
		return errs.New(errs.Permission, "%s belongs to another user", d).WithPath(d).WithHint("remove it or give it to the user running pgfork")
	}
	return os.Chmod(d, 0o711)
}

// recover drops half-built branches and snapshots (with the temporary
// servers that were making them), then starts the rest.
func (m *Manager) recover(ctx context.Context) error {
	if l, err := cluster.List(m.o.Layout); err == nil {
		for _, e := range l {
			if strings.HasPrefix(e.Name, tempPrefix) {
				_ = cluster.Down(ctx, m.o.Layout, e.Name, cluster.DownOptions{DeleteData: true, Timeout: 10 * time.Second})
			}
		}
	}
	var keep []*Branch
	for _, b := range m.st.Branches {
		if b.State != stateReady {
			m.removeBranchFiles(ctx, b)
			continue
		}
		keep = append(keep, b)
	}
	m.st.Branches = keep
	m.dropUnusedOrigins()
	if err := m.save(); err != nil {
		return err
	}
	m.sweep(ctx)
	for _, b := range m.st.Branches {
		if m.running(b) {
			continue
		}
		_ = cluster.Down(ctx, m.o.Layout, regName(b.Name), cluster.DownOptions{KeepData: true, Timeout: 10 * time.Second})
		if b.Stopped || m.o.LeaveStopped {
			_ = m.keepStoppedPort(b) // taken: its start says by whom
			continue
		}
		if err := m.start(ctx, b); err != nil {
			return errs.Wrap(errs.KindOf(err), err, "branch %q did not start again", b.Name)
		}
	}
	return nil
}

// sweep removes, in every home, directories under snap/, data/ and
// tblspc/ that the state does not name (a create or snapshot killed
// before it was recorded, a data directory not yet moved to the one the
// user named) and copy staging left beside them, and the homes nothing
// uses any more.
func (m *Manager) sweep(ctx context.Context) {
	known := map[string]bool{}
	for _, s := range m.st.Snapshots {
		known[m.snapOf(s)] = true
	}
	for _, b := range m.st.Branches {
		if b.DataDir == "" {
			known[m.workDir(b)] = true
		}
		known[m.tblspcOf(b)] = true
	}
	for _, h := range m.homes() {
		for _, sub := range []string{"snap", "data", "tblspc"} {
			dir := filepath.Join(m.store(h), sub)
			ents, _ := os.ReadDir(dir)
			for _, e := range ents {
				p := filepath.Join(dir, e.Name())
				if known[p] || (sub == "snap" && known[strings.TrimSuffix(p, ".tblspc")]) {
					continue
				}
				if sub == "data" && !slices.ContainsFunc(m.st.Branches, func(b *Branch) bool { return b.Name == e.Name() }) {
					// A branch's server a crash left running on it.
					_ = cluster.Down(ctx, m.o.Layout, regName(e.Name()), cluster.DownOptions{KeepData: true, Timeout: 10 * time.Second})
				}
				_ = removeBelow(dir, e.Name())
			}
		}
	}
	m.dropUnusedHomes()
	_ = m.save()
}

// removeBelow removes name inside dir without following a symlink on the
// way (os.Root).
func removeBelow(dir, name string) error {
	r, err := os.OpenRoot(dir)
	if err != nil {
		return err
	}
	defer r.Close()
	return r.RemoveAll(name)
}

// removeBranchFiles stops a branch's server, forgets it in the registry and
// removes its data directory (one the user named only when proven to be
// the one pgfork put there) and its tablespaces.
func (m *Manager) removeBranchFiles(ctx context.Context, b *Branch) {
	_ = cluster.Down(ctx, m.o.Layout, regName(b.Name), cluster.DownOptions{KeepData: true, Timeout: 10 * time.Second})
	m.removeNamedData(b)
	work := m.workDir(b)
	_ = removeBelow(filepath.Dir(work), b.Name)
	_ = removeBelow(filepath.Dir(m.tblspcOf(b)), b.Name)
	_ = clone.CleanStale(work)
	if b.DataDir != "" {
		_ = clone.CleanStale(b.DataDir)
	}
}

func (m *Manager) save() error {
	b, _ := json.MarshalIndent(m.st, "", "  ")
	// 0600: it holds the branches' passwords.
	if err := fsutil.WriteFileAtomic(m.statePath(), append(b, '\n'), 0o600); err != nil {
		return errs.FromOS(err, m.statePath(), "cannot record the branches")
	}
	return nil
}

// Close releases the branches; their servers keep running (Open finds
// them). The ports of stopped branches are no longer held.
func (m *Manager) Close() {
	m.releaseAll()
	if m.lock != nil {
		m.lock.Unlock()
		m.lock = nil
	}
}

// StopAll stops every branch's server (Open starts them again unless
// Options.LeaveStopped).
func (m *Manager) StopAll(ctx context.Context) {
	m.mu.Lock()
	defer m.mu.Unlock()
	for _, b := range m.st.Branches {
		_ = cluster.Down(ctx, m.o.Layout, regName(b.Name), cluster.DownOptions{KeepData: true, Timeout: 30 * time.Second})
	}
}

// Sources lists the declared sources.
func (m *Manager) Sources() []Source { return append([]Source(nil), m.o.Sources...) }

func (m *Manager) source(name string) (Source, bool) {
	for _, s := range m.o.Sources {
		if s.Name == name {
			return s, true
		}
	}
	return Source{}, false
}

func (m *Manager) snapshot(name string) *Snapshot {
	for _, s := range m.st.Snapshots {
		if s.Name == name {
			return s
		}
	}
	return nil
}

func (m *Manager) branch(c Caller, name string) (*Branch, error) {
	for _, b := range m.st.Branches {
		if b.Name == name && (b.Owner == Owner(c.Token) || m.admin(c)) {
			if b.State != stateReady || m.busy[name] {
				return nil, errs.New(errs.Busy, "branch %q is being created or reset", name).WithHint("try again in a moment")
			}
			return b, nil
		}
	}
	// Another owner's branch is as absent as a missing one.
	return nil, errs.New(errs.NotFound, "no branch named %q", name).WithHint("list the branches you can see")
}

// ListResult is what List returns.
type ListResult struct {
	Sources   []Source   `json:"sources"`
	Snapshots []Snapshot `json:"snapshots"`
	Branches  []Branch   `json:"branches"`
	// Usage is, per owner listed (the caller; every owner for an admin
	// token), what its branches use against the quotas.
	Usage []Usage `json:"usage"`
}

// Usage is what one owner's branches use, and the quotas (0: none).
type Usage struct {
	Owner       string `json:"owner"`
	Branches    int    `json:"branches"`
	OwnBytes    int64  `json:"own_bytes"`
	MaxBranches int    `json:"max_branches"`
	MaxOwnBytes int64  `json:"max_own_bytes"`
}

// List returns the sources (a standby's with its lag), the named snapshots
// the caller sees (visible: of a source, or of its own branches) and the
// caller's branches (every branch for an admin token), with their
// sizes.
//
// The sizes are measured after the lock is released (sizing.go).
func (m *Manager) List(c Caller) ListResult {
	srcs := m.sourcesWithLag(context.Background())
	m.mu.Lock()
	if !m.admin(c) {
		// Where a source lives on the host is the admin's business: a
		// branch token is trusted with its branches, not the host's paths.
		for i := range srcs {
			srcs[i].DataDir, srcs[i].Chain, srcs[i].Backups, srcs[i].WALDir = "", "", nil, ""
		}
	}
	res := ListResult{Sources: srcs, Snapshots: []Snapshot{}, Branches: []Branch{}}
	live := map[string]bool{}
	for _, s := range m.st.Snapshots {
		live[snapKey(s)] = true
		if !m.visible(c, s) {
			continue
		}
		res.Snapshots = append(res.Snapshots, *s)
	}
	jobs := map[string]sizeJob{}
	for _, b := range m.st.Branches {
		if b.Owner != Owner(c.Token) && !m.admin(c) {
			continue
		}
		res.Branches = append(res.Branches, m.view(b))
		jobs[b.Name] = m.job(b)
	}
	m.mu.Unlock()
	m.forgetExtents(live)
	for i := range res.Snapshots {
		s := &res.Snapshots[i]
		s.Size, s.Shared = m.snapshotUsage(s.Home, s.Name)
	}
	for i := range res.Branches {
		b := &res.Branches[i]
		b.Size, b.Shared = m.branchUsage(jobs[b.Name])
	}
	sort.Slice(res.Branches, func(i, j int) bool { return res.Branches[i].Name < res.Branches[j].Name })
	use := map[string]*Usage{}
	get := func(owner string) *Usage {
		if use[owner] == nil {
			use[owner] = &Usage{Owner: owner, MaxBranches: m.o.MaxBranches, MaxOwnBytes: m.o.MaxOwnBytes}
		}
		return use[owner]
	}
	get(Owner(c.Token))
	for _, b := range res.Branches {
		u := get(b.Owner)
		u.Branches++
		u.OwnBytes += b.Size - b.Shared
	}
	for _, u := range use {
		res.Usage = append(res.Usage, *u)
	}
	sort.Slice(res.Usage, func(i, j int) bool { return res.Usage[i].Owner < res.Usage[j].Owner })
	return res
}

// Get returns one of the caller's branches, sized after the lock is
// released.
func (m *Manager) Get(c Caller, name string) (Branch, error) {
	m.mu.Lock()
	b, err := m.branch(c, name)
	if err != nil {
		m.mu.Unlock()
		return Branch{}, err
	}
	v, j := m.view(b), m.job(b)
	m.mu.Unlock()
	v.Size, v.Shared = m.branchUsage(j)
	return v, nil
}

// view is what callers get of a branch: a copy with its URL (List and
// Get add its disk use, measured without the lock).
func (m *Manager) view(b *Branch) Branch {
	v := *b
	v.Conn = b.URL()
	if v.State == stateReady && !m.busy[b.Name] && !m.running(b) {
		v.State = stateStopped
	}
	return v
}

// running says whether a branch's server runs.
func (m *Manager) running(b *Branch) bool {
	return cluster.StateOf(m.o.Layout, regName(b.Name)) == cluster.Running
}

// checkSpace refuses to create below the free-space floor.
func (m *Manager) checkSpace() error {
	if m.o.MinFree <= 0 {
		return nil
	}
	var st syscall.Statfs_t
	if err := syscall.Statfs(m.dir, &st); err != nil {
		return errs.FromOS(err, m.dir, "cannot see the free space")
	}
	if free := int64(st.Bavail) * int64(st.Bsize); free < m.o.MinFree {
		return errs.New(errs.NoSpace, "only %d bytes free on the branches' volume, below the floor of %d", free, m.o.MinFree).
			WithPath(m.dir).WithHint("delete branches or snapshots, or grow the volume")
	}
	return nil
}

func validName(kind, name string) error {
	if err := cluster.ValidateName(name); err != nil || len(name) > 40 || strings.HasPrefix(name, ".") {
		return errs.New(errs.Usage, "bad %s name %q", kind, name).WithHint("use 1-40 letters, digits, '_', '.' or '-', starting with a letter or digit")
	}
	return nil
}

func (m *Manager) dropUnusedOrigins() {
	used := map[string]bool{}
	for _, b := range m.st.Branches {
		used[b.Snapshot] = true
	}
	var keep []*Snapshot
	for _, s := range m.st.Snapshots {
		if s.Origin && !used[s.Name] {
			_ = removeBelow(filepath.Dir(m.snapOf(s)), s.Name)
			continue
		}
		keep = append(keep, s)
	}
	m.st.Snapshots = keep
	m.dropUnusedHomes()
}

// installation is the PostgreSQL build that runs data directory dir:
// Options.Installation, or else one of dir's major (Options.PGBin's if
// it is of that major).
func (m *Manager) installation(dir string) (pgbin.Installation, error) {
	if m.o.Installation.BinDir != "" {
		return m.o.Installation, nil
	}
	major, err := pgdata.Version(dir)
	if err != nil {
		return pgbin.Installation{}, err
	}
	if m.o.PGBin != "" {
		in, err := pgbin.Find(pgbin.Options{Explicit: m.o.PGBin}, 0)
		if err != nil || in.Major == major {
			return in, err
		}
	}
	in, err := pgbin.Find(pgbin.Options{StateDir: m.o.Layout.Root}, major)
	if err != nil {
		return pgbin.Installation{}, pgbin.MissingMajor(err, major, "%s is a PostgreSQL %d data directory", dir, major)
	}
	return in, nil
}

// connect opens a connection (tests and health checks).
func connect(ctx context.Context, url string) (*pgx.Conn, error) { return pgx.Connect(ctx, url) }
