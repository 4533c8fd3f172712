// Package up starts a throw-away PostgreSQL cluster from a cached
// template: the orchestration of `pgfork up` (claim the name, find
// PostgreSQL, get the template, claim a spare or copy, start, register,
// ask for a refill), with everything half-built rolled back on failure.
// The CLI parses flags, calls Up and prints the Result.
package up

import (
	"context"
	"fmt"
	"time"

	"github.com/pgfork/pgfork/clone"
	"github.com/pgfork/pgfork/cluster"
	"github.com/pgfork/pgfork/instance"
	"github.com/pgfork/pgfork/internal/errs"
	"github.com/pgfork/pgfork/internal/statedir"
	"github.com/pgfork/pgfork/pgbin"
	"github.com/pgfork/pgfork/template"
)

// Options shape one Up call.
type Options struct {
	// Layout is pgfork's state directory.
	Layout statedir.Layout
	// FindPG finds the PostgreSQL build to run (the CLI caches its answer
	// between runs); it is called after the name is claimed.
	FindPG func() (pgbin.Installation, error)
	// RunAs names the OS user PostgreSQL runs as when pgfork runs as root
	// ("" means postgres; see instance.ResolveUser).
	RunAs string
	// Setup are SQL files or directories applied to the template, in
	// order; SetupCmd a shell command run against it.
	Setup    []string
	SetupCmd string
	// Name of the cluster; "" generates one (pg-XXXXXXXX).
	Name string
	// TCP also listens on 127.0.0.1 on a free port, password only.
	TCP bool
	// TTL and ParentPid bound the cluster's life (0: no bound).
	TTL       time.Duration
	ParentPid int
	// Superuser is the database superuser's name (default postgres).
	Superuser string
	// Spares is how many spare copies of the template to keep ready, 0 to
	// template.MaxSpares; 0 copies on every call.
	Spares int
	// Refill is called, after the cluster is registered, when Spares > 0:
	// it should make the template's spares in the background (the CLI
	// starts a detached pgfork at background priority). Nil: no refill. An error is
	// reported through OnInfo and does not fail Up.
	Refill func(Refill) error
	// OnInfo is told about progress and warnings (template build steps,
	// a spare that could not be claimed); nil: silent.
	OnInfo func(msg string)
}

// Refill asks for the spares of template Key to be made in the background.
type Refill struct {
	Layout statedir.Layout
	Key    string
	Spares int
	User   *instance.OSUser // nil: the current user
}

// Settings are added to the test profile for clusters of Up.
// shared_buffers 32MB (instead of 128MB) takes about 12% off the CPU time
// of a postmaster start (measured: 30 ms instead of 34 ms, minimum of 8)
// and reserves 96 MB less per throw-away cluster; test databases are small.
var Settings = map[string]string{"shared_buffers": "32MB"}

// Result is the cluster Up started (what `pgfork up --json` prints).
type Result struct {
	Name        string `json:"name"`
	URL         string `json:"url"`
	Host        string `json:"host,omitempty"`
	Port        int    `json:"port"`
	SocketDir   string `json:"socket_dir"`
	DataDir     string `json:"data_dir"`
	Pid         int    `json:"pid"`
	PGVersion   string `json:"pg_version"`
	TemplateKey string `json:"template_key"`
	Built       bool   `json:"template_built"`
	// FromSpare says the data directory was a spare copy made in the
	// background (no copy on this call); Spare is the spare's name.
	FromSpare bool             `json:"from_spare"`
	Spare     string           `json:"spare,omitempty"`
	Method    map[string]int64 `json:"copy_methods,omitempty"`
	Expires   *time.Time       `json:"expires,omitempty"`
	ParentPid int              `json:"parent_pid,omitempty"`
	// Timings are the steps' durations in microseconds (total included).
	Timings map[string]int64 `json:"timings_us"`
}

// Reap stops and removes forgotten clusters (expired, orphaned, dead),
// leftover spares and unused socket directories, telling onInfo (when not
// nil) what it removed and what it could not. Up, ls and down run it first.
func Reap(ctx context.Context, lay statedir.Layout, onInfo func(string)) {
	say := func(format string, args ...any) {
		if onInfo != nil {
			onInfo(fmt.Sprintf(format, args...))
		}
	}
	done, err := cluster.Reap(ctx, lay)
	if err != nil {
		say("pgfork: warning: %v", err)
	}
	template.CleanSpares(lay)
	instance.CleanSocketDirs(lay.Run())
	for _, r := range done {
		say("removed cluster %s: %s", r.Name, r.Reason)
	}
}

// Up starts a new cluster, after reaping forgotten ones. The name is claimed first (a taken name fails
// before any work); on any later failure the claim, the copied data
// directory and its socket directory are removed.
func Up(ctx context.Context, o Options) (*Result, error) {
	info := func(format string, args ...any) {
		if o.OnInfo != nil {
			o.OnInfo(fmt.Sprintf(format, args...))
		}
	}
	if o.Superuser == "" {
		o.Superuser = "postgres"
	}
	if o.Spares < 0 || o.Spares > template.MaxSpares {
		return nil, errs.New(errs.Usage, "%d spares is out of range", o.Spares).WithHint("keep 0 to %d spares", template.MaxSpares)
	}
	t0 := time.Now()
	timings := map[string]int64{}
	lap := func(k string, since time.Time) { timings[k] = time.Since(since).Microseconds() }
	lay := o.Layout
	// Refills are background work: they pause until our server is ready,
	// neither copying nor removing a cancelled copy meanwhile, so a miss
	// (we copy the template ourselves) is never slower than no spares.
	releaseFg := template.Foreground(ctx, lay)
	defer func() { releaseFg() }()
	Reap(ctx, lay, o.OnInfo)

	// Claim the name first: a taken name fails before any work.
	var (
		pending *cluster.Pending
		err     error
	)
	if o.Name != "" {
		pending, err = cluster.Create(ctx, lay, o.Name)
	} else {
		for i := 0; i < 5; i++ {
			pending, err = cluster.Create(ctx, lay, cluster.NewName())
			if errs.KindOf(err) != errs.Exists {
				break
			}
		}
	}
	if err != nil {
		return nil, err
	}
	socketDir := ""
	ok := false
	defer func() {
		if !ok {
			pending.Abort(socketDir)
		}
	}()

	t := time.Now()
	find := o.FindPG
	if find == nil {
		find = func() (pgbin.Installation, error) { return pgbin.Find(pgbin.Options{StateDir: lay.Root}, 0) }
	}
	pg, err := find()
	if err != nil {
		return nil, err
	}
	user, err := instance.ResolveUser(o.RunAs)
	if err != nil {
		return nil, err
	}
	lap("find_pg", t)

	t = time.Now()
	tmpl, err := template.Get(ctx, lay, template.Options{
		PG: pg, Init: instance.InitOptions{Superuser: o.Superuser}, User: user,
		Setup: o.Setup, SetupCmd: o.SetupCmd,
		OnProgress: func(s string) {
			if o.OnInfo != nil {
				o.OnInfo(s)
			}
		},
	})
	if err != nil {
		return nil, err
	}
	lap("template", t)

	// A spare copy, if one is ready: one rename instead of a copy.
	var owner *clone.Owner
	if user != nil {
		owner = user.Owner()
	}
	spare := ""
	if o.Spares > 0 {
		t = time.Now()
		spare, err = tmpl.ClaimSpare(lay, pending.DataDir())
		if err != nil {
			info("pgfork: warning: %v; copying the template instead", err)
		}
		lap("claim_spare", t)
	}
	sum := &clone.Summary{}
	if spare == "" {
		t = time.Now()
		sum, err = clone.Copy(ctx, tmpl.DataDir(), pending.DataDir(), clone.Options{Sync: clone.SyncNone, Owner: owner})
		if err != nil {
			tmpl.Release()
			return nil, err
		}
		lap("copy", t)
	}
	tmpl.Release()

	if o.TCP {
		// TCP is open to every local user: password only (scram);
		// trust stays on the private socket.
		if err := instance.WritePasswordHBA(pending.DataDir(), user); err != nil {
			return nil, err
		}
	}

	t = time.Now()
	socketDir, err = cluster.SocketDirFor(lay, pending.Name)
	if err != nil {
		return nil, errs.Wrap(errs.OSKind(err), err, "cannot create a socket directory")
	}
	inst, err := instance.Start(ctx, instance.Config{
		BinDir: pg.BinDir, Env: pg.Env(), DataDir: pending.DataDir(), User: user,
		SocketDir: socketDir, TCP: o.TCP, Profile: instance.Test, Settings: Settings,
	})
	if err != nil {
		return nil, err
	}
	if o.TCP {
		if err := inst.SetPassword(ctx, o.Superuser, instance.NewPassword()); err != nil {
			return nil, err
		}
	}
	lap("start", t)
	releaseFg()
	releaseFg = func() {}

	url := inst.ConnString(o.Superuser, "postgres")
	ci := cluster.Info{
		URL: url, Host: inst.Host, Port: inst.Port, SocketDir: inst.SocketDir, DataDir: pending.DataDir(),
		Pid: inst.Pid, PGVersion: pg.Version, PGMajor: pg.Major, BinDir: pg.BinDir, Template: tmpl.Key,
		Created: t0, TTL: o.TTL, ParentPid: o.ParentPid,
	}
	if user != nil {
		ci.RunAs = user.Name
	}
	if err := pending.Commit(ci); err != nil {
		return nil, err
	}
	ok = true
	if o.Spares > 0 && o.Refill != nil {
		// Replace the spare (or make the first one) in the background.
		t = time.Now()
		if err := o.Refill(Refill{Layout: lay, Key: tmpl.Key, Spares: o.Spares, User: user}); err != nil {
			info("pgfork: warning: cannot start the spare refill: %v", err)
		}
		lap("spawn_refill", t)
	}
	lap("total", t0)
	res := &Result{
		Name: pending.Name, URL: url, Host: inst.Host, Port: inst.Port, SocketDir: inst.SocketDir,
		DataDir: pending.DataDir(), Pid: inst.Pid, PGVersion: pg.Version, TemplateKey: tmpl.Key,
		Built: tmpl.Built, FromSpare: spare != "", Spare: spare, ParentPid: o.ParentPid, Timings: timings, Method: map[string]int64{},
	}
	for m, n := range sum.Methods {
		res.Method[string(m)] = n
	}
	if o.TTL > 0 {
		e := ci.Expires()
		res.Expires = &e
	}
	return res, nil
}
