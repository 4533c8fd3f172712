// Package clusterstore is the pool.Store of cluster isolation (`pgfork
// serve --isolation cluster`): a cluster of its own per template and a
// copy of it, started on its own port, per test.
package clusterstore

import (
	"context"
	"encoding/json"
	"errors"
	"io/fs"
	"net/url"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgfork/pgfork/clone"
	"github.com/pgfork/pgfork/cluster"
	"github.com/pgfork/pgfork/dbclone"
	"github.com/pgfork/pgfork/instance"
	"github.com/pgfork/pgfork/internal/errs"
	"github.com/pgfork/pgfork/internal/fsutil"
	"github.com/pgfork/pgfork/internal/secret"
	"github.com/pgfork/pgfork/internal/statedir"
	"github.com/pgfork/pgfork/pgbin"
	"github.com/pgfork/pgfork/pgdata"
	"github.com/pgfork/pgfork/pool"
	"github.com/pgfork/pgfork/template"
)

// Options shape a Store.
type Options struct {
	// Dir holds templates/<name>/data, tests/<name>/data, state.json and
	// the client role's password; a reflink filesystem makes copies cheap.
	Dir string
	// Layout is pgfork's state directory: the empty base cluster comes
	// from its template cache (template.Get), shared with `pgfork up`.
	Layout statedir.Layout
	PG     pgbin.Installation
	User   *instance.OSUser // OS user PostgreSQL runs as (nil: current user)
	// Role is the role handed to clients (default "pgfork"), a superuser
	// of each cluster unless LeastPrivilege; Password its password (empty:
	// random, kept in Dir/password).
	Role, Password string
	// LeastPrivilege makes Role a non-superuser that may create databases
	// and owns the template database (serve --least-privilege).
	LeastPrivilege bool
	// Settings are extra server settings of every cluster (over the test
	// profile and defaultSettings).
	Settings map[string]string
	// Lean leaves the template cluster with template1 and the template's
	// database only (postgres and template0 dropped once it is created):
	// a test cluster is then about 700 files to copy and remove instead of
	// about 1,300, each copy cheaper by about as much. With Slots above 1
	// postgres stays (adminDB). Lean also removes the system catalogs'
	// free space maps and visibility maps from the stopped template
	// cluster (trimCatalogForks): a quarter of its files.
	Lean bool
	// OwnName renames the template's database in each test cluster to the
	// test copy's name (as the copies of databases in one server are
	// named); otherwise clients get the template's database name.
	OwnName bool
	// Slots is how many test databases one test cluster may hold (0 or 1:
	// one, and the cluster is the test's own, as cluster isolation
	// promises). Above 1 (the managed mode's cloned clusters, whose tests
	// get a database each, as in one server), finalize adds up to Slots-1
	// copies of the template's database to its cluster (CREATE DATABASE …
	// STRATEGY FILE_COPY, within SlotBudget), so every start of a test
	// cluster, a reflink copy of that cluster, yields that many test
	// databases: the copy of the cluster's shared files, the server's
	// start and its stop are paid once for all of them. Needs OwnName.
	Slots int
	// SharesBlocks says Dir's filesystem makes reflink copies: the slots
	// are then reflink copies too (see makeSlots), and SlotBudget does not
	// bound them.
	SharesBlocks bool
}

// SlotBudget bounds what the slot copies of one template take in its
// cluster (Options.Slots) when they are full copies (no SharesBlocks, or
// a template unlike template1: see makeSlots): a template of size bytes
// gets 1 + SlotBudget / size slots, at most Options.Slots. The copies are
// made once, at finalize; the test clusters share their blocks by
// reflink where the filesystem can.
const SlotBudget = 1 << 30

// slotName is the name of slot i ≥ 1 in a template's cluster (slot 0 is
// the template's own database).
func slotName(i int) string { return "pgfork_slot_" + strconv.Itoa(i) }

// defaultSettings are the server settings of every cluster the store
// starts, under Options.Settings: password authentication on TCP and a
// small shared memory (many of them run at once, each serving one test).
var defaultSettings = map[string]string{"max_connections": "100", "password_encryption": "scram-sha-256", "shared_buffers": "32MB"}

// Store is the pool.Store of cluster isolation: every template is a
// database in a cluster of its own, running while the client migrates it
// and shut down cleanly on finalize; every test copy is a clone.Copy of
// that stopped data directory (reflink where the filesystem can) started
// on a free TCP port of 127.0.0.1, so each test gets its own server, with a
// superuser role, to change settings or do what a database per test cannot.
// Dropping a test copy stops its server (immediately: its sessions end)
// and removes its files.
type Store struct {
	o Options

	mu      sync.Mutex
	running map[string]*instance.Instance // template clusters being migrated, by name
	hosts   map[string]*host              // test clusters by their directory's name
	dbs     map[string]dbRef              // test copies by name
	slots   map[string]int                // test databases per test cluster, by template
	seq     int                           // names test clusters that hold several databases
	started int                           // test clusters begun (Started)
	stateMu sync.Mutex
}

// host is one test cluster: a copy of a template's cluster, started, with
// the databases in it not yet handed out (free) and those handed out and
// not yet dropped (live).
type host struct {
	name, tmpl string
	ready      chan struct{} // closed once started (err says how it went)
	err        error
	inst       *instance.Instance
	free       []string
	live       int
	retired    int        // databases renamed away (retire), for their names
	mu         sync.Mutex // one change to its databases at a time, on conn
	conn       *pgx.Conn  // the bootstrap superuser's, to adminDB, once needed
}

// failed reports whether h could not be started (false while it starts).
func (h *host) failed() bool {
	select {
	case <-h.ready:
		return h.err != nil
	default:
		return false
	}
}

// dbRef is where a test copy lives: its cluster and the database it got
// (a slot's name, until renamed to the copy's with OwnName).
type dbRef struct {
	h    *host
	slot string
}

// New prepares dir and the client role's password.
func New(o Options) (*Store, error) {
	if o.Role == "" {
		o.Role = "pgfork"
	}
	for _, d := range []string{o.Dir, filepath.Join(o.Dir, "templates"), filepath.Join(o.Dir, "tests")} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return nil, errs.Wrap(errs.OSKind(err), err, "cannot create %s", d)
		}
	}
	if o.Password == "" {
		pw, err := secret.Password(filepath.Join(o.Dir, "password"))
		if err != nil {
			return nil, err
		}
		o.Password = pw
	}
	return &Store{o: o, running: map[string]*instance.Instance{}, hosts: map[string]*host{}, dbs: map[string]dbRef{}, slots: map[string]int{}}, nil
}

// superuserURL reaches database db of inst as the bootstrap superuser over
// the private socket (trust there; TCP needs passwords).
func superuserURL(inst *instance.Instance, db string) string {
	q := url.Values{"host": {inst.SocketDir}, "port": {strconv.Itoa(inst.Port)}, "user": {"postgres"}, "dbname": {db}}
	return "postgres:///?" + instance.EncodeQuery(q)
}

// Conn is the connection info clients get (the port is each cluster's own).
func (s *Store) Conn() pool.ConnInfo {
	return pool.ConnInfo{Host: "127.0.0.1", Username: s.o.Role, Password: s.o.Password}
}

// Role is the superuser role handed to clients.
func (s *Store) Role() string { return s.o.Role }

func (s *Store) templateData(name string) string {
	return filepath.Join(s.o.Dir, "templates", name, "data")
}

func (s *Store) testDir(name string) string { return filepath.Join(s.o.Dir, "tests", name) }

func (s *Store) copyOptions() clone.Options {
	// Test clusters are thrown away (no sync: a crash loses them and the
	// next start makes them again) and PostgreSQL reads no file's times.
	o := clone.Options{Sync: clone.SyncNone, Filter: pgdata.Filter, SkipTimes: true}
	if s.o.User != nil {
		o.Owner = s.o.User.Owner()
	}
	return o
}

func (s *Store) start(ctx context.Context, data string) (*instance.Instance, error) {
	settings := map[string]string{}
	for k, v := range defaultSettings {
		settings[k] = v
	}
	for k, v := range s.o.Settings {
		settings[k] = v
	}
	return instance.Start(ctx, instance.Config{BinDir: s.o.PG.BinDir, Env: s.o.PG.Env(), DataDir: data, User: s.o.User,
		TCP: true, Profile: instance.Test, Settings: settings})
}

// stopDir stops a server left running on data (by a previous run or a
// failed step), immediately: its data is thrown away or was never finished.
func stopDir(data string) {
	if inst, err := instance.Attach(data); err == nil {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = inst.Stop(ctx, instance.Immediate)
	}
}

// CreateTemplate copies the empty base cluster, lets the client role in
// over TCP with its password only, starts it and creates database name in
// it, owned by the role (a superuser of that cluster).
func (s *Store) CreateTemplate(ctx context.Context, name, owner, root string) error {
	if err := cluster.ValidateName(name); err != nil {
		return err
	}
	if err := s.DropTemplate(ctx, name); err != nil {
		return err
	}
	data := s.templateData(name)
	if err := os.MkdirAll(filepath.Dir(data), 0o755); err != nil {
		return errs.Wrap(errs.OSKind(err), err, "cannot create %s", filepath.Dir(data))
	}
	base, err := template.Get(ctx, s.o.Layout, template.Options{PG: s.o.PG, User: s.o.User})
	if err != nil {
		return err
	}
	_, err = clone.Copy(ctx, base.DataDir(), data, s.copyOptions())
	base.Release()
	if err != nil {
		return err
	}
	hba := filepath.Join(data, "pg_hba.conf")
	// With the cluster user's rights: that user (and every superuser of
	// the cluster) owns the data directory.
	if err := instance.WriteFileAs(hba, s.o.User, []byte("local all all trust\nhost all all 127.0.0.1/32 scram-sha-256\nhost all all ::1/128 scram-sha-256\n")); err != nil {
		return err
	}
	inst, err := s.start(ctx, data)
	if err != nil {
		return err
	}
	s.mu.Lock()
	s.running[name] = inst
	s.mu.Unlock()
	if err := s.setupTemplate(ctx, inst, name, owner, root); err != nil {
		_ = s.DropTemplate(context.WithoutCancel(ctx), name)
		return err
	}
	return nil
}

func (s *Store) setupTemplate(ctx context.Context, inst *instance.Instance, name, owner, root string) error {
	c, err := pgx.Connect(ctx, superuserURL(inst, s.adminDB()))
	if err != nil {
		return errs.Wrap(errs.Internal, err, "cannot connect to the template cluster %s", name)
	}
	defer c.Close(context.Background())
	if owner == "" {
		owner = s.o.Role
	}
	attrs := " LOGIN SUPERUSER"
	if s.o.LeastPrivilege {
		attrs = " LOGIN CREATEDB NOSUPERUSER"
	}
	// Only the SCRAM verifier is sent: the password reaches no server log.
	lit := "'" + strings.ReplaceAll(instance.ScramVerifier(s.o.Password), "'", "''") + "'"
	if _, err := c.Exec(ctx, "CREATE ROLE "+pgx.Identifier{owner}.Sanitize()+attrs+" PASSWORD "+lit); err != nil {
		return errs.Wrap(errs.Internal, err, "cannot create role %s in the template cluster", owner)
	}
	if _, err := c.Exec(ctx, dbclone.CreateDatabaseSQL(name, root, owner)); err != nil {
		return errs.Wrap(errs.Internal, err, "cannot create database %s in the template cluster", name)
	}
	if s.o.Lean {
		for _, db := range []string{"postgres", "template0"} {
			if db == name || db == s.adminDB() {
				continue
			}
			id := pgx.Identifier{db}.Sanitize()
			if _, err := c.Exec(ctx, "ALTER DATABASE "+id+" IS_TEMPLATE false"); err != nil {
				return errs.Wrap(errs.Internal, err, "cannot drop database %s in the template cluster", db)
			}
			if _, err := c.Exec(ctx, "DROP DATABASE "+id); err != nil {
				return errs.Wrap(errs.Internal, err, "cannot drop database %s in the template cluster", db)
			}
		}
	}
	return nil
}

// FinalizeTemplate shuts the template cluster down cleanly: its data
// directory becomes the source of the test clusters.
func (s *Store) FinalizeTemplate(ctx context.Context, name string) error {
	s.mu.Lock()
	inst := s.running[name]
	delete(s.running, name)
	s.mu.Unlock()
	if inst == nil {
		return nil
	}
	n := 1
	var fill *slotFill
	if s.o.Slots > 1 {
		var err error
		if n, fill, err = s.makeSlots(ctx, inst, name); err != nil {
			_ = inst.Stop(context.WithoutCancel(ctx), instance.Immediate)
			return err
		}
	}
	if err := inst.Stop(ctx, instance.Fast); err != nil {
		return err
	}
	if fill != nil {
		if err := s.fillSlots(ctx, s.templateData(name), fill); err != nil {
			return err
		}
	}
	if s.o.Lean {
		if err := trimCatalogForks(s.templateData(name)); err != nil {
			return err
		}
	}
	// The cluster ran with fsync=off (the test profile), and it is kept:
	// every test cluster is copied from it, after a restart of serve too.
	// So it is made durable here, once. This also moves the write-back of
	// what the migrations and the slot copies wrote out of the first test
	// cluster's copy: a reflink copy must first write back its source's
	// dirty pages. Measured (bench's volume section, PostgreSQL 15, a 187 MB
	// template and 5 slot copies made by the server): the first four
	// hand-outs of the first run waited 2.9 s for it.
	if err := clone.SyncExisting(ctx, s.templateData(name)); err != nil {
		return err
	}
	if err := fsutil.WriteFileAtomic(s.slotsPath(name), []byte(strconv.Itoa(n)+"\n"), 0o644); err != nil {
		return errs.FromOS(err, s.slotsPath(name), "cannot record the template's slots")
	}
	s.mu.Lock()
	s.slots[name] = n
	s.mu.Unlock()
	cd, err := pgdata.ReadControlData(ctx, s.o.PG.BinDir, s.templateData(name), s.o.PG.Env())
	if err == nil && !strings.Contains(cd.State, "shut down") {
		return errs.New(errs.Internal, "template cluster %s did not shut down cleanly (%s)", name, cd.State)
	}
	return nil
}

// makeSlots adds slot copies of database name to its template cluster
// inst (Options.Slots, within SlotBudget) and returns how many test
// databases a copy of the cluster then holds, and the slots whose files
// fillSlots still has to make (nil: they are full copies already). The
// template's sessions are ended first: finalize means its client is done,
// and the fast stop that follows would end them anyway.
//
// A slot is made as an empty database (CREATE DATABASE from template1,
// which the template's database was made like: same encoding and locale)
// whose catalog row then says what CREATE DATABASE … TEMPLATE name would
// have copied (datfrozenxid, datminmxid, the owners' dependencies); once
// the cluster is stopped, fillSlots replaces its directory by a reflink
// copy of the template's, as CREATE DATABASE's FILE_COPY copies it byte
// for byte. Before PostgreSQL 18 the server's own copy is a full copy of
// every block: for a 187 MB template and 5 slots, 935 MB written at
// finalize and then written back before the first test cluster could be
// copied (bench's volume section: finalize 3.6 s). When template1 differs
// in encoding or locale, the slots are full copies made by the server.
func (s *Store) makeSlots(ctx context.Context, inst *instance.Instance, name string) (int, *slotFill, error) {
	c, err := pgx.Connect(ctx, superuserURL(inst, s.adminDB()))
	if err != nil {
		return 0, nil, errs.Wrap(errs.Internal, err, "cannot connect to the template cluster %s", name)
	}
	defer c.Close(context.WithoutCancel(ctx))
	var size int64
	var owner string
	var oid uint32
	var alike bool // and the files can be copied safely here (fillSlots: Linux)
	if err := c.QueryRow(ctx, `SELECT pg_database_size(d.oid), pg_get_userbyid(d.datdba), d.oid,
		d.encoding = t.encoding AND d.datcollate = t.datcollate AND d.datctype = t.datctype AND d.datlocprovider = t.datlocprovider
		FROM pg_database d, pg_database t WHERE d.datname = $1 AND t.datname = 'template1'`, name).Scan(&size, &owner, &oid, &alike); err != nil {
		return 0, nil, errs.Wrap(errs.Internal, err, "cannot read the size of database %s in its template cluster", name)
	}
	alike = alike && runtime.GOOS == "linux"
	n := s.o.Slots
	if size > 0 && !(alike && s.o.SharesBlocks) {
		n = int(min(int64(n), 1+SlotBudget/size))
	}
	if n <= 1 {
		return 1, nil, nil
	}
	if _, err := c.Exec(ctx, "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = $1 AND pid <> pg_backend_pid()", name); err != nil {
		return 0, nil, errs.Wrap(errs.Internal, err, "cannot end the sessions of database %s in its template cluster", name)
	}
	fill := &slotFill{template: oid}
	for i := 1; i < n; i++ {
		src := name
		if alike {
			src = "template1"
		}
		// CREATE DATABASE waits (5 s) for sessions still ending.
		if _, err := c.Exec(ctx, dbclone.CreateDatabaseSQL(slotName(i), src, owner)+" STRATEGY FILE_COPY"); err != nil {
			return 0, nil, errs.Wrap(errs.Internal, err, "cannot copy database %s to %s in its template cluster", name, slotName(i))
		}
		if !alike {
			continue
		}
		var slot uint32
		err := pgx.BeginFunc(ctx, c, func(tx pgx.Tx) error {
			if err := tx.QueryRow(ctx, `UPDATE pg_database s SET datfrozenxid = t.datfrozenxid, datminmxid = t.datminmxid
				FROM pg_database t WHERE s.datname = $1 AND t.oid = $2 RETURNING s.oid`, slotName(i), oid).Scan(&slot); err != nil {
				return err
			}
			if _, err := tx.Exec(ctx, "DELETE FROM pg_shdepend WHERE dbid = $1", slot); err != nil {
				return err
			}
			_, err := tx.Exec(ctx, `INSERT INTO pg_shdepend (dbid, classid, objid, objsubid, refclassid, refobjid, deptype)
				SELECT $1, classid, objid, objsubid, refclassid, refobjid, deptype FROM pg_shdepend WHERE dbid = $2`, slot, oid)
			return err
		})
		if err != nil {
			return 0, nil, errs.Wrap(errs.Internal, err, "cannot make %s a copy of database %s in its template cluster", slotName(i), name)
		}
		fill.slots = append(fill.slots, slot)
	}
	if !alike {
		return n, nil, nil
	}
	return n, fill, nil
}

// slotFill is what fillSlots does: the template database's oid, and the
// slots (their oids) whose directories become copies of its.
type slotFill struct {
	template uint32
	slots    []uint32
}

// fillSlots replaces the directory of every slot of f in the stopped
// (cleanly shut down: nothing to replay) template cluster at data by a
// copy of the template database's directory: reflinks where the
// filesystem has them. Each replacement is atomic (clone's Force).
//
// This runs as root inside a tree the server's OS user owns, where a
// superuser of the template cluster may have written (COPY … TO PROGRAM
// runs as that user, and what it started may still run). So base and the
// template's directory are opened once within data (os.Root: no symlink
// leads out of it), and the copy goes through those descriptors'
// /proc/self/fd paths, never through the names again: a symlink planted
// there reaches nothing outside the cluster's own files.
func (s *Store) fillSlots(ctx context.Context, data string, f *slotFill) error {
	if testHookBeforeFill != nil {
		testHookBeforeFill(data, f.template)
	}
	root, err := os.OpenRoot(data)
	if err != nil {
		return errs.FromOS(err, data, "cannot open the template cluster")
	}
	defer root.Close()
	base, err := openDirIn(root, "base")
	if err != nil {
		return errs.FromOS(err, filepath.Join(data, "base"), "cannot open the template cluster's databases")
	}
	defer base.Close()
	tpl := strconv.FormatUint(uint64(f.template), 10)
	src, err := openDirIn(root, filepath.Join("base", tpl))
	if err != nil {
		return errs.FromOS(err, filepath.Join(data, "base", tpl), "cannot open the template database's files")
	}
	defer src.Close()
	o := s.copyOptions()
	o.Filter, o.Force = nil, true
	for _, slot := range f.slots {
		dst := filepath.Join(fdPath(base), strconv.FormatUint(uint64(slot), 10))
		if _, err := clone.Copy(ctx, fdPath(src), dst, o); err != nil {
			return err
		}
	}
	return nil
}

// trimCatalogForks removes the free space maps and visibility maps of the
// system catalogs (files <relfilenode>_fsm and _vm, relfilenode below
// FirstNormalObjectId, 16384) of every database and of the shared
// catalogs of the stopped, cleanly shut down cluster at data. A test
// cluster copies and removes every file of its template's cluster: in a
// cluster of 10 databases on PostgreSQL 15 these are about 820 of about
// 3,300 files, which nothing in a test needs. PostgreSQL treats a
// missing map as an empty one, which is always safe: no page known to
// have free space (an insert extends the relation; VACUUM makes the map
// again), no page known all-visible or all-frozen (scans and VACUUM visit
// the heap). The maps of the template's own tables stay: their
// visibility map is what makes their index-only scans cheap.
//
// Like fillSlots it runs as root in a tree the cluster's OS user owns,
// so it goes through an os.Root of data: no symlink leads out of it, and
// a remove takes a name, never what a symlink of that name points to.
func trimCatalogForks(data string) error {
	root, err := os.OpenRoot(data)
	if err != nil {
		return errs.FromOS(err, data, "cannot open the template cluster")
	}
	defer root.Close()
	dirs := []string{"global"}
	if base, err := openDirIn(root, "base"); err == nil {
		ents, err := base.ReadDir(-1)
		base.Close()
		if err != nil {
			return errs.FromOS(err, filepath.Join(data, "base"), "cannot read the template cluster's databases")
		}
		for _, e := range ents {
			if _, err := strconv.ParseUint(e.Name(), 10, 32); err == nil && e.IsDir() {
				dirs = append(dirs, filepath.Join("base", e.Name()))
			}
		}
	}
	for _, rel := range dirs {
		d, err := openDirIn(root, rel)
		if err != nil {
			return errs.FromOS(err, filepath.Join(data, rel), "cannot open the template cluster's files")
		}
		ents, err := d.ReadDir(-1)
		d.Close()
		if err != nil {
			return errs.FromOS(err, filepath.Join(data, rel), "cannot read the template cluster's files")
		}
		for _, e := range ents {
			if !e.Type().IsRegular() || !catalogMapFork(e.Name()) {
				continue
			}
			if err := root.Remove(filepath.Join(rel, e.Name())); err != nil && !errors.Is(err, fs.ErrNotExist) {
				return errs.FromOS(err, filepath.Join(data, rel, e.Name()), "cannot remove a catalog's map from the template cluster")
			}
		}
	}
	return nil
}

// catalogMapFork reports whether file name (in a database's directory) is
// a segment of a system catalog's free space map or visibility map:
// <relfilenode>_fsm or _vm, with an optional .<segment>, the relfilenode
// below FirstNormalObjectId (pgdata.CatalogFile).
func catalogMapFork(name string) bool {
	_, fork, ok := strings.Cut(name, "_")
	if !ok {
		return false
	}
	fork, _, _ = strings.Cut(fork, ".")
	return (fork == "fsm" || fork == "vm") && pgdata.CatalogFile(name)
}

// testHookBeforeFill, when set (tests only), runs before fillSlots opens
// the stopped template cluster at data whose database has oid template.
var testHookBeforeFill func(data string, template uint32)

// openDirIn opens directory rel of root, within it.
func openDirIn(root *os.Root, rel string) (*os.File, error) {
	f, err := root.Open(rel)
	if err != nil {
		return nil, err
	}
	if st, err := f.Stat(); err != nil || !st.IsDir() {
		f.Close()
		if err == nil {
			err = syscall.ENOTDIR
		}
		return nil, err
	}
	return f, nil
}

// fdPath names open file f by its descriptor (Linux): the path resolves
// to f itself, whatever was renamed or planted on the way since it was
// opened.
func fdPath(f *os.File) string { return "/proc/self/fd/" + strconv.Itoa(int(f.Fd())) }

func (s *Store) slotsPath(name string) string {
	return filepath.Join(filepath.Dir(s.templateData(name)), "slots")
}

// slotsOf returns how many test databases a copy of template tmpl's
// cluster holds (1 for a template finalized without slots).
func (s *Store) slotsOf(tmpl string) int {
	s.mu.Lock()
	n, ok := s.slots[tmpl]
	s.mu.Unlock()
	if ok {
		return n
	}
	n = 1
	if b, err := os.ReadFile(s.slotsPath(tmpl)); err == nil {
		if v, err := strconv.Atoi(strings.TrimSpace(string(b))); err == nil && v >= 1 {
			n = v
		}
	}
	s.mu.Lock()
	s.slots[tmpl] = n
	s.mu.Unlock()
	return n
}

// adminDB is the database the bootstrap superuser connects to in a
// cluster of the store: postgres, which Lean drops unless the test
// clusters hold several databases (their changes then go through a kept
// connection to it), else template1.
func (s *Store) adminDB() string {
	if s.o.Lean && s.o.Slots <= 1 {
		return "template1"
	}
	return "postgres"
}

// DropTemplate stops the template's cluster, if it runs, and removes it.
func (s *Store) DropTemplate(_ context.Context, name string) error {
	if err := cluster.ValidateName(name); err != nil {
		return err
	}
	s.stopRunning(name)
	s.mu.Lock()
	var hosts []*host
	for n, h := range s.hosts {
		if h.tmpl == name {
			hosts = append(hosts, h)
			delete(s.hosts, n)
		}
	}
	for n, ref := range s.dbs {
		if ref.h.tmpl == name {
			delete(s.dbs, n)
		}
	}
	delete(s.slots, name)
	s.mu.Unlock()
	for _, h := range hosts {
		<-h.ready
		if err := s.stopHost(h); err != nil {
			return err
		}
	}
	data := s.templateData(name)
	stopDir(data)
	if err := os.RemoveAll(filepath.Dir(data)); err != nil {
		return errs.Wrap(errs.OSKind(err), err, "cannot remove template cluster %s", name)
	}
	return nil
}

func (s *Store) stopRunning(name string) {
	s.mu.Lock()
	inst := s.running[name]
	delete(s.running, name)
	s.mu.Unlock()
	if inst != nil {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = inst.Stop(ctx, instance.Immediate)
	}
}

// TemplateExists reports whether template name's cluster exists.
func (s *Store) TemplateExists(_ context.Context, name string) (bool, error) {
	if cluster.ValidateName(name) != nil {
		return false, nil
	}
	_, err := os.Stat(filepath.Join(s.templateData(name), "PG_VERSION"))
	return err == nil, nil
}

// Create makes test copy name of template tmpl: a database in a started
// copy of the template's cluster. With one slot (Options.Slots) the
// cluster is the copy's own; with more, a test cluster of tmpl that still
// has a database free gives it (renamed to name), and a new one is copied
// and started only when none has.
func (s *Store) Create(ctx context.Context, name, tmpl, _ string) (string, error) {
	if err := cluster.ValidateName(name); err != nil {
		return "", err
	}
	n := s.slotsOf(tmpl)
	if s.Holds(name) {
		if err := s.Drop(ctx, name); err != nil {
			return "cluster", err
		}
	}
	s.mu.Lock()
	var h *host
	for _, c := range s.hosts {
		if c.tmpl == tmpl && len(c.free) > 0 && !c.failed() {
			h = c
			break
		}
	}
	build := h == nil
	if build {
		s.started++
		h = &host{name: name, tmpl: tmpl, ready: make(chan struct{}), free: []string{tmpl}}
		if n > 1 {
			s.seq++
			h.name = name + "." + strconv.Itoa(s.seq)
			for i := 1; i < n; i++ {
				h.free = append(h.free, slotName(i))
			}
		}
		s.hosts[h.name] = h
	}
	slot := h.free[0]
	h.free = h.free[1:]
	h.live++
	s.dbs[name] = dbRef{h: h, slot: slot}
	s.mu.Unlock()
	if build {
		h.inst, h.err = s.startHost(ctx, h)
		close(h.ready)
	} else {
		select {
		case <-h.ready:
		case <-ctx.Done():
			_ = s.Drop(context.WithoutCancel(ctx), name)
			return "cluster", ctx.Err()
		}
	}
	if h.err != nil {
		_ = s.Drop(context.WithoutCancel(ctx), name)
		return "cluster", h.err
	}
	if err := s.prepare(ctx, h, slot, name); err != nil {
		_ = s.Drop(context.WithoutCancel(ctx), name)
		return "cluster", err
	}
	if s.o.OwnName && slot != name {
		s.mu.Lock()
		s.dbs[name] = dbRef{h: h, slot: name}
		s.mu.Unlock()
	}
	return "cluster", nil
}

// Spare is how many test copies of template tmpl the store can make now
// without copying and starting another cluster (pool.Batcher): the
// databases not yet taken in its test clusters started or being started.
// batched is false when a copy of tmpl's cluster holds one test database
// (Options.Slots, or a template finalized without slots).
func (s *Store) Spare(tmpl string) (n int, batched bool) {
	if s.slotsOf(tmpl) <= 1 {
		return 0, false
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, h := range s.hosts {
		if h.tmpl == tmpl && !h.failed() {
			n += len(h.free)
		}
	}
	return n, true
}

// Started is how many test clusters the store has begun to start since it
// was opened (for tests and diagnostics).
func (s *Store) Started() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.started
}

// startHost copies the stopped cluster of h's template into h's directory
// and starts it.
func (s *Store) startHost(ctx context.Context, h *host) (*instance.Instance, error) {
	dir := s.testDir(h.name)
	stopDir(filepath.Join(dir, "data"))
	if err := os.RemoveAll(dir); err != nil {
		return nil, errs.Wrap(errs.OSKind(err), err, "cannot remove %s", dir)
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, errs.Wrap(errs.OSKind(err), err, "cannot create %s", dir)
	}
	if _, err := clone.Copy(ctx, s.templateData(h.tmpl), filepath.Join(dir, "data"), s.copyOptions()); err != nil {
		_ = os.RemoveAll(dir)
		return nil, err
	}
	inst, err := s.start(ctx, filepath.Join(dir, "data"))
	if err != nil {
		_ = os.RemoveAll(dir)
		return nil, err
	}
	return inst, nil
}

// prepare readies database slot of test cluster h as test copy name:
// with OwnName it is renamed to name.
func (s *Store) prepare(ctx context.Context, h *host, slot, name string) error {
	if s.o.OwnName && slot != name {
		if err := s.admin(ctx, h, "ALTER DATABASE "+pgx.Identifier{slot}.Sanitize()+" RENAME TO "+pgx.Identifier{name}.Sanitize()); err != nil {
			return errs.Wrap(errs.Internal, err, "cannot rename database %s to %s in its test cluster", slot, name)
		}
	}
	return nil
}

// Warm connects to test copy name once (pool.Warmer), which builds the
// catalog caches its first connection pays for and writes them to its
// pg_internal.init; open is not done otherwise (a test cluster's shared
// buffers are small and its own). The pool warms a copy between runs,
// never with the cores of a run: a copy made while tests wait goes to
// its test at once, which builds the caches itself. Measured (issue 33,
// BenchmarkManagedCopies: 80 writing tests on 4 workers, a 187 MB
// template, PostgreSQL 15 on the XFS image, 2 cores, six runs each in
// turns over two rounds): first runs 2.61–2.84 s (median 2.69 s) against
// 2.82–3.02 s (2.86 s) with every copy connected to before its hand-out;
// second runs alike (1.13–1.84 s against 0.57–1.71 s).
func (s *Store) Warm(ctx context.Context, name string, _ bool) error {
	s.mu.Lock()
	ref, ok := s.dbs[name]
	s.mu.Unlock()
	if !ok {
		return errs.New(errs.NotFound, "no test copy %s in this store", name)
	}
	<-ref.h.ready
	if ref.h.err != nil {
		return ref.h.err
	}
	c, err := pgx.Connect(ctx, superuserURL(ref.h.inst, ref.slot))
	if err != nil {
		return errs.Wrap(errs.Internal, err, "cannot connect to the test cluster on port %d", ref.h.inst.Port)
	}
	return c.Close(ctx)
}

// CarriesCacheFile is false (pool.CacheFiler): a test cluster's server
// removed every pg_internal.init when it started, so the pool warms each
// copy between runs.
func (s *Store) CarriesCacheFile(string) bool { return false }

var _ pool.CacheFiler = (*Store)(nil)

// Prewarm asks the kernel to read test copy name ahead (pool.Prewarmer;
// pgdata.PrewarmDatabase: its catalogs, or all of it when small), off its
// test's path, when test clusters are reflink copies (Options.SharesBlocks),
// whose files are new inodes with none of their pages cached. Measured
// (bench's volume section, PostgreSQL 15 on the volume, 80 writing tests, a
// 187 MB template; see docs/server.md, "Cloned clusters"). The pool calls
// it for the copies nobody waits for. Best effort.
func (s *Store) Prewarm(ctx context.Context, name, _ string) {
	if !s.o.SharesBlocks {
		return
	}
	s.mu.Lock()
	ref, ok := s.dbs[name]
	s.mu.Unlock()
	if ok {
		s.prewarm(ctx, ref.h, ref.slot)
	}
}

// prewarm reads database db of test cluster h ahead (Prewarm).
func (s *Store) prewarm(ctx context.Context, h *host, db string) {
	var oid uint32
	if err := s.withAdmin(ctx, h, func(c *pgx.Conn) error {
		return c.QueryRow(ctx, "SELECT oid FROM pg_database WHERE datname = $1", db).Scan(&oid)
	}); err != nil {
		return
	}
	pgdata.PrewarmDatabase(filepath.Join(s.testDir(h.name), "data"), oid)
}

// admin runs sql as the bootstrap superuser of test cluster h (withAdmin).
func (s *Store) admin(ctx context.Context, h *host, sql string, args ...any) error {
	return s.withAdmin(ctx, h, func(c *pgx.Conn) error {
		_, err := c.Exec(ctx, sql, args...)
		return err
	})
}

// withAdmin runs f on the bootstrap superuser's connection to test
// cluster h, one at a time, on a connection kept for h's life (to
// adminDB: never template1, which a test's own CREATE DATABASE copies).
func (s *Store) withAdmin(ctx context.Context, h *host, f func(*pgx.Conn) error) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.conn == nil {
		c, err := pgx.Connect(ctx, superuserURL(h.inst, s.adminDB()))
		if err != nil {
			return err
		}
		h.conn = c
	}
	err := f(h.conn)
	if err != nil && h.conn.IsClosed() {
		h.conn = nil
	}
	return err
}

// Drop removes test copy name: the last database of its test cluster
// goes with the cluster (stopped immediately: its sessions end, then its
// files removed); any other is retired in it (see retire), its sessions
// ended.
func (s *Store) Drop(ctx context.Context, name string) error {
	if err := cluster.ValidateName(name); err != nil {
		return err
	}
	s.mu.Lock()
	ref, ok := s.dbs[name]
	delete(s.dbs, name)
	var h *host
	last := false
	if ok {
		h = ref.h
		h.live--
		if last = h.live == 0 && (len(h.free) == 0 || h.failed()); last {
			delete(s.hosts, h.name)
		}
	}
	s.mu.Unlock()
	if !ok {
		// Not this store's: a copy a previous run left.
		return s.removeDir(name)
	}
	<-h.ready
	if last {
		return s.stopHost(h)
	}
	if h.err != nil {
		return nil // nothing in it; the last copy's Drop removes its directory
	}
	return s.retire(ctx, h, ref.slot)
}

// retire takes database db of test cluster h out of use and frees its
// name: new connections refused, its sessions ended, then renamed away
// (retiredName); its files go with the cluster. A DROP DATABASE would
// force a checkpoint, which writes every neighbour's dirty pages and
// waits for it, on each give-back; the rename costs a catalog update.
// When a session will not end (the rename times out), it is dropped.
func (s *Store) retire(ctx context.Context, h *host, db string) error {
	id := pgx.Identifier{db}.Sanitize()
	h.mu.Lock()
	h.retired++
	to := pgx.Identifier{retiredName(h.retired)}.Sanitize()
	h.mu.Unlock()
	err := s.admin(ctx, h, "ALTER DATABASE "+id+" ALLOW_CONNECTIONS false")
	if err == nil {
		err = s.admin(ctx, h, "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = $1", db)
	}
	if err == nil {
		// The sessions exit (the test's own, just closed, too): the rename
		// would sleep 100 ms on one still there (dbclone.AwaitNoSessions).
		s.awaitNoSessions(ctx, h, db)
		err = s.admin(ctx, h, "ALTER DATABASE "+id+" RENAME TO "+to)
	}
	if err == nil {
		return nil
	}
	if err := s.admin(ctx, h, "DROP DATABASE IF EXISTS "+id+" WITH (FORCE)"); err != nil {
		return errs.Wrap(errs.Internal, err, "cannot drop database %s in its test cluster", db)
	}
	return nil
}

// awaitNoSessions waits until no session is connected to database db of
// test cluster h (dbclone.AwaitNoSessions), on h's admin connection.
func (s *Store) awaitNoSessions(ctx context.Context, h *host, db string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.conn != nil {
		dbclone.AwaitNoSessions(ctx, h.conn, db, dbclone.Grace)
	}
}

// retiredName is the name of the n-th database retired in a test cluster.
func retiredName(n int) string { return "pgfork_used_" + strconv.Itoa(n) }

// stopHost stops test cluster h (immediately) and removes its files.
func (s *Store) stopHost(h *host) error {
	h.mu.Lock()
	if h.conn != nil {
		_ = h.conn.Close(context.Background())
		h.conn = nil
	}
	h.mu.Unlock()
	if h.inst != nil {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		_ = h.inst.Stop(ctx, instance.Immediate)
		cancel()
	}
	return s.removeDir(h.name)
}

// removeDir stops a server left running in test directory name and removes
// the directory.
func (s *Store) removeDir(name string) error {
	dir := s.testDir(name)
	stopDir(filepath.Join(dir, "data"))
	if err := os.RemoveAll(dir); err != nil {
		return errs.Wrap(errs.OSKind(err), err, "cannot remove test cluster %s", name)
	}
	return nil
}

// Holds reports whether test copy name is one of the store's (for tests
// and diagnostics).
func (s *Store) Holds(name string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	_, ok := s.dbs[name]
	return ok
}

// Endpoint is the TCP address of test copy or template cluster name, its
// private socket directory and the database clients use in it.
func (s *Store) Endpoint(name string) pool.Endpoint {
	s.mu.Lock()
	defer s.mu.Unlock()
	if ref, ok := s.dbs[name]; ok {
		select {
		case <-ref.h.ready:
			if inst := ref.h.inst; inst != nil {
				return pool.Endpoint{Host: inst.Host, Port: inst.Port, Database: ref.slot, SocketDir: inst.SocketDir}
			}
		default:
		}
		return pool.Endpoint{Database: ref.slot}
	}
	if inst := s.running[name]; inst != nil {
		return pool.Endpoint{Host: inst.Host, Port: inst.Port, Database: name, SocketDir: inst.SocketDir}
	}
	return pool.Endpoint{Database: name}
}

// Ping checks that the store's directory is there.
func (s *Store) Ping(context.Context) error {
	_, err := os.Stat(s.o.Dir)
	return err
}

// Close stops every cluster still running (templates being initialized,
// test clusters the pools did not drop).
func (s *Store) Close(ctx context.Context) error {
	s.mu.Lock()
	var list []*instance.Instance
	for _, inst := range s.running {
		list = append(list, inst)
	}
	hosts := s.hosts
	s.running, s.hosts, s.dbs = map[string]*instance.Instance{}, map[string]*host{}, map[string]dbRef{}
	s.mu.Unlock()
	for _, h := range hosts {
		<-h.ready
		if h.inst != nil {
			list = append(list, h.inst)
		}
	}
	var wg sync.WaitGroup
	for _, inst := range list {
		wg.Add(1)
		go func() { defer wg.Done(); _ = inst.Stop(ctx, instance.Fast) }()
	}
	wg.Wait()
	return nil
}

// Running returns the pids of the clusters the store runs, template
// clusters by the template's name and test clusters by their directory's
// (a test copy's name, with one slot), for tests and diagnostics.
func (s *Store) Running() map[string]int {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := map[string]int{}
	for n, inst := range s.running {
		out[n] = inst.Pid
	}
	for n, h := range s.hosts {
		select {
		case <-h.ready:
			if h.inst != nil {
				out[n] = h.inst.Pid
			}
		default:
		}
	}
	return out
}

type clusterState struct {
	Epochs    map[string]int                    `json:"epochs"`
	Templates map[string]map[string]pool.Record `json:"templates"` // prefix → hash → record
}

func (s *Store) statePath() string { return filepath.Join(s.o.Dir, "state.json") }

// readState reads state.json; a missing file is an empty state. A file
// that cannot be read or parsed is refused, naming it: reading it as empty
// would forget every template it records and then overwrite it.
func (s *Store) readState() (clusterState, error) {
	st := clusterState{Epochs: map[string]int{}, Templates: map[string]map[string]pool.Record{}}
	b, err := os.ReadFile(s.statePath())
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return st, nil
	case err != nil:
		return st, errs.FromOS(err, s.statePath(), "cannot read the template state")
	}
	if err := json.Unmarshal(b, &st); err != nil {
		return st, errs.Wrap(errs.Internal, err, "the template state file is damaged").WithPath(s.statePath()).
			WithHint("move it aside (for example to %s.damaged) and start again: the clients build the templates it recorded again", s.statePath())
	}
	if st.Epochs == nil {
		st.Epochs = map[string]int{}
	}
	if st.Templates == nil {
		st.Templates = map[string]map[string]pool.Record{}
	}
	return st, nil
}

func (s *Store) writeState(st clusterState) error {
	b, _ := json.MarshalIndent(st, "", "  ")
	if err := fsutil.WriteFileAtomic(s.statePath(), b, 0o644); err != nil {
		return errs.FromOS(err, s.statePath(), "cannot save template state")
	}
	return nil
}

// Recover stops and removes test clusters a previous run left (running or
// not), stops template clusters left running (they were being initialized
// and are dropped by the Manager), and returns the recorded templates.
func (s *Store) Recover(_ context.Context, prefix, testPrefix string, persist bool) ([]pool.Record, int, error) {
	ents, err := os.ReadDir(filepath.Join(s.o.Dir, "tests"))
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return nil, 0, errs.Wrap(errs.OSKind(err), err, "cannot read %s", filepath.Join(s.o.Dir, "tests"))
	}
	for _, e := range ents {
		if strings.HasPrefix(e.Name(), testPrefix) {
			if err := s.removeDir(e.Name()); err != nil {
				return nil, 0, err
			}
		}
	}
	ents, _ = os.ReadDir(filepath.Join(s.o.Dir, "templates"))
	for _, e := range ents {
		stopDir(s.templateData(e.Name()))
	}
	if !persist {
		return nil, 0, nil
	}
	s.stateMu.Lock()
	defer s.stateMu.Unlock()
	st, err := s.readState()
	if err != nil {
		return nil, 0, err
	}
	st.Epochs[prefix]++
	if err := s.writeState(st); err != nil {
		return nil, 0, err
	}
	var recs []pool.Record
	for _, r := range st.Templates[prefix] {
		recs = append(recs, r)
	}
	return recs, st.Epochs[prefix], nil
}

// Save records a template's state in state.json.
func (s *Store) Save(_ context.Context, prefix string, r pool.Record) error {
	s.stateMu.Lock()
	defer s.stateMu.Unlock()
	st, err := s.readState()
	if err != nil {
		return err
	}
	if st.Templates[prefix] == nil {
		st.Templates[prefix] = map[string]pool.Record{}
	}
	st.Templates[prefix][r.Hash] = r
	return s.writeState(st)
}

// Forget removes a template's record from state.json.
func (s *Store) Forget(_ context.Context, prefix, hash string) error {
	s.stateMu.Lock()
	defer s.stateMu.Unlock()
	st, err := s.readState()
	if err != nil {
		return err
	}
	delete(st.Templates[prefix], hash)
	return s.writeState(st)
}

var (
	_ pool.Store     = (*Store)(nil)
	_ pool.Prewarmer = (*Store)(nil)
	_ pool.Batcher   = (*Store)(nil)
)
