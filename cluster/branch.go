package cluster

import (
	"context"
	"os"
	"path/filepath"
	"strconv"
	"syscall"
	"time"

	"github.com/pgfork/pgfork/instance"
	"github.com/pgfork/pgfork/internal/errs"
	"github.com/pgfork/pgfork/internal/statedir"
	"github.com/pgfork/pgfork/pgdata"
)

// Kinds of branches: clusters whose data directory was made elsewhere and
// stays there.
const (
	KindRestore = "restore" // made by `pgfork restore --start`
	KindClone   = "clone"   // made by `pgfork clone --start`
)

// CreateBranch claims name for a branch: a cluster whose data directory
// was made elsewhere (dataDir, e.g. by `pgfork restore`) and stays there.
// The registry's data entry is a symlink to it, so List, Reap and Down
// find its server like any other. Reap (a dead server) only forgets a
// branch; Down removes its data directory too unless told to keep it.
func CreateBranch(ctx context.Context, lay statedir.Layout, name, dataDir string) (*Pending, error) {
	abs, err := filepath.Abs(dataDir)
	if err != nil {
		return nil, errs.Wrap(errs.Usage, err, "bad data directory path").WithPath(dataDir)
	}
	p, err := Create(ctx, lay, name)
	if err != nil {
		return nil, err
	}
	if err := os.Symlink(abs, p.DataDir()); err != nil {
		p.lock.Unlock()
		_ = os.RemoveAll(p.Dir)
		return nil, errs.FromOS(err, p.Dir, "cannot record the branch")
	}
	return p, nil
}

// BranchOptions describe a branch to start with StartBranch.
type BranchOptions struct {
	Name      string // registry name; BranchName picks one when empty
	DataDir   string // the data directory, made elsewhere; it stays there
	Kind      string // KindRestore, KindClone
	Source    string // what it was made from, for `pgfork ls`
	BinDir    string // PostgreSQL build of the data directory's major
	Env       []string
	PGVersion string
	PGMajor   int
	User      *instance.OSUser // nil: the current user
	Port      int              // 0: 5432 on the private socket (a free one with TCP)
	TCP       bool
	Settings  map[string]string // extra server settings (-c); archive_mode is always off
	LogFile   string            // default: the data directory's pgfork-server.log (instance.LogFileName)
	// StartTimeout bounds recovery and start (default 30 min: a branch may
	// replay a lot of WAL).
	StartTimeout time.Duration
}

// Branch is a started branch.
type Branch struct {
	Name      string `json:"name"`
	URL       string `json:"url"`
	Pid       int    `json:"pid"`
	Port      int    `json:"port"`
	SocketDir string `json:"socket_dir"`
	LogFile   string `json:"log_file"`
	DataDir   string `json:"data_dir"`
}

// StartBranch starts o.DataDir as a branch with durable settings: the name
// claimed first (so two starts never share one), the server run as o.User
// on a private socket directory under <state>/run, and recorded in the
// registry so that `pgfork ls` lists it and `pgfork down NAME` stops and
// removes it. On failure nothing is recorded and the data directory is
// left as it was given.
func StartBranch(ctx context.Context, lay statedir.Layout, o BranchOptions) (*Branch, error) {
	pending, err := CreateBranch(ctx, lay, BranchName(o.DataDir, o.Name), o.DataDir)
	if err != nil {
		return nil, err
	}
	socketDir, err := SocketDirFor(lay, pending.Name)
	if err != nil {
		pending.Abort("")
		return nil, errs.FromOS(err, lay.Run(), "cannot create the socket directory")
	}
	// The log lives in the data directory by default: a directory the
	// server's user owns, where instance.Start opens it with that user's
	// rights. (It used to be DST.log beside DST, in a directory that may be
	// root's, where root opened and chowned it by path: issue 19, F20b.)
	log := o.LogFile
	if log == "" {
		log = filepath.Join(o.DataDir, instance.LogFileName)
	}
	timeout := o.StartTimeout
	if timeout == 0 {
		timeout = 30 * time.Minute
	}
	// Every branch, clone, restore and standby starts here from data
	// pgfork did not write (or that a server's superuser could have
	// changed): the settings of pgdata.ForeignSettings that would load
	// code, run commands or use files outside the data directory are reset
	// on the command line, which wins over every configuration file
	// (issue 57, rule 4). o.Settings, pgfork's own, win over them (a
	// restore's restore_command). A branch never archives: its source's
	// archive_command (or library) would write the branch's WAL where the
	// source keeps its backups, over the source's own segments (issue 19,
	// F21).
	settings, err := pgdata.ForeignOverrides(o.DataDir)
	if err != nil {
		pending.Abort(socketDir)
		return nil, err
	}
	for k, v := range o.Settings {
		settings[k] = v
	}
	settings["archive_mode"] = "off"
	var dev, ino uint64
	if fi, err := os.Lstat(o.DataDir); err == nil {
		if st, ok := fi.Sys().(*syscall.Stat_t); ok && fi.IsDir() {
			dev, ino = uint64(st.Dev), uint64(st.Ino)
		}
	}
	inst, err := instance.Start(ctx, instance.Config{BinDir: o.BinDir, Env: o.Env, DataDir: o.DataDir,
		User: o.User, SocketDir: socketDir, Port: o.Port, TCP: o.TCP, Profile: instance.Durable, Settings: settings,
		LogFile: log, StartTimeout: timeout})
	if err != nil {
		pending.Abort(socketDir)
		return nil, errs.Wrap(errs.KindOf(err), err, "%s did not start", o.DataDir).
			WithHint("see %s; the data directory is kept", log)
	}
	b := &Branch{Name: pending.Name, URL: inst.ConnString("", ""), Pid: inst.Pid, Port: inst.Port, SocketDir: inst.SocketDir,
		LogFile: log, DataDir: o.DataDir}
	runAs := ""
	if o.User != nil {
		runAs = o.User.Name
	}
	info := Info{URL: b.URL, Host: inst.Host, Port: inst.Port, SocketDir: inst.SocketDir, DataDir: o.DataDir, Pid: inst.Pid,
		PGVersion: o.PGVersion, PGMajor: o.PGMajor, BinDir: o.BinDir, RunAs: runAs, Kind: o.Kind, Source: o.Source,
		DataDev: dev, DataIno: ino}
	if err := pending.Commit(info); err != nil {
		_ = inst.Stop(context.WithoutCancel(ctx), instance.Fast)
		pending.Abort(socketDir)
		return nil, err
	}
	return b, nil
}

// BranchName is the registry name of a branch started on dataDir: name
// when given, else the data directory's base name when it is a valid
// cluster name, else a random one.
func BranchName(dataDir, name string) string {
	if name != "" {
		return name
	}
	if b := filepath.Base(dataDir); ValidateName(b) == nil {
		return b
	}
	return NewName()
}

// CheckBranchName fails with errs.Exists when the branch's name is taken
// (checked before a long restore or clone, not only after it).
func CheckBranchName(lay statedir.Layout, dataDir, name string) error {
	n := BranchName(dataDir, name)
	if err := ValidateName(n); err != nil {
		return err
	}
	if _, err := Get(lay, n); err == nil {
		return errs.New(errs.Exists, "a cluster named %q already exists", n).
			WithCLI("pass --name with another name, or remove it with `pgfork down %s`", n)
	}
	return nil
}

// PortAuto is what ParsePort takes for "a free port".
const PortAuto = "auto"

// ParsePort is the one place a branch's port is chosen (clone and restore
// alike): "" is 0 (the default: 5432 on the branch's private socket, a
// free one with TCP), PortAuto a TCP port of 127.0.0.1 free now, else a
// port number from 1 to 65535.
func ParsePort(s string) (int, error) {
	switch s {
	case "":
		return 0, nil
	case PortAuto:
		return instance.FreePort("127.0.0.1")
	}
	n, err := strconv.Atoi(s)
	if err != nil || n < 1 || n > 65535 {
		return 0, errs.New(errs.Usage, "bad port %q", s).WithHint(`give a port between 1 and 65535, or "auto"`).
			WithCLI("--port N or --port auto")
	}
	return n, nil
}
