// Package instance runs one PostgreSQL server process: initdb, start,
// readiness, stop, connection strings. It launches `postgres` directly (not
// pg_ctl, which waits in 100 ms steps) on a Unix socket in a private
// directory, TCP only when asked, and detects readiness from postmaster.pid
// within a millisecond or two. When pgfork runs as root, initdb and postgres
// run as an unprivileged OS user (see OSUser).
package instance

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/pgfork/pgfork/internal/errs"
	"github.com/pgfork/pgfork/internal/proc"
)

// Profile is a set of server settings.
type Profile int

const (
	// Durable keeps PostgreSQL's defaults: data survives a crash.
	Durable Profile = iota
	// Test is for throw-away clusters: no fsync, no full-page writes,
	// asynchronous commit. A crash may lose or corrupt the cluster.
	Test
)

// TestSettings are the settings of the Test profile.
var TestSettings = map[string]string{
	"fsync":              "off",
	"synchronous_commit": "off",
	"full_page_writes":   "off",
	"shared_buffers":     "128MB",
}

// Config describes how to start a server.
type Config struct {
	BinDir  string   // PostgreSQL bin directory
	Env     []string // extra environment for its binaries
	DataDir string
	User    *OSUser // nil: current user

	// SocketDir is the Unix socket directory; empty: a new private
	// directory under SocketParent, removed on Stop (and, when the server
	// or pgfork dies, by the next CleanSocketDirs).
	SocketDir string
	// SocketParent is where a new private socket directory goes (pgfork's
	// <state>/run); empty, or too long for a socket path: the system temp
	// dir.
	SocketParent string
	// Port; 0 picks 5432 for socket-only servers (the socket dir is private,
	// so there is no clash) and a free port when TCP is on.
	Port int
	// TCP listens on 127.0.0.1 (or Host) as well as the socket.
	TCP  bool
	Host string

	Profile  Profile
	Settings map[string]string // extra -c settings; override the profile's

	// LogFile receives the server's output; empty: <DataDir>/pgfork-server.log.
	LogFile string
	// StartTimeout bounds the wait for readiness (recovery may take long);
	// default 5 minutes.
	StartTimeout time.Duration
	// Background runs the server at background priority (nice 19, the
	// lowest best-effort I/O priority; proc.LowerTree), so that a server
	// doing side work (an upgrade's rehearsal on a clone) leaves the CPU
	// and the disk to the servers that serve. Best effort: a failure to
	// lower it does not stop the start.
	Background bool
}

// Instance is a running (or attached) server.
type Instance struct {
	DataDir   string
	Pid       int
	Port      int
	SocketDir string
	Host      string // TCP host, empty when socket-only
	LogFile   string
	User      *OSUser
	// Password, when set (SetPassword), is put in TCP URLs.
	Password string

	// StartTime is the server process's start time (proc.StartTime: clock
	// ticks since boot), recorded so that a later Attach can tell the
	// server pgfork started from a process that reused its pid.
	StartTime uint64

	ownSocketDir bool
	done         chan struct{} // closed when our child exits; nil when attached
	child        *os.Process   // our child (signalled through its pidfd)
	handle       *proc.Handle  // attached server: a verified pidfd
}

// LogFileName is the default server log file inside the data directory; the
// pgdata filters leave it out of copies.
const LogFileName = "pgfork-server.log"

// Start launches the server and waits until it accepts connections.
// On failure it returns the last lines of the server log.
func Start(ctx context.Context, cfg Config) (*Instance, error) {
	if _, err := os.Stat(filepath.Join(cfg.DataDir, "PG_VERSION")); err != nil {
		return nil, errs.New(errs.Usage, "not a PostgreSQL data directory (no PG_VERSION)").WithPath(cfg.DataDir).
			WithHint("create one with initdb, or check the path")
	}
	if pid, ok := livePid(cfg.DataDir); ok {
		return nil, errs.New(errs.Busy, "a server (pid %d) is already running on this data directory", pid).
			WithPath(cfg.DataDir).WithHint("stop it first, or connect to it")
	}
	if cfg.LogFile == "" {
		cfg.LogFile = filepath.Join(cfg.DataDir, LogFileName)
	}
	if cfg.StartTimeout == 0 {
		cfg.StartTimeout = 5 * time.Minute
	}
	inst := &Instance{DataDir: cfg.DataDir, User: cfg.User, LogFile: cfg.LogFile, SocketDir: cfg.SocketDir}
	if inst.SocketDir == "" {
		CleanSocketDirs(cfg.SocketParent)
		d, err := newSocketDir(cfg.SocketParent)
		if err != nil {
			return nil, errs.Wrap(errs.Internal, err, "cannot create socket directory")
		}
		inst.SocketDir, inst.ownSocketDir = d, true
	}
	if err := cfg.User.MkdirOwned(inst.SocketDir, 0o700); err != nil {
		inst.cleanup()
		return nil, errs.FromOS(err, inst.SocketDir, "cannot prepare socket directory")
	}
	var lastErr error
	for attempt := 0; attempt < 8; attempt++ {
		port := cfg.Port
		if port == 0 {
			port = 5432
			if cfg.TCP {
				p, err := FreePort(cfg.host())
				if err != nil {
					inst.cleanup()
					return nil, err
				}
				port = p
			}
		}
		err := inst.launch(ctx, cfg, port)
		if err == nil {
			return inst, nil
		}
		lastErr = err
		// Another process took the port between our check and the bind:
		// pick another one, unless the user chose it.
		if !cfg.TCP || cfg.Port != 0 || !errors.Is(err, errPortTaken) {
			break
		}
	}
	inst.cleanup()
	return nil, lastErr
}

func (c Config) host() string {
	if c.Host != "" {
		return c.Host
	}
	return "127.0.0.1"
}

var errPortTaken = errors.New("port in use")

func (inst *Instance) launch(ctx context.Context, cfg Config, port int) error {
	settings := map[string]string{}
	if cfg.Profile == Test {
		for k, v := range TestSettings {
			settings[k] = v
		}
	}
	for k, v := range cfg.Settings {
		settings[k] = v
	}
	listen := ""
	if cfg.TCP {
		listen = cfg.host()
		inst.Host = listen
	}
	settings["listen_addresses"] = listen
	settings["unix_socket_directories"] = inst.SocketDir
	settings["port"] = strconv.Itoa(port)
	keys := make([]string, 0, len(settings))
	for k := range settings {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	args := []string{"-D", cfg.DataDir}
	for _, k := range keys {
		args = append(args, "-c", k+"="+settings[k])
	}
	logf, err := OpenAppend(cfg.LogFile, cfg.User)
	if err != nil {
		return err
	}
	defer logf.Close()
	logStart, _ := logf.Seek(0, 2)
	// The server must outlive this context (pgfork up returns while it runs),
	// so it is not started with ctx; ctx only bounds the wait below.
	cmd := cfg.User.Command(context.Background(), cfg.Env, filepath.Join(cfg.BinDir, "postgres"), args...)
	cmd.Stdout, cmd.Stderr = logf, logf
	if cmd.SysProcAttr == nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{}
	}
	cmd.SysProcAttr.Setsid = true // not killed by the terminal's Ctrl-C
	if err := cmd.Start(); err != nil {
		return errs.Wrap(errs.Internal, err, "cannot run postgres").WithPath(cmd.Path)
	}
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); close(done) }()
	inst.Pid, inst.Port, inst.done, inst.child = cmd.Process.Pid, port, done, cmd.Process
	inst.StartTime = proc.StartTime(inst.Pid)
	if cfg.Background {
		// Before the postmaster starts its first process (it reads its
		// configuration and sets up shared memory first), so that they
		// inherit it; once more when ready for any it started meanwhile.
		_ = proc.LowerTree(inst.Pid)
	}

	deadline := time.NewTimer(cfg.StartTimeout)
	defer deadline.Stop()
	tick := time.NewTicker(time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case <-done:
			msg := readFrom(cfg.LogFile, logStart)
			if strings.Contains(msg, "could not bind") || strings.Contains(msg, "Address already in use") {
				return fmt.Errorf("%w: %s", errPortTaken, tail(msg, 5))
			}
			return errs.New(errs.Internal, "postgres exited during start; server log:%s", tail(msg, 15)).
				WithPath(cfg.DataDir).WithHint("full log: %s", cfg.LogFile)
		case <-ctx.Done():
			_ = inst.signal(syscall.SIGQUIT)
			<-done
			return errs.Wrap(errs.Interrupted, ctx.Err(), "start interrupted")
		case <-deadline.C:
			_ = inst.signal(syscall.SIGQUIT)
			<-done
			return errs.New(errs.Internal, "postgres did not become ready within %s; server log:%s",
				cfg.StartTimeout, tail(readFrom(cfg.LogFile, logStart), 15)).WithPath(cfg.DataDir)
		case <-tick.C:
			if pf, err := ReadPidFile(cfg.DataDir); err == nil && pf.Pid == inst.Pid && pf.Status == "ready" {
				if cfg.Background {
					_ = proc.LowerTree(inst.Pid)
				}
				return nil
			}
		}
	}
}

func readFrom(path string, off int64) string {
	b, err := os.ReadFile(path)
	if err != nil || off > int64(len(b)) {
		return ""
	}
	return string(b[off:])
}

// FreePort finds a TCP port of host that is free now. Start retries with
// another port if the server loses the race for it, so concurrent callers
// are safe; other callers hold the port only as a choice.
func FreePort(host string) (int, error) {
	l, err := net.Listen("tcp", net.JoinHostPort(host, "0"))
	if err != nil {
		return 0, errs.Wrap(errs.Internal, err, "cannot find a free TCP port on %s", host)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// PidFile is the content of postmaster.pid.
type PidFile struct {
	Pid       int
	DataDir   string
	Started   time.Time
	Port      int
	SocketDir string
	Listen    string
	Status    string // "starting", "ready", "stopping", "standby"
}

// ReadPidFile reads <dataDir>/postmaster.pid.
func ReadPidFile(dataDir string) (*PidFile, error) {
	b, err := os.ReadFile(filepath.Join(dataDir, "postmaster.pid"))
	if err != nil {
		return nil, err
	}
	lines := strings.Split(string(b), "\n")
	pf := &PidFile{}
	get := func(i int) string {
		if i < len(lines) {
			return strings.TrimSpace(lines[i])
		}
		return ""
	}
	pf.Pid, _ = strconv.Atoi(get(0))
	pf.DataDir = get(1)
	if t, err := strconv.ParseInt(get(2), 10, 64); err == nil {
		pf.Started = time.Unix(t, 0)
	}
	pf.Port, _ = strconv.Atoi(get(3))
	pf.SocketDir = get(4)
	pf.Listen = get(5)
	pf.Status = get(7)
	if pf.Pid == 0 {
		return nil, fmt.Errorf("postmaster.pid in %s is incomplete", dataDir)
	}
	return pf, nil
}

func livePid(dataDir string) (int, bool) {
	pf, err := ReadPidFile(dataDir)
	if err != nil {
		return 0, false
	}
	return pf.Pid, proc.Alive(pf.Pid)
}

// StopMode is how a server is shut down.
type StopMode int

const (
	// Fast rolls back sessions and shuts down cleanly (SIGINT).
	Fast StopMode = iota
	// Smart waits for sessions to end (SIGTERM).
	Smart
	// Immediate aborts without a checkpoint; the next start recovers (SIGQUIT).
	Immediate
)

func (m StopMode) signal() syscall.Signal {
	switch m {
	case Smart:
		return syscall.SIGTERM
	case Immediate:
		return syscall.SIGQUIT
	}
	return syscall.SIGINT
}

// signal signals the server: our own child through its os.Process (a
// pidfd), an attached server through the pidfd Attach verified. Nothing
// else is ever signalled.
func (inst *Instance) signal(sig syscall.Signal) error {
	switch {
	case inst.child != nil:
		if err := inst.child.Signal(sig); err != nil && !errors.Is(err, os.ErrProcessDone) {
			return err
		}
		return nil
	case inst.handle != nil:
		return inst.handle.Signal(sig)
	}
	return errs.New(errs.Internal, "no verified handle on server pid %d", inst.Pid)
}

func (inst *Instance) exited() bool {
	if inst.done != nil {
		select {
		case <-inst.done:
			return true
		default:
			return false
		}
	}
	return inst.handle == nil || !inst.handle.Alive()
}

// Stop shuts the server down and waits for it to exit. If ctx ends first it
// escalates to an immediate shutdown, then SIGKILL.
func (inst *Instance) Stop(ctx context.Context, mode StopMode) error {
	defer inst.cleanup()
	if inst.exited() {
		return nil
	}
	if err := inst.signal(mode.signal()); err != nil {
		return errs.Wrap(errs.OSKind(err), err, "cannot signal postgres (pid %d)", inst.Pid)
	}
	tick := time.NewTicker(time.Millisecond)
	defer tick.Stop()
	escalated := false
	for !inst.exited() {
		select {
		case <-tick.C:
		case <-ctx.Done():
			if escalated {
				_ = inst.signal(syscall.SIGKILL)
				return errs.Wrap(errs.Interrupted, ctx.Err(), "server (pid %d) killed", inst.Pid)
			}
			_ = inst.signal(syscall.SIGQUIT)
			escalated = true
			ctx = context.Background()
			var cancel context.CancelFunc
			ctx, cancel = context.WithTimeout(ctx, 10*time.Second)
			defer cancel()
		}
	}
	return nil
}

func (inst *Instance) cleanup() {
	if inst.handle != nil {
		_ = inst.handle.Close()
		inst.handle = nil
	}
	if inst.ownSocketDir && inst.SocketDir != "" {
		_ = os.RemoveAll(inst.SocketDir)
	}
}

// ConnString returns a libpq URL for database db as the superuser user
// (default "postgres"), over TCP when the server listens on it, else over
// the Unix socket.
func (inst *Instance) ConnString(user, db string) string {
	if user == "" {
		user = "postgres"
	}
	if db == "" {
		db = "postgres"
	}
	u := url.URL{Scheme: "postgresql", User: url.User(user), Path: "/" + db}
	if inst.Host != "" {
		if inst.Password != "" {
			u.User = url.UserPassword(user, inst.Password)
		}
		u.Host = net.JoinHostPort(inst.Host, strconv.Itoa(inst.Port))
		u.RawQuery = "sslmode=disable"
	} else {
		q := url.Values{}
		q.Set("host", inst.SocketDir)
		q.Set("port", strconv.Itoa(inst.Port))
		u.RawQuery = EncodeQuery(q)
	}
	return u.String()
}
