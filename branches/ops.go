package branches

import (
	"context"
	"maps"
	"os"
	"path/filepath"
	"slices"
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
	"github.com/pgfork/pgfork/pgdata"
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
	// Port is the TCP port asked for (0: a free one); an admin's only
	// (pgfork branch without a server: the machine's user).
	Port int
	// DataDir, with Source, is the branch's data directory, named by the
	// user (pgfork restore --start DST): it must not exist; the branch's
	// snapshot is made in a home beside it (.DST.pgfork, home.go), on its
	// filesystem, not in the state directory. Not for serve's callers.
	// Without it, Options.BranchStore may put the branch in a branch
	// store beside the source (store.go).
	DataDir string
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
		m.removeBranchFiles(context.WithoutCancel(ctx), b)
		if origin != "" {
			delete(m.pending, b.Snapshot)
			_ = removeBelow(filepath.Dir(m.snapOfBranch(b)), b.Snapshot)
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
	if origin != "" && isSource {
		direct, err := m.directOrigin(ctx, b, origin)
		if err != nil {
			return fail(err)
		}
		if direct { // recorded: the last branch using it drops it
			origin = ""
		}
	}
	if origin != "" {
		if err := m.buildSnapshot(ctx, b.Home, b.Snapshot, origin, isSource); err != nil {
			return fail(err)
		}
	}
	if err := m.copyAndStart(ctx, b); err != nil {
		return fail(err)
	}
	hook("started")
	m.mu.Lock()
	defer m.mu.Unlock()
	if origin != "" {
		delete(m.pending, b.Snapshot)
		m.st.Snapshots = append(m.st.Snapshots, &Snapshot{Name: b.Snapshot, From: strings.SplitN(b.From, ":", 2)[0] + ":" + origin,
			Owner: b.Owner, Created: time.Now().UTC(), Origin: true, Home: b.Home})
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
		if s.Origin && s.From == "source:"+source && s.Home == b.Home && time.Since(s.Created) <= m.o.SourceMaxAge &&
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
	err := m.buildSnapshot(ctx, b.Home, own, source, true)
	m.mu.Lock()
	defer m.mu.Unlock()
	delete(m.pending, own)
	if err != nil {
		return err
	}
	m.st.Snapshots = append(m.st.Snapshots, &Snapshot{Name: own, From: "source:" + source, Owner: b.Owner, Created: begun, Origin: true, Home: b.Home})
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
	if o.DataDir != "" && o.Source == "" {
		return fail(errs.New(errs.Usage, "a data directory is named only for a branch of a source").
			WithHint("a branch of a snapshot or of a branch lives beside it"))
	}
	// home: where its snapshot and data go (home.go), the home of what it
	// is made from.
	var from, home, dataDir string
	var homeID fileID
	var plan storePlan
	switch {
	case o.Source != "":
		if _, ok := m.source(o.Source); !ok {
			return fail(errs.New(errs.NotFound, "no source named %q", o.Source).WithHint("list the sources serve was given"))
		}
		from, origin, isSource = "source:"+o.Source, o.Source, true
		if o.DataDir != "" {
			if d, err := resolveDataDir(o.DataDir); err != nil {
				return fail(err)
			} else if i := slices.IndexFunc(m.st.Branches, func(x *Branch) bool { return x.DataDir == d }); i >= 0 {
				return fail(errs.New(errs.Exists, "%s is branch %q's data directory", d, m.st.Branches[i].Name).WithHint("choose another directory"))
			}
			if dataDir, home, homeID, err = m.homeFor(o.DataDir); err != nil {
				return fail(err)
			}
		} else {
			s, _ := m.source(o.Source)
			plan = m.planStore(ctx, s, o.Name)
			dataDir, home, homeID = plan.DataDir, plan.Home, plan.HomeID
		}
	case o.From != "":
		x, err := m.runningBranch(c, o.From)
		if err != nil {
			return fail(err)
		}
		from, origin, home = "branch:"+o.From, o.From, x.Home
	default:
		s := m.snapshot(o.Snapshot)
		if s == nil || !m.visible(c, s) {
			return fail(errs.New(errs.NotFound, "no snapshot named %q", o.Snapshot).WithHint("list the snapshots"))
		}
		from, home = "snapshot:"+o.Snapshot, s.Home
	}
	// A home made for this create and not recorded yet goes with a
	// refusal (one recorded holds the snapshots of an earlier branch).
	newHome := home != "" && !slices.Contains(m.st.Homes, home)
	_, knownStore := m.st.Stores[plan.Dir]
	dropHome := func() {
		if newHome {
			m.st.Homes = slices.DeleteFunc(m.st.Homes, func(h string) bool { return h == home })
			delete(m.st.HomeIDs, home)
			m.homeIDs.Delete(home)
			_ = removeBelow(filepath.Dir(home), filepath.Base(home))
		}
		if plan.Dir != "" && !knownStore {
			delete(m.st.Stores, plan.Dir)
			dropStore(plan.Dir, plan.ID)
		}
	}
	// A port free now and not another branch's, held from now on (ports.go).
	port, err := m.askedPort(c, o, used)
	if err != nil {
		dropHome()
		return fail(err)
	}
	b = &Branch{Name: o.Name, From: from, Owner: owner, Created: time.Now().UTC(), TTL: o.TTL, Protected: o.Protected,
		Port: port, Host: m.o.Host, Role: "branch_" + strings.NewReplacer(".", "_", "-", "_").Replace(o.Name),
		Password: instance.NewPassword(), State: stateCreating, Snapshot: o.Snapshot, Home: home, DataDir: dataDir,
		Store: plan.Dir, noStore: plan.Why}
	m.addStore(plan.Dir, plan.ID)
	m.addHome(home, homeID)
	if origin != "" {
		b.Snapshot = "origin-" + o.Name + "-" + fsutil.RandomTag()
		m.pending[b.Snapshot] = true
	}
	m.st.Branches = append(m.st.Branches, b)
	if err := m.save(); err != nil {
		m.st.Branches = m.st.Branches[:len(m.st.Branches)-1]
		delete(m.pending, b.Snapshot)
		m.releasePort(b.Name)
		dropHome()
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
// (newData), puts it in place and starts it (putData).
func (m *Manager) copyAndStart(ctx context.Context, b *Branch) error {
	next, err := m.newData(ctx, b, false)
	if err != nil {
		return err
	}
	_, err = m.putData(ctx, b, next, false)
	return err
}

// newData makes a new data directory for branch b from its snapshot
// (fill) and returns where: its work directory, or, for a reset of a
// branch whose data directory is that work directory (in the state
// directory), beside it. Nothing of the branch's current data is touched,
// so a reset makes it while the branch still runs.
func (m *Manager) newData(ctx context.Context, b *Branch, reset bool) (string, error) {
	next := m.workDir(b)
	if b.DataDir == "" && reset {
		// A name no branch can have (validName: a letter or digit first):
		// "NAME.new" could be another branch's data directory.
		next = filepath.Join(filepath.Dir(next), ".new-"+b.Name)
	}
	_ = removeBelow(filepath.Dir(next), filepath.Base(next)) // a crashed create's or reset's
	if err := m.fill(ctx, b, next); err != nil {
		return "", err
	}
	return next, nil
}

// putData gives branch b (its server stopped) the data directory next
// made by newData: its own copies of the snapshot's tablespaces, then
// moved into place (replacing the branch's data directory on a reset),
// and starts it. A reset's old data directory is renamed aside, to trash,
// for the caller to remove once the branch is no longer busy: removing
// files of many extents takes time the branch need be neither down nor
// busy for (a crash leaves it to Open's sweep: no branch has its name).
func (m *Manager) putData(ctx context.Context, b *Branch, next string, replace bool) (trash string, err error) {
	if err := m.copyTablespaces(ctx, b, next); err != nil {
		return "", err
	}
	old := "" // where the replaced data directory is once swapped out
	switch {
	case b.DataDir != "":
		if err := m.placeData(b, replace); err != nil {
			return "", err
		}
		if replace {
			old = m.workDir(b)
		}
	case replace:
		work := m.workDir(b)
		if err := swapDirs(next, work); err != nil {
			return "", errs.FromOS(err, work, "cannot put the branch's new data directory in place")
		}
		old = next
	}
	if old != "" {
		trash = filepath.Join(filepath.Dir(old), ".old-"+b.Name+"-"+fsutil.RandomTag())
		if err := os.Rename(old, trash); err != nil {
			trash = ""
			_ = removeBelow(filepath.Dir(old), filepath.Base(old))
		}
	}
	hook("copied")
	if err := m.start(ctx, b); err != nil {
		if !replace { // a create: its fail removes the data directory, the server log in it too
			return trash, errs.Wrap(errs.KindOf(err), err, "branch %q did not start", b.Name).
				WithHint("the server log's last lines are above (the new branch's data directory is removed, its log with it)")
		}
		return trash, err
	}
	return trash, nil
}

// branchSettings are every branch's server settings beyond its source's,
// for the disk a branch costs on a reflink volume (bench/branches.go
// measures them against PostgreSQL's defaults): wal_init_zero off, a new
// WAL segment is not first filled with 16 MB of zeros, so it costs only
// the blocks written (PostgreSQL's advice for copy-on-write filesystems);
// wal_compression on, the full-page images a branch writes after its first
// checkpoint are compressed. Durability is unchanged. And no logical
// replication worker: a subscription of the source that ran in a branch
// would connect to its publisher with the source's credentials and take
// changes from its slot away from the source's own subscriber
// (scrubCredentials drops the subscriptions).
var branchSettings = map[string]string{"wal_init_zero": "off", "wal_compression": "on", "max_logical_replication_workers": "0"}

// startSettings are the settings a branch's server starts with in data
// (of PostgreSQL major): branchSettings and, on a filesystem that clones
// (XFS, btrfs: where branches share their blocks),
// recovery_init_sync_method = syncfs. A branch of a backup or of an
// online clone is not shut down cleanly, so its server syncs the data
// directory before recovery: file by file by default (1,024 fsyncs, 0.11 s
// of a 0.38 s start of a pgbench scale 100 restore on XFS; the files were
// made durable by the copy's syncfs already), one syncfs instead, as
// restore.Start does and for the same reason (slow only on a shared root
// filesystem, where it is not used). PostgreSQL 14 and later.
func startSettings(data string, major int) map[string]string {
	fs, err := clone.FSType(data)
	if err != nil || !clone.MayClone(fs) || major < 14 {
		return branchSettings
	}
	s := maps.Clone(branchSettings)
	s["recovery_init_sync_method"] = "syncfs"
	return s
}

// start starts a branch's server on its port, TCP with scram only, sets
// up its role (setUpRole) and gives it its password.
func (m *Manager) start(ctx context.Context, b *Branch) error {
	data := m.dataOf(b)
	if err := instance.WritePasswordHBA(data, m.o.User); err != nil {
		return err
	}
	inst, err := m.installation(data)
	if err != nil {
		return err
	}
	st, err := m.startOnPort(ctx, b, cluster.BranchOptions{Name: regName(b.Name), DataDir: data,
		Kind: cluster.KindClone, Source: b.From, BinDir: inst.BinDir, Env: inst.Env(), PGVersion: inst.Version,
		PGMajor: inst.Major, User: m.o.User, Port: b.Port, TCP: true, Settings: startSettings(data, inst.Major), StartTimeout: 10 * time.Minute})
	if err != nil {
		return err
	}
	sock := &instance.Instance{DataDir: data, SocketDir: st.SocketDir, Port: st.Port}
	conn, err := pgx.Connect(ctx, sock.ConnString(m.o.SuperUser, "postgres"))
	if err != nil {
		return errs.Wrap(errs.Internal, err, "cannot reach branch %q to create its role", b.Name)
	}
	defer conn.Close(context.WithoutCancel(ctx))
	if err := m.setUpRole(ctx, conn, b.Role); err != nil {
		return errs.Wrap(errs.Internal, err, "cannot set up the role of branch %q", b.Name).
			WithHint("see the branch's server log; a role of the source may conflict with the branch's")
	}
	if err := m.scrubCredentials(ctx, sock, data, b.Role); err != nil {
		return errs.Wrap(errs.Internal, err, "cannot remove the source's subscriptions and user mapping passwords from branch %q", b.Name).
			WithHint("see the branch's server log")
	}
	return sock.SetPassword(ctx, b.Role, b.Password)
}

// serverFileRoles are the predefined roles that reach the host as the
// server's OS user (programs, files): no branch role is ever a member of
// them, nor of a role that is.
var serverFileRoles = map[string]bool{"pg_execute_server_program": true, "pg_read_server_files": true, "pg_write_server_files": true}

// grantedRoles are the predefined roles every branch role is a member of:
// it reads and writes every table, whoever owns it, sees every session's
// statistics, cancels and ends other sessions, checkpoints (all of it
// inside its own server).
var grantedRoles = []string{"pg_read_all_data", "pg_write_all_data", "pg_read_all_stats", "pg_signal_backend", "pg_checkpoint"}

// firstNormalOid is PostgreSQL's FirstNormalObjectId: roles below it are
// predefined (pg_*) or the bootstrap superuser.
const firstNormalOid = 16384

// pgRole is one row of pg_authid, with its direct memberships.
type pgRole struct {
	oid                                                  uint32
	name                                                 string
	super, createRole, pass, login, replication, inherit bool
	createDB, bypassRLS                                  bool
	// memberOf are the roles it is a direct member of (granted by grantors).
	memberOf map[uint32][]uint32
}

// setUpRole makes role a branch's role, over conn (the bootstrap
// superuser on the branch's private socket), on every start:
//
//   - a role that logs in and is no superuser: NOSUPERUSER NOREPLICATION,
//     CREATEDB, BYPASSRLS (row security is the source's, not a barrier
//     inside a copy), CREATEROLE only on PostgreSQL 16 and later (before,
//     CREATEROLE grants any role, pg_execute_server_program too);
//   - a member of pg_read_all_data and pg_write_all_data (and of the
//     other grantedRoles), and of every
//     role of the source that cannot reach superuser power (is no
//     superuser and is a member, at any depth, of no superuser, no
//     pg_execute_server_program, pg_read_server_files or
//     pg_write_server_files and, before 16, of no role with CREATEROLE):
//     it runs DDL on the application's tables as their owners do;
//   - of no other predefined or unsafe role, and through no role it
//     reaches of one either, nor of REPLICATION (stripReach: a branch made
//     before branch roles stopped being superusers may have granted it
//     one; an application role of the source may be a member of
//     pg_read_all_settings or have REPLICATION);
//   - in conn's database (the one its URL names), CREATE on the database
//     and on schema public (PostgreSQL 15 gives schema public to the
//     database's owner alone).
//
// Every other role loses its password, so that no credential of the
// source (its hashes are readable with pg_read_all_data, an md5 one is as
// good as the password) nor of another branch's owner works here; every
// other role named branch_* (the role of the branch a snapshot was taken
// of) is also made NOLOGIN and no superuser: the role of a branch made
// from another owner's snapshot is that owner's no more. Their objects
// stay usable through the membership above.
func (m *Manager) setUpRole(ctx context.Context, conn *pgx.Conn, role string) (err error) {
	if _, err := conn.Exec(ctx, "SET search_path = pg_catalog, pg_temp"); err != nil {
		return err
	}
	var major int
	if err := conn.QueryRow(ctx, "SELECT current_setting('server_version_num')::int / 10000").Scan(&major); err != nil {
		return err
	}
	tx, err := conn.Begin(ctx)
	if err != nil {
		return err
	}
	defer func() {
		if err != nil {
			_ = tx.Rollback(context.WithoutCancel(ctx))
		}
	}()
	// Only what is not so already is changed: a branch started again
	// writes nothing.
	me := pgx.Identifier{role}.Sanitize()
	createRole := major >= 16
	attrs := "LOGIN NOSUPERUSER NOREPLICATION INHERIT CREATEDB BYPASSRLS NOCREATEROLE"
	if createRole {
		attrs = strings.Replace(attrs, "NOCREATEROLE", "CREATEROLE", 1)
	}
	roles, err := readRoles(ctx, tx)
	if err != nil {
		return err
	}
	if !slices.ContainsFunc(roles, func(r *pgRole) bool { return r.name == role }) {
		if _, err := tx.Exec(ctx, "CREATE ROLE "+me+" "+attrs); err != nil {
			return err
		}
		if roles, err = readRoles(ctx, tx); err != nil {
			return err
		}
	}
	var self *pgRole
	for _, r := range roles {
		var q string
		switch {
		case r.name == role:
			self = r
			if !r.login || r.super || r.replication || !r.inherit || !r.createDB || !r.bypassRLS || r.createRole != createRole {
				q = attrs
			}
		case strings.HasPrefix(r.name, "branch_") && r.name != m.o.SuperUser && r.oid >= firstNormalOid:
			if r.login || r.super || r.replication || r.pass {
				q = "NOLOGIN NOSUPERUSER NOREPLICATION PASSWORD NULL"
				r.super = false
			}
		case r.pass:
			q = "PASSWORD NULL"
		}
		if q != "" {
			if _, err := tx.Exec(ctx, "ALTER ROLE "+pgx.Identifier{r.name}.Sanitize()+" "+q); err != nil {
				return err
			}
		}
	}
	if self == nil {
		return errs.New(errs.Internal, "role %s is missing right after its creation", role)
	}
	g := newRoleGraph(roles, major)
	var grant []string
	for _, r := range roles {
		if r == self || self.memberOf[r.oid] != nil {
			continue
		}
		if g.granted(r) || (!g.predefined(r) && !g.unsafe(r) && !g.up(r)[self.oid]) {
			grant = append(grant, pgx.Identifier{r.name}.Sanitize())
		}
	}
	if len(grant) > 0 {
		if _, err := tx.Exec(ctx, "GRANT "+strings.Join(grant, ", ")+" TO "+me); err != nil {
			return err
		}
	}
	if roles, err = readRoles(ctx, tx); err != nil {
		return err
	}
	if err := stripReach(ctx, tx, newRoleGraph(roles, major), role); err != nil {
		return err
	}
	// In the database its URL names (conn's), it creates schemas, and
	// tables in schema public, as that database's owner would.
	var db string
	var onDB, onPublic bool
	if err := tx.QueryRow(ctx, `SELECT current_database(), has_database_privilege($1, current_database(), 'CREATE'),
		COALESCE((SELECT has_schema_privilege($1, oid, 'USAGE') AND has_schema_privilege($1, oid, 'CREATE')
			FROM pg_namespace WHERE nspname = 'public'), true)`, role).
		Scan(&db, &onDB, &onPublic); err != nil {
		return err
	}
	if !onDB {
		if _, err := tx.Exec(ctx, "GRANT CREATE ON DATABASE "+pgx.Identifier{db}.Sanitize()+" TO "+me); err != nil {
			return err
		}
	}
	if !onPublic {
		if _, err := tx.Exec(ctx, "GRANT USAGE, CREATE ON SCHEMA public TO "+me); err != nil {
			return err
		}
	}
	return tx.Commit(ctx)
}

// readRoles reads every role and its direct memberships.
func readRoles(ctx context.Context, tx pgx.Tx) ([]*pgRole, error) {
	var roles []*pgRole
	byOid := map[uint32]*pgRole{}
	rows, _ := tx.Query(ctx, `SELECT oid, rolname, rolsuper, rolcreaterole, rolpassword IS NOT NULL, rolcanlogin, rolreplication,
		rolinherit, rolcreatedb, rolbypassrls FROM pg_authid ORDER BY rolname`)
	var r pgRole
	if _, err := pgx.ForEachRow(rows, []any{&r.oid, &r.name, &r.super, &r.createRole, &r.pass, &r.login, &r.replication,
		&r.inherit, &r.createDB, &r.bypassRLS}, func() error {
		x := r
		x.memberOf = map[uint32][]uint32{}
		roles = append(roles, &x)
		byOid[x.oid] = &x
		return nil
	}); err != nil {
		return nil, err
	}
	var role, member, grantor uint32
	rows, _ = tx.Query(ctx, "SELECT roleid, member, grantor FROM pg_auth_members")
	_, err := pgx.ForEachRow(rows, []any{&role, &member, &grantor}, func() error {
		if x := byOid[member]; x != nil {
			x.memberOf[role] = append(x.memberOf[role], grantor)
		}
		return nil
	})
	return roles, err
}

// roleGraph is a branch's roles (readRoles) with what setUpRole asks of
// them.
type roleGraph struct {
	roles []*pgRole
	byOid map[uint32]*pgRole
	major int // PostgreSQL's
}

func newRoleGraph(roles []*pgRole, major int) *roleGraph {
	g := &roleGraph{roles: roles, byOid: map[uint32]*pgRole{}, major: major}
	for _, r := range roles {
		g.byOid[r.oid] = r
	}
	return g
}

// up is every role r is a member of at any depth, through every row of
// pg_auth_members (whatever its INHERIT, SET and ADMIN options: a role
// administered is as good as one held), and r itself.
func (g *roleGraph) up(r *pgRole) map[uint32]bool {
	seen := map[uint32]bool{r.oid: true}
	todo := []*pgRole{r}
	for len(todo) > 0 {
		x := todo[len(todo)-1]
		todo = todo[:len(todo)-1]
		for o := range x.memberOf {
			if !seen[o] && g.byOid[o] != nil {
				seen[o] = true
				todo = append(todo, g.byOid[o])
			}
		}
	}
	return seen
}

// unsafe says whether r reaches superuser power: it is, or is a member at
// any depth of, a superuser, a serverFileRoles role or, before
// PostgreSQL 16, a role with CREATEROLE (it granted any role).
func (g *roleGraph) unsafe(r *pgRole) bool {
	for o := range g.up(r) {
		x := g.byOid[o]
		if x.super || serverFileRoles[x.name] || (g.major < 16 && x.createRole) {
			return true
		}
	}
	return false
}

// granted says whether r is one of grantedRoles.
func (g *roleGraph) granted(r *pgRole) bool { return slices.Contains(grantedRoles, r.name) }

// predefined says whether r is a predefined role or the bootstrap
// superuser.
func (g *roleGraph) predefined(r *pgRole) bool {
	return r.oid < firstNormalOid || strings.HasPrefix(r.name, "pg_")
}

// barred says whether no role a branch's role reaches may be a member of
// r (nor administer it): r reaches superuser power (unsafe) or is a
// predefined role outside grantedRoles.
func (g *roleGraph) barred(r *pgRole) bool {
	return !g.granted(r) && (g.predefined(r) || g.unsafe(r))
}

// stripReach makes what the branch's role (role) reaches in the branch
// exactly what docs/branches.md lists, whatever the source's roles hold:
// it walks every role the branch's role is a member of, can SET ROLE to or
// administers, at any depth (every row of pg_auth_members, as up), and
//
//   - revokes each membership of a role on the way in a barred role (a
//     predefined role outside grantedRoles, such as pg_read_all_settings or
//     pg_monitor, or one that reaches superuser power), with the grants
//     made through it (CASCADE): the branch's own memberships left by an
//     earlier start, the source's application roles' (an app role that is
//     a member of pg_read_all_settings), and those of grantedRoles
//     themselves;
//   - makes every role on the way NOREPLICATION (after SET ROLE, a role
//     with REPLICATION creates replication slots, which keep WAL until the
//     branch's disk is full).
//
// None of those roles logs in to the branch (setUpRole removes their
// passwords), so no one loses anything but what the branch's role would
// have got through them. No role on the way is a superuser: superusers are
// barred. CREATEROLE adds nothing: before PostgreSQL 16 a role with it is
// barred; from 16 it grants only roles it administers (on the way) and
// gives REPLICATION only if it holds it. BYPASSRLS stays where the source
// put it: the branch's role holds it itself. Only what is not so already
// is changed: a branch started again writes nothing. The source is never
// touched: tx is the branch's.
func stripReach(ctx context.Context, tx pgx.Tx, g *roleGraph, role string) error {
	var self *pgRole
	for _, r := range g.roles {
		if r.name == role {
			self = r
		}
	}
	if self == nil {
		return errs.New(errs.Internal, "role %s is missing", role)
	}
	seen := map[uint32]bool{self.oid: true}
	todo := []*pgRole{self}
	for len(todo) > 0 {
		x := todo[0]
		todo = todo[1:]
		if x.replication {
			if _, err := tx.Exec(ctx, "ALTER ROLE "+pgx.Identifier{x.name}.Sanitize()+" NOREPLICATION"); err != nil {
				return err
			}
		}
		of := slices.Sorted(maps.Keys(x.memberOf))
		for _, o := range of {
			p := g.byOid[o]
			switch {
			case p == nil || seen[o]:
			case g.barred(p):
				if err := revokeMembership(ctx, tx, g, p, x); err != nil {
					return err
				}
			default:
				seen[o] = true
				todo = append(todo, p)
			}
		}
	}
	return nil
}

// revokeMembership revokes role r from member x, every grant of it (from
// PostgreSQL 16 each grantor's is a grant of its own), with what was
// granted through it.
func revokeMembership(ctx context.Context, tx pgx.Tx, g *roleGraph, r, x *pgRole) error {
	grantors := x.memberOf[r.oid]
	if g.major < 16 {
		grantors = []uint32{0}
	}
	for _, by := range grantors {
		q := "REVOKE " + pgx.Identifier{r.name}.Sanitize() + " FROM " + pgx.Identifier{x.name}.Sanitize()
		if by != 0 && g.byOid[by] != nil {
			q += " GRANTED BY " + pgx.Identifier{g.byOid[by].name}.Sanitize() + " CASCADE"
		}
		if _, err := tx.Exec(ctx, q); err != nil {
			return err
		}
	}
	return nil
}

// buildSnapshot makes the stopped data directory snap/name from a source
// (by online clone or restore) or from a running branch (online clone); it
// records nothing (the caller does, under the lock). Every snapshot ends
// cleanly shut down: an online clone is recovered once (prepare), so that
// the branches made of it, and each reset of them, start without replaying
// WAL; a backup source's restore already ends so.
//
// home is where it goes (home.go): the home of the branch it is made for
// or of, "" for a named snapshot of a source.
func (m *Manager) buildSnapshot(ctx context.Context, home, name, from string, isSource bool) error {
	dst := m.snapPath(home, name)
	_ = clone.CleanStale(dst)
	var err error
	if isSource {
		s, _ := m.source(from)
		var dataDir, noStore string
		m.mu.Lock()
		for _, b := range m.st.Branches {
			if home != "" && b.Home == home && b.DataDir != "" {
				dataDir = b.DataDir
			}
			if b.Snapshot == name {
				noStore = b.noStore
			}
		}
		m.mu.Unlock()
		m.noticeCrossing(ctx, s, dst, dataDir, noStore)
		switch s.Kind {
		case SourceBackup:
			err = m.restoreSource(ctx, s, dst)
		case SourceStandby:
			e, gerr := cluster.Get(m.o.Layout, standbyReg(s.Name))
			if gerr != nil {
				return gerr
			}
			sock := &instance.Instance{SocketDir: e.SocketDir, Port: e.Port}
			err = m.onlineClone(ctx, dst, m.standbyDir(s.Name), sock.ConnString(m.o.SuperUser, "postgres"), true)
		default:
			err = m.cloneCluster(ctx, dst, s)
		}
	} else {
		e, gerr := cluster.Get(m.o.Layout, regName(from))
		if gerr != nil {
			return gerr
		}
		m.mu.Lock()
		var src string
		for _, x := range m.st.Branches {
			if x.Name == from {
				src = m.dataOf(x)
			}
		}
		m.mu.Unlock()
		sock := &instance.Instance{SocketDir: e.SocketDir, Port: e.Port}
		err = m.onlineClone(ctx, dst, src, sock.ConnString(m.o.SuperUser, "postgres"), false)
	}
	if err != nil {
		_ = removeBelow(filepath.Dir(dst), name)
		return err
	}
	return nil
}

// cloneCluster snapshots a cluster source: by online clone while its
// server runs, else by offline clone (a cluster shut down cleanly: the
// copy starts as it is, with nothing to prepare).
func (m *Manager) cloneCluster(ctx context.Context, dst string, s Source) error {
	_, running, err := pgdata.Running(s.DataDir)
	if err != nil {
		return err
	}
	if running {
		return m.onlineClone(ctx, dst, s.DataDir, s.ConnString, false)
	}
	inst, err := m.installation(s.DataDir)
	if err != nil {
		return err
	}
	_, err = pgclone.Clone(ctx, pgclone.Options{Src: s.DataDir, Dst: dst, Installation: inst, ConfigDir: s.ConfigDir,
		Sync: clone.SyncFS, User: m.o.User})
	return err
}

// onlineClone clones the running server of data directory src (reached by
// conn) into the snapshot directory dst and prepares the copy. On a standby, a CHECKPOINT
// first makes a restartpoint, so that the copy has less WAL to replay.
func (m *Manager) onlineClone(ctx context.Context, dst, src, conn string, standby bool) error {
	if standby {
		if c, err := pgx.Connect(ctx, conn); err == nil {
			_, _ = c.Exec(ctx, "CHECKPOINT")
			c.Close(context.WithoutCancel(ctx))
		}
	}
	inst, err := m.installation(src)
	if err != nil {
		return err
	}
	if _, err := pgclone.Clone(ctx, pgclone.Options{Src: src, Dst: dst, Installation: inst, Online: true,
		ConnString: conn, Label: "pgfork branches " + filepath.Base(dst), Sync: clone.SyncFS, User: m.o.User}); err != nil {
		return err
	}
	return m.prepare(ctx, dst)
}

// prepare recovers an online clone once and shuts it down cleanly: it is
// started privately (no TCP, its own socket directory, registered under a
// tempServerName so that the next Open stops one a crash left running),
// replays the WAL of its backup to consistency and ends recovery, then is
// stopped by a fast shutdown. Its server log is removed: a branch's log
// begins with its own start.
func (m *Manager) prepare(ctx context.Context, dst string) error {
	inst, err := m.installation(dst)
	if err != nil {
		return err
	}
	tmp := tempServerName()
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
	// Keep, when above 0, keeps only the newest Keep snapshots the caller
	// took of the same source or branch (removing the caller's older ones
	// that no branch is made from; other owners' are left alone).
	Keep int
}

// CreateSnapshot takes a named, read-only snapshot of a source or of one
// of the caller's branches.
func (m *Manager) CreateSnapshot(ctx context.Context, c Caller, o SnapshotOptions) (Snapshot, error) {
	from, isSource, home, err := m.reserveSnapshot(c, o)
	if err != nil {
		return Snapshot{}, err
	}
	err = m.buildSnapshot(ctx, home, o.Name, from, isSource)
	m.mu.Lock()
	defer m.mu.Unlock()
	delete(m.pending, o.Name)
	delete(m.pendingHome, o.Name)
	if err != nil {
		return Snapshot{}, err
	}
	kind := "branch:"
	if isSource {
		kind = "source:"
	}
	s := &Snapshot{Name: o.Name, From: kind + from, Owner: Owner(c.Token), Created: time.Now().UTC(), Home: home}
	m.st.Snapshots = append(m.st.Snapshots, s)
	if o.Keep > 0 {
		m.retain(s.From, s.Owner, o.Keep)
	}
	return *s, m.save()
}

// reserveSnapshot checks a snapshot and claims its name; home is where
// it goes: the branch's home, or the default one for a source.
func (m *Manager) reserveSnapshot(c Caller, o SnapshotOptions) (from string, isSource bool, home string, err error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if err := validName("snapshot", o.Name); err != nil || strings.HasPrefix(o.Name, "origin-") {
		return "", false, "", errs.New(errs.Usage, "bad snapshot name %q", o.Name).WithHint("use 1-40 letters, digits, '_', '.' or '-', not starting with origin-")
	}
	if m.snapshot(o.Name) != nil || m.pending[o.Name] {
		return "", false, "", errs.New(errs.Exists, "a snapshot named %q already exists", o.Name).WithHint("choose another name")
	}
	if (o.Source == "") == (o.Branch == "") {
		return "", false, "", errs.New(errs.Usage, "a snapshot is of one source or one branch").WithHint("name exactly one")
	}
	if err := m.checkSpace(); err != nil {
		return "", false, "", err
	}
	from, isSource = o.Branch, false
	if o.Source != "" {
		if _, ok := m.source(o.Source); !ok {
			return "", false, "", errs.New(errs.NotFound, "no source named %q", o.Source)
		}
		from, isSource = o.Source, true
	} else if b, err := m.runningBranch(c, o.Branch); err != nil {
		return "", false, "", err
	} else {
		home = b.Home
	}
	m.pending[o.Name] = true
	m.pendingHome[o.Name] = home
	return from, isSource, home, nil
}

// visible says whether caller c sees named snapshot s, may branch it and
// may name it: a snapshot of a source is every token's to see and branch;
// a snapshot of a branch is its owner's (and the admin tokens') alone,
// since it holds what that owner wrote in their branch. Origin snapshots
// are nobody's to name.
func (m *Manager) visible(c Caller, s *Snapshot) bool {
	return !s.Origin && (strings.HasPrefix(s.From, "source:") || s.Owner == Owner(c.Token) || m.admin(c))
}

// retain removes the oldest unused named snapshots of from taken by owner
// beyond keep: other owners' snapshots (the admin's scheduled ones too)
// neither count nor go.
func (m *Manager) retain(from, owner string, keep int) {
	used := map[string]bool{}
	for _, b := range m.st.Branches {
		used[b.Snapshot] = true
	}
	var same []*Snapshot
	for _, s := range m.st.Snapshots {
		if !s.Origin && s.From == from && s.Owner == owner {
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
			_ = removeBelow(filepath.Dir(m.snapOf(s)), s.Name)
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
	if s == nil || !m.visible(c, s) || (s.Owner != Owner(c.Token) && !m.admin(c)) {
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
	if err := removeBelow(filepath.Dir(m.snapOf(s)), name); err != nil {
		return errs.FromOS(err, m.snapOf(s), "cannot remove the snapshot's files")
	}
	m.dropUnusedHomes()
	return m.save()
}

// Reset puts a branch back to the snapshot it was made from: its server
// stopped, its data directory replaced by a new copy, started again on the
// same port with the same role and password. The new data directory is
// made first, the branch still running: a branch whose snapshot is its
// backups (direct.go) keeps running as it was when those have changed or
// gone.
func (m *Manager) Reset(ctx context.Context, c Caller, name string) (Branch, error) {
	// The old data directory, put aside by putData, is removed once the
	// lock is released (deferred first, run last) and the branch is no
	// longer busy.
	var trash string
	defer func() {
		if trash != "" {
			_ = removeBelow(filepath.Dir(trash), filepath.Base(trash))
		}
	}()
	m.mu.Lock()
	defer m.mu.Unlock()
	b, err := m.branch(c, name)
	if err != nil {
		return Branch{}, err
	}
	m.busy[name] = true
	m.mu.Unlock()
	// The new data directory is made while the branch still runs: its
	// server is down for the swap and the start alone, and a copy that
	// fails leaves it running as it was.
	next, err := m.newData(ctx, b, true)
	if err == nil {
		hook("reset-made")
		err = cluster.Down(ctx, m.o.Layout, regName(b.Name), cluster.DownOptions{KeepData: true, Timeout: 30 * time.Second})
		if errs.IsNotFound(err) {
			err = nil
		}
		if err != nil {
			_ = removeBelow(filepath.Dir(next), filepath.Base(next))
		} else {
			_ = m.keepStoppedPort(b) // taken meanwhile: the start says by whom
			trash, err = m.putData(ctx, b, next, true)
		}
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
	m.removeNamedData(b)
	_ = removeBelow(filepath.Dir(m.workDir(b)), b.Name)
	_ = removeBelow(filepath.Dir(m.tblspcOf(b)), b.Name)
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
// as the admin, keeping the newest keep of the admin's snapshots of that
// source (0: all; other tokens' snapshots are not touched); serve
// calls it on a schedule.
func (m *Manager) ScheduledSnapshot(ctx context.Context, source string, keep int) (Snapshot, error) {
	name := source + "-" + time.Now().UTC().Format("20060102T150405Z")
	var admin Caller
	if len(m.o.AdminTokens) > 0 {
		admin.Token = m.o.AdminTokens[0]
	}
	return m.CreateSnapshot(ctx, admin, SnapshotOptions{Name: name, Source: source, Keep: keep})
}
