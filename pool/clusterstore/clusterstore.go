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
	"strconv"
	"strings"
	"sync"
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
	// about 1,300, each copy cheaper by about as much.
	Lean bool
	// OwnName renames the template's database in each test cluster to the
	// test copy's name (as the copies of databases in one server are
	// named); otherwise clients get the template's database name.
	OwnName bool
	// Warm connects to the test database once a test cluster has started,
	// before it is handed out: the first connection of a fresh server
	// builds the catalog caches (pg_internal.init), and the test does not
	// wait for it.
	Warm bool
}

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
	running map[string]*instance.Instance // template and test clusters by name
	source  map[string]string             // test cluster → its template (the database name in it)
	stateMu sync.Mutex
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
	return &Store{o: o, running: map[string]*instance.Instance{}, source: map[string]string{}}, nil
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
	o := clone.Options{Sync: clone.SyncNone, Filter: pgdata.Filter}
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
	admin := "postgres"
	if s.o.Lean {
		admin = "template1"
	}
	c, err := pgx.Connect(ctx, superuserURL(inst, admin))
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
			if db == name {
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
	if err := inst.Stop(ctx, instance.Fast); err != nil {
		return err
	}
	cd, err := pgdata.ReadControlData(ctx, s.o.PG.BinDir, s.templateData(name), s.o.PG.Env())
	if err == nil && !strings.Contains(cd.State, "shut down") {
		return errs.New(errs.Internal, "template cluster %s did not shut down cleanly (%s)", name, cd.State)
	}
	return nil
}

// DropTemplate stops the template's cluster, if it runs, and removes it.
func (s *Store) DropTemplate(_ context.Context, name string) error {
	if err := cluster.ValidateName(name); err != nil {
		return err
	}
	s.stopRunning(name)
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
	delete(s.source, name)
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

// Create copies the (stopped) cluster of template and starts it as test
// cluster name.
func (s *Store) Create(ctx context.Context, name, tmpl, _ string) (string, error) {
	if err := cluster.ValidateName(name); err != nil {
		return "", err
	}
	dir := s.testDir(name)
	stopDir(filepath.Join(dir, "data"))
	if err := os.RemoveAll(dir); err != nil {
		return "cluster", errs.Wrap(errs.OSKind(err), err, "cannot remove %s", dir)
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "cluster", errs.Wrap(errs.OSKind(err), err, "cannot create %s", dir)
	}
	if _, err := clone.Copy(ctx, s.templateData(tmpl), filepath.Join(dir, "data"), s.copyOptions()); err != nil {
		_ = os.RemoveAll(dir)
		return "cluster", err
	}
	inst, err := s.start(ctx, filepath.Join(dir, "data"))
	if err != nil {
		_ = os.RemoveAll(dir)
		return "cluster", err
	}
	if s.o.Warm || s.o.OwnName {
		if err := s.prepare(ctx, inst, tmpl, name); err != nil {
			_ = inst.Stop(context.WithoutCancel(ctx), instance.Immediate)
			_ = os.RemoveAll(dir)
			return "cluster", err
		}
	}
	s.mu.Lock()
	s.running[name], s.source[name] = inst, tmpl
	s.mu.Unlock()
	return "cluster", nil
}

// prepare readies test cluster name just started from template tmpl:
// with OwnName its database is renamed to name, with Warm it is connected
// to once (the catalog caches a first connection builds are then there
// for the test's).
func (s *Store) prepare(ctx context.Context, inst *instance.Instance, tmpl, name string) error {
	db := tmpl
	if s.o.OwnName {
		c, err := pgx.Connect(ctx, superuserURL(inst, "template1"))
		if err != nil {
			return errs.Wrap(errs.Internal, err, "cannot connect to the test cluster on port %d", inst.Port)
		}
		_, err = c.Exec(ctx, "ALTER DATABASE "+pgx.Identifier{tmpl}.Sanitize()+" RENAME TO "+pgx.Identifier{name}.Sanitize())
		_ = c.Close(ctx)
		if err != nil {
			return errs.Wrap(errs.Internal, err, "cannot rename database %s to %s in its test cluster", tmpl, name)
		}
		db = name
	}
	if !s.o.Warm {
		return nil
	}
	c, err := pgx.Connect(ctx, superuserURL(inst, db))
	if err != nil {
		return errs.Wrap(errs.Internal, err, "cannot connect to the test cluster on port %d", inst.Port)
	}
	return c.Close(ctx)
}

// Drop stops test cluster name (immediately: its sessions end) and removes
// it.
func (s *Store) Drop(_ context.Context, name string) error {
	if err := cluster.ValidateName(name); err != nil {
		return err
	}
	s.stopRunning(name)
	dir := s.testDir(name)
	stopDir(filepath.Join(dir, "data"))
	if err := os.RemoveAll(dir); err != nil {
		return errs.Wrap(errs.OSKind(err), err, "cannot remove test cluster %s", name)
	}
	return nil
}

// Endpoint is the TCP address of cluster name, its private socket
// directory and the database clients use in it (the template's).
func (s *Store) Endpoint(name string) pool.Endpoint {
	s.mu.Lock()
	defer s.mu.Unlock()
	db := name
	if t, ok := s.source[name]; ok && !s.o.OwnName {
		db = t
	}
	if inst := s.running[name]; inst != nil {
		return pool.Endpoint{Host: inst.Host, Port: inst.Port, Database: db, SocketDir: inst.SocketDir}
	}
	return pool.Endpoint{Database: db}
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
	list := s.running
	s.running = map[string]*instance.Instance{}
	s.source = map[string]string{}
	s.mu.Unlock()
	var wg sync.WaitGroup
	for _, inst := range list {
		wg.Add(1)
		go func() { defer wg.Done(); _ = inst.Stop(ctx, instance.Fast) }()
	}
	wg.Wait()
	return nil
}

// Running returns the pids of the clusters the store runs (for tests and
// diagnostics).
func (s *Store) Running() map[string]int {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := map[string]int{}
	for n, inst := range s.running {
		out[n] = inst.Pid
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
			if err := s.Drop(context.Background(), e.Name()); err != nil {
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

var _ pool.Store = (*Store)(nil)
