package branches

import (
	"context"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgfork/pgfork/clone"
	"github.com/pgfork/pgfork/cluster"
	"github.com/pgfork/pgfork/instance"
	"github.com/pgfork/pgfork/internal/errs"
	"github.com/pgfork/pgfork/internal/fsutil"
	"github.com/pgfork/pgfork/internal/units"
	"github.com/pgfork/pgfork/pgclone"
)

// CreateOptions say what a branch is made from (exactly one of Source,
// Snapshot and From) and how it lives.
type CreateOptions struct {
	Name      string
	Source    string
	Snapshot  string
	From      string // another branch
	TTL       time.Duration
	Protected bool
}

// testHook, when set (tests only), is called at named steps of a create:
// "preparing" while a snapshot's recovery server runs, "copied" once the
// branch's data directory is in place, "started" once its server runs, all
// before the branch is recorded as complete.
var testHook func(step string)

func hook(step string) {
	if testHook != nil {
		testHook(step)
	}
}

// Create makes a branch for the caller and starts it: a snapshot of the
// source or branch asked for (or the named snapshot), copied by reflink,
// started on its own TCP port with a role and password of its own. It is
// recorded as creating first, so a crash at any step leaves nothing that
// the next Open does not remove.
func (m *Manager) Create(ctx context.Context, c Caller, o CreateOptions) (Branch, error) {
	b, origin, isSource, err := m.reserve(ctx, c, o, m.ownUse(c))
	if err != nil {
		return Branch{}, err
	}
	fail := func(err error) (Branch, error) {
		m.mu.Lock()
		defer m.mu.Unlock()
		m.removeBranchFiles(context.WithoutCancel(ctx), b.Name)
		if origin != "" {
			delete(m.pending, b.Snapshot)
			_ = removeBelow(filepath.Join(m.dir, "snap"), b.Snapshot)
		}
		m.forget(b.Name)
		m.dropUnusedOrigins()
		_ = m.save()
		return Branch{}, err
	}
	if origin != "" && isSource && m.o.SourceMaxAge > 0 {
		// Recorded (and shared) by sharedOrigin: no longer this create's
		// own to remove on failure.
		src := origin
		origin = ""
		if err := m.sharedOrigin(ctx, b, src); err != nil {
			return fail(err)
		}
	}
	if origin != "" {
		if err := m.buildSnapshot(ctx, b.Snapshot, origin, isSource); err != nil {
			return fail(err)
		}
	}
	if err := m.copyAndStart(ctx, b, false); err != nil {
		return fail(err)
	}
	hook("started")
	m.mu.Lock()
	defer m.mu.Unlock()
	if origin != "" {
		delete(m.pending, b.Snapshot)
		m.st.Snapshots = append(m.st.Snapshots, &Snapshot{Name: b.Snapshot, From: strings.SplitN(b.From, ":", 2)[0] + ":" + origin,
			Owner: b.Owner, Created: time.Now().UTC(), Origin: true})
	}
	b.State = stateReady
	if err := m.save(); err != nil {
		m.mu.Unlock()
		_, err = fail(err)
		m.mu.Lock()
		return Branch{}, err
	}
	return m.view(b), nil
}

// sharedOrigin points branch b (reserved, from source) at the newest
// origin snapshot of source begun at most SourceMaxAge ago, or makes one
// (under b.Snapshot's reserved name) and records it at once, so that the
// creates from that source waiting meanwhile share it. One snapshot of a
// source is made at a time; it goes with the last branch using it.
func (m *Manager) sharedOrigin(ctx context.Context, b *Branch, source string) error {
	m.mu.Lock()
	own := b.Snapshot
	turn := m.building[source]
	if turn == nil {
		turn = make(chan struct{}, 1)
		m.building[source] = turn
	}
	m.mu.Unlock()
	select {
	case turn <- struct{}{}:
	case <-ctx.Done():
		// The request went away while another create makes the snapshot.
		m.mu.Lock()
		delete(m.pending, own)
		m.mu.Unlock()
		return errs.Wrap(errs.Interrupted, ctx.Err(), "gave up waiting for the snapshot of source %q another create is making", source)
	}
	defer func() { <-turn }()
	m.mu.Lock()
	var fresh *Snapshot
	for _, s := range m.st.Snapshots {
		if s.Origin && s.From == "source:"+source && time.Since(s.Created) <= m.o.SourceMaxAge &&
			(fresh == nil || s.Created.After(fresh.Created)) {
			fresh = s
		}
	}
	if fresh != nil {
		delete(m.pending, own)
		b.Snapshot = fresh.Name
		err := m.save()
		m.mu.Unlock()
		return err
	}
	m.mu.Unlock()
	begun := time.Now().UTC()
	err := m.buildSnapshot(ctx, own, source, true)
	m.mu.Lock()
	defer m.mu.Unlock()
	delete(m.pending, own)
	if err != nil {
		return err
	}
	m.st.Snapshots = append(m.st.Snapshots, &Snapshot{Name: own, From: "source:" + source, Owner: b.Owner, Created: begun, Origin: true})
	return m.save()
}

// reserve checks a create and records the branch as creating (with the
// name of the origin snapshot to make, if any: origin is then what it is
// made of, a source when isSource, else a branch).
//
// own is what the caller's branches use of their own (ownUse, measured
// before: never under the lock).
func (m *Manager) reserve(ctx context.Context, c Caller, o CreateOptions, own int64) (b *Branch, origin string, isSource bool, err error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.expire(ctx)
	fail := func(err error) (*Branch, string, bool, error) { return nil, "", false, err }
	if err := validName("branch", o.Name); err != nil {
		return fail(err)
	}
	n := 0
	for _, x := range []string{o.Source, o.Snapshot, o.From} {
		if x != "" {
			n++
		}
	}
	if n != 1 {
		return fail(errs.New(errs.Usage, "a branch is made from one source, one snapshot or one branch").
			WithHint("name exactly one of them"))
	}
	used := map[int]bool{}
	for _, x := range m.st.Branches {
		if x.Name == o.Name {
			return fail(errs.New(errs.Exists, "a branch named %q already exists", o.Name).WithHint("choose another name"))
		}
		used[x.Port] = true
	}
	owner := Owner(c.Token)
	if m.o.MaxBranches > 0 && !m.admin(c) {
		mine := 0
		for _, x := range m.st.Branches {
			if x.Owner == owner {
				mine++
			}
		}
		if mine >= m.o.MaxBranches {
			return fail(errs.New(errs.Permission, "quota reached: %d branches of %d", mine, m.o.MaxBranches).
				WithHint("delete one of your branches first"))
		}
	}
	if m.o.MaxOwnBytes > 0 && !m.admin(c) {
		if own >= m.o.MaxOwnBytes {
			return fail(errs.New(errs.Permission, "disk quota reached: your branches use %s of their own, the quota is %s",
				units.Bytes(own), units.Bytes(m.o.MaxOwnBytes)).WithHint("delete or reset one of your branches first"))
		}
	}
	if err := m.checkSpace(); err != nil {
		return fail(err)
	}
	var from string
	switch {
	case o.Source != "":
		if _, ok := m.source(o.Source); !ok {
			return fail(errs.New(errs.NotFound, "no source named %q", o.Source).WithHint("list the sources serve was given"))
		}
		from, origin, isSource = "source:"+o.Source, o.Source, true
	case o.From != "":
		if _, err := m.runningBranch(c, o.From); err != nil {
			return fail(err)
		}
		from, origin = "branch:"+o.From, o.From
	default:
		if m.snapshot(o.Snapshot) == nil || m.snapshot(o.Snapshot).Origin {
			return fail(errs.New(errs.NotFound, "no snapshot named %q", o.Snapshot).WithHint("list the snapshots"))
		}
		from = "snapshot:" + o.Snapshot
	}
	// A port free now and not another branch's, held from now on (ports.go).
	port, err := m.choosePort(o.Name, m.o.Host, used)
	if err != nil {
		return fail(err)
	}
	b = &Branch{Name: o.Name, From: from, Owner: owner, Created: time.Now().UTC(), TTL: o.TTL, Protected: o.Protected,
		Port: port, Host: m.o.Host, Role: "branch_" + strings.NewReplacer(".", "_", "-", "_").Replace(o.Name),
		Password: instance.NewPassword(), State: stateCreating, Snapshot: o.Snapshot}
	if origin != "" {
		b.Snapshot = "origin-" + o.Name + "-" + fsutil.RandomTag()
		m.pending[b.Snapshot] = true
	}
	m.st.Branches = append(m.st.Branches, b)
	if err := m.save(); err != nil {
		m.st.Branches = m.st.Branches[:len(m.st.Branches)-1]
		delete(m.pending, b.Snapshot)
		m.releasePort(b.Name)
		return fail(err)
	}
	return b, origin, isSource, nil
}

func (m *Manager) forget(name string) {
	m.releasePort(name)
	var keep []*Branch
	for _, x := range m.st.Branches {
		if x.Name != name {
			keep = append(keep, x)
		}
	}
	m.st.Branches = keep
}

// copyAndStart copies the branch's snapshot into its data directory
// (replacing what is there) and starts it.
func (m *Manager) copyAndStart(ctx context.Context, b *Branch, replace bool) error {
	if _, err := clone.Copy(ctx, m.snapDir(b.Snapshot), m.branchDir(b.Name), clone.Options{Sync: clone.SyncFS, Force: replace}); err != nil {
		return err
	}
	if err := m.copyTablespaces(ctx, b); err != nil {
		return err
	}
	hook("copied")
	return m.start(ctx, b)
}

// branchSettings are every branch's server settings beyond its source's,
// for the disk a branch costs on a reflink volume (bench/branches.go
// measures them against PostgreSQL's defaults): wal_init_zero off, a new
// WAL segment is not first filled with 16 MB of zeros, so it costs only
// the blocks written (PostgreSQL's advice for copy-on-write filesystems);
// wal_compression on, the full-page images a branch writes after its first
// checkpoint are compressed. Durability is unchanged.
var branchSettings = map[string]string{"wal_init_zero": "off", "wal_compression": "on"}

// start starts a branch's server on its port, TCP with scram only, and
// gives its role its password.
func (m *Manager) start(ctx context.Context, b *Branch) error {
	data := m.branchDir(b.Name)
	if err := instance.WritePasswordHBA(data, m.o.User); err != nil {
		return err
	}
	inst := m.o.Installation
	st, err := m.startOnPort(ctx, b, cluster.BranchOptions{Name: regName(b.Name), DataDir: data,
		Kind: cluster.KindClone, Source: b.From, BinDir: inst.BinDir, Env: inst.Env(), PGVersion: inst.Version,
		PGMajor: inst.Major, User: m.o.User, Port: b.Port, TCP: true, Settings: branchSettings, StartTimeout: 10 * time.Minute})
	if err != nil {
		return err
	}
	sock := &instance.Instance{DataDir: data, SocketDir: st.SocketDir, Port: st.Port}
	conn, err := pgx.Connect(ctx, sock.ConnString(m.o.SuperUser, "postgres"))
	if err != nil {
		return errs.Wrap(errs.Internal, err, "cannot reach branch %q to create its role", b.Name)
	}
	defer conn.Close(context.WithoutCancel(ctx))
	var exists bool
	if err := conn.QueryRow(ctx, "SELECT EXISTS (SELECT FROM pg_roles WHERE rolname = $1)", b.Role).Scan(&exists); err != nil {
		return errs.Wrap(errs.Internal, err, "cannot create the role of branch %q", b.Name)
	}
	if !exists {
		if _, err := conn.Exec(ctx, "CREATE ROLE "+pgx.Identifier{b.Role}.Sanitize()+" LOGIN SUPERUSER"); err != nil {
			return errs.Wrap(errs.Internal, err, "cannot create the role of branch %q", b.Name)
		}
	}
	return sock.SetPassword(ctx, b.Role, b.Password)
}

// buildSnapshot makes the stopped data directory snap/name from a source
// (by online clone or restore) or from a running branch (online clone); it
// records nothing (the caller does, under the lock). Every snapshot ends
// cleanly shut down: an online clone is recovered once (prepare), so that
// the branches made of it, and each reset of them, start without replaying
// WAL; a backup source's restore already ends so.
func (m *Manager) buildSnapshot(ctx context.Context, name, from string, isSource bool) error {
	dst := m.snapDir(name)
	_ = clone.CleanStale(dst)
	var err error
	if isSource {
		s, _ := m.source(from)
		switch s.Kind {
		case SourceBackup:
			if m.o.Restore == nil {
				return errs.New(errs.Unsupported, "source %q is a backup chain but this server cannot restore", s.Name)
			}
			err = m.o.Restore(ctx, s, dst)
		case SourceStandby:
			e, gerr := cluster.Get(m.o.Layout, standbyReg(s.Name))
			if gerr != nil {
				return gerr
			}
			sock := &instance.Instance{SocketDir: e.SocketDir, Port: e.Port}
			err = m.onlineClone(ctx, name, m.standbyDir(s.Name), sock.ConnString(m.o.SuperUser, "postgres"), true)
		default:
			err = m.onlineClone(ctx, name, s.DataDir, s.ConnString, false)
		}
	} else {
		e, gerr := cluster.Get(m.o.Layout, regName(from))
		if gerr != nil {
			return gerr
		}
		sock := &instance.Instance{SocketDir: e.SocketDir, Port: e.Port}
		err = m.onlineClone(ctx, name, m.branchDir(from), sock.ConnString(m.o.SuperUser, "postgres"), false)
	}
	if err != nil {
		_ = removeBelow(filepath.Join(m.dir, "snap"), name)
		return err
	}
	return nil
}

// onlineClone clones the running server of data directory src (reached by
// conn) into snap/name and prepares the copy. On a standby, a CHECKPOINT
// first makes a restartpoint, so that the copy has less WAL to replay.
func (m *Manager) onlineClone(ctx context.Context, name, src, conn string, standby bool) error {
	if standby {
		if c, err := pgx.Connect(ctx, conn); err == nil {
			_, _ = c.Exec(ctx, "CHECKPOINT")
			c.Close(context.WithoutCancel(ctx))
		}
	}
	dst := m.snapDir(name)
	if _, err := pgclone.Clone(ctx, pgclone.Options{Src: src, Dst: dst, Installation: m.o.Installation, Online: true,
		ConnString: conn, Label: "pgfork branches " + name, Sync: clone.SyncFS, User: m.o.User}); err != nil {
		return err
	}
	return m.prepare(ctx, dst)
}

// prepare recovers an online clone once and shuts it down cleanly: it is
// started privately (no TCP, its own socket directory, registered under a
// TempServerName so that the next Open stops one a crash left running),
// replays the WAL of its backup to consistency and ends recovery, then is
// stopped by a fast shutdown. Its server log is removed: a branch's log
// begins with its own start.
func (m *Manager) prepare(ctx context.Context, dst string) error {
	inst := m.o.Installation
	tmp := TempServerName()
	if _, err := cluster.StartBranch(ctx, m.o.Layout, cluster.BranchOptions{Name: tmp, DataDir: dst, Kind: cluster.KindClone,
		Source: "snapshot being prepared", BinDir: inst.BinDir, Env: inst.Env(), PGVersion: inst.Version, PGMajor: inst.Major,
		User: m.o.User, Settings: branchSettings, StartTimeout: 10 * time.Minute}); err != nil {
		return err
	}
	hook("preparing")
	if err := cluster.Down(context.WithoutCancel(ctx), m.o.Layout, tmp, cluster.DownOptions{KeepData: true, Timeout: time.Minute}); err != nil {
		return err
	}
	if err := os.Remove(filepath.Join(dst, instance.LogFileName)); err != nil && !os.IsNotExist(err) {
		return errs.FromOS(err, dst, "cannot remove the server log of a prepared snapshot")
	}
	return nil
}

// SnapshotOptions name a snapshot and what it is taken of (one of Source
// and Branch).
type SnapshotOptions struct {
	Name   string
	Source string
	Branch string
	// Keep, when above 0, keeps only the newest Keep snapshots taken of
	// the same source or branch (those no branch is made from).
	Keep int
}

// CreateSnapshot takes a named, read-only snapshot of a source or of one
// of the caller's branches.
func (m *Manager) CreateSnapshot(ctx context.Context, c Caller, o SnapshotOptions) (Snapshot, error) {
	from, isSource, err := m.reserveSnapshot(c, o)
	if err != nil {
		return Snapshot{}, err
	}
	err = m.buildSnapshot(ctx, o.Name, from, isSource)
	m.mu.Lock()
	defer m.mu.Unlock()
	delete(m.pending, o.Name)
	if err != nil {
		return Snapshot{}, err
	}
	kind := "branch:"
	if isSource {
		kind = "source:"
	}
	s := &Snapshot{Name: o.Name, From: kind + from, Owner: Owner(c.Token), Created: time.Now().UTC()}
	m.st.Snapshots = append(m.st.Snapshots, s)
	if o.Keep > 0 {
		m.retain(s.From, o.Keep)
	}
	return *s, m.save()
}

// reserveSnapshot checks a snapshot and claims its name.
func (m *Manager) reserveSnapshot(c Caller, o SnapshotOptions) (from string, isSource bool, err error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if err := validName("snapshot", o.Name); err != nil || strings.HasPrefix(o.Name, "origin-") {
		return "", false, errs.New(errs.Usage, "bad snapshot name %q", o.Name).WithHint("use 1-40 letters, digits, '_', '.' or '-', not starting with origin-")
	}
	if m.snapshot(o.Name) != nil || m.pending[o.Name] {
		return "", false, errs.New(errs.Exists, "a snapshot named %q already exists", o.Name).WithHint("choose another name")
	}
	if (o.Source == "") == (o.Branch == "") {
		return "", false, errs.New(errs.Usage, "a snapshot is of one source or one branch").WithHint("name exactly one")
	}
	if err := m.checkSpace(); err != nil {
		return "", false, err
	}
	from, isSource = o.Branch, false
	if o.Source != "" {
		if _, ok := m.source(o.Source); !ok {
			return "", false, errs.New(errs.NotFound, "no source named %q", o.Source)
		}
		from, isSource = o.Source, true
	} else if _, err := m.runningBranch(c, o.Branch); err != nil {
		return "", false, err
	}
	m.pending[o.Name] = true
	return from, isSource, nil
}

// retain removes the oldest unused named snapshots of from beyond keep.
func (m *Manager) retain(from string, keep int) {
	used := map[string]bool{}
	for _, b := range m.st.Branches {
		used[b.Snapshot] = true
	}
	var same []*Snapshot
	for _, s := range m.st.Snapshots {
		if !s.Origin && s.From == from {
			same = append(same, s)
		}
	}
	sort.Slice(same, func(i, j int) bool { return same[i].Created.After(same[j].Created) })
	drop := map[string]bool{}
	for i, s := range same {
		if i >= keep && !used[s.Name] {
			drop[s.Name] = true
		}
	}
	var rest []*Snapshot
	for _, s := range m.st.Snapshots {
		if drop[s.Name] {
			_ = removeBelow(filepath.Join(m.dir, "snap"), s.Name)
			continue
		}
		rest = append(rest, s)
	}
	m.st.Snapshots = rest
}

// DeleteSnapshot removes a named snapshot no branch is made from (the
// caller's, or any with an admin token).
func (m *Manager) DeleteSnapshot(c Caller, name string) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	s := m.snapshot(name)
	if s == nil || s.Origin || (s.Owner != Owner(c.Token) && !m.admin(c)) {
		return errs.New(errs.NotFound, "no snapshot named %q", name)
	}
	for _, b := range m.st.Branches {
		if b.Snapshot == name {
			return errs.New(errs.Busy, "branch %q is made from snapshot %q", b.Name, name).WithHint("delete the branch first")
		}
	}
	var rest []*Snapshot
	for _, x := range m.st.Snapshots {
		if x.Name != name {
			rest = append(rest, x)
		}
	}
	m.st.Snapshots = rest
	if err := m.save(); err != nil {
		return err
	}
	if err := removeBelow(filepath.Join(m.dir, "snap"), name); err != nil {
		return errs.FromOS(err, m.snapDir(name), "cannot remove the snapshot's files")
	}
	return nil
}

// Reset puts a branch back to the snapshot it was made from: its server
// stopped, its data directory replaced by a new copy, started again on the
// same port with the same role and password.
func (m *Manager) Reset(ctx context.Context, c Caller, name string) (Branch, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	b, err := m.branch(c, name)
	if err != nil {
		return Branch{}, err
	}
	m.busy[name] = true
	m.mu.Unlock()
	err = cluster.Down(ctx, m.o.Layout, regName(b.Name), cluster.DownOptions{KeepData: true, Timeout: 30 * time.Second})
	if err == nil || errs.IsNotFound(err) {
		_ = m.keepStoppedPort(b) // taken meanwhile: the start says by whom
		err = m.copyAndStart(ctx, b, true)
	}
	m.mu.Lock()
	delete(m.busy, name)
	if err != nil {
		return Branch{}, err
	}
	b.ResetAt, b.Stopped = time.Now().UTC(), false
	return m.view(b), m.save()
}

// runningBranch is branch, refused (Busy) when its server is stopped: an
// online clone of it needs it running.
func (m *Manager) runningBranch(c Caller, name string) (*Branch, error) {
	b, err := m.branch(c, name)
	if err == nil && !m.running(b) {
		return nil, errs.New(errs.Busy, "branch %q is stopped", name).WithHint("start it first")
	}
	return b, err
}

// Start starts a stopped branch on its port (with its role and password);
// a running one is left as it is.
func (m *Manager) Start(ctx context.Context, c Caller, name string) (Branch, error) {
	return m.switchOn(ctx, c, name, true)
}

// Stop stops a branch's server, keeping its data: it stays stopped,
// across restarts of serve too, until Start or Reset.
func (m *Manager) Stop(ctx context.Context, c Caller, name string) (Branch, error) {
	return m.switchOn(ctx, c, name, false)
}

func (m *Manager) switchOn(ctx context.Context, c Caller, name string, on bool) (Branch, error) {
	// held: the port of a stopped branch, taken by another process at
	// once; the stop is done, the error says who has the port.
	var held error
	m.mu.Lock()
	defer m.mu.Unlock()
	b, err := m.branch(c, name)
	if err != nil {
		return Branch{}, err
	}
	if m.running(b) == on {
		if b.Stopped == !on {
			return m.view(b), nil
		}
	} else {
		m.busy[name] = true
		m.mu.Unlock()
		// The record of a server that is gone goes before a start.
		err = cluster.Down(ctx, m.o.Layout, regName(name), cluster.DownOptions{KeepData: true, Timeout: 30 * time.Second})
		if errs.IsNotFound(err) {
			err = nil
		}
		if err == nil && on {
			err = m.start(ctx, b)
		} else if err == nil {
			held = m.keepStoppedPort(b)
		}
		m.mu.Lock()
		delete(m.busy, name)
		if err != nil {
			return Branch{}, err
		}
	}
	b.Stopped = !on
	if err := m.save(); err != nil {
		return Branch{}, err
	}
	return m.view(b), held
}

// Protect sets or clears a branch's protect flag: a protected branch is
// neither deleted nor expired.
func (m *Manager) Protect(c Caller, name string, on bool) (Branch, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	b, err := m.branch(c, name)
	if err != nil {
		return Branch{}, err
	}
	b.Protected = on
	return m.view(b), m.save()
}

// Delete stops and removes a branch (refused while it is protected).
func (m *Manager) Delete(ctx context.Context, c Caller, name string) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	b, err := m.branch(c, name)
	if err != nil {
		return err
	}
	if b.Protected {
		return errs.New(errs.Busy, "branch %q is protected", name).WithHint("unprotect it first")
	}
	return m.delete(ctx, b)
}

func (m *Manager) delete(ctx context.Context, b *Branch) error {
	if err := cluster.Down(ctx, m.o.Layout, regName(b.Name), cluster.DownOptions{Timeout: 30 * time.Second}); err != nil && !errs.IsNotFound(err) {
		return err
	}
	_ = removeBelow(filepath.Join(m.dir, "data"), b.Name)
	_ = removeBelow(filepath.Join(m.dir, "tblspc"), b.Name)
	m.forget(b.Name)
	m.dropUnusedOrigins()
	return m.save()
}

// Expire deletes the branches whose TTL ran out (protected ones stay).
func (m *Manager) Expire(ctx context.Context) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.expire(ctx)
}

func (m *Manager) expire(ctx context.Context) {
	now := time.Now()
	for _, b := range append([]*Branch(nil), m.st.Branches...) {
		if b.State == stateReady && !m.busy[b.Name] && !b.Protected && !b.Expires().IsZero() && now.After(b.Expires()) {
			_ = m.delete(ctx, b)
		}
	}
}

// ExpireIdle deletes the branches on which no client session was seen
// for idle (protected ones stay): each call looks at every branch's
// sessions (pg_stat_activity, over its private socket) and remembers when
// it last saw one; a branch never seen busy counts from its creation or
// last reset. serve calls it every 30 seconds.
func (m *Manager) ExpireIdle(ctx context.Context, idle time.Duration) {
	m.mu.Lock()
	defer m.mu.Unlock()
	now := time.Now().UTC()
	changed := false
	for _, b := range append([]*Branch(nil), m.st.Branches...) {
		if b.State != stateReady || m.busy[b.Name] {
			continue
		}
		if n, err := m.sessions(ctx, b); err == nil && n > 0 {
			b.Active, changed = now, true
			continue
		} else if err != nil {
			continue // not reachable now: not proven idle
		}
		last := b.Created
		for _, t := range []time.Time{b.ResetAt, b.Active} {
			if t.After(last) {
				last = t
			}
		}
		if !b.Protected && now.Sub(last) > idle {
			_ = m.delete(ctx, b)
		}
	}
	if changed {
		_ = m.save()
	}
}

// sessions counts the client sessions on a branch other than its own.
func (m *Manager) sessions(ctx context.Context, b *Branch) (int, error) {
	e, err := cluster.Get(m.o.Layout, regName(b.Name))
	if err != nil {
		return 0, err
	}
	sock := &instance.Instance{SocketDir: e.SocketDir, Port: e.Port}
	cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	c, err := pgx.Connect(cctx, sock.ConnString(m.o.SuperUser, "postgres"))
	if err != nil {
		return 0, err
	}
	defer c.Close(context.WithoutCancel(ctx))
	var n int
	err = c.QueryRow(cctx, "SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'client backend' AND pid <> pg_backend_pid()").Scan(&n)
	return n, err
}

// ScheduledSnapshot takes a snapshot of source named SOURCE-YYYYMMDDTHHMMSSZ
// as the admin, keeping the newest keep of that source's (0: all); serve
// calls it on a schedule.
func (m *Manager) ScheduledSnapshot(ctx context.Context, source string, keep int) (Snapshot, error) {
	name := source + "-" + time.Now().UTC().Format("20060102T150405Z")
	var admin Caller
	if len(m.o.AdminTokens) > 0 {
		admin.Token = m.o.AdminTokens[0]
	}
	return m.CreateSnapshot(ctx, admin, SnapshotOptions{Name: name, Source: source, Keep: keep})
}
