// Package cluster is the registry of the clusters pgfork started (`pgfork
// up`): their names, data and socket directories, ports, server pids, URLs,
// and the limits that keep a forgotten test cluster from living forever (a
// TTL and a parent process to outlive).
//
// On disk, one directory per cluster:
//
//	<state>/clusters/<name>/data          the data directory
//	<state>/clusters/<name>/cluster.json  Info, written once the server is ready
//	<state>/run/<name>/                   its private Unix socket directory
//	<state>/locks/cluster-<name>.lock     held while it is created or removed
//
// A cluster directory without cluster.json whose lock is free is the
// leftover of a crashed `pgfork up`; Reap removes it, and with it clusters
// whose TTL expired, whose parent process died, or whose server died.
package cluster

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/user"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/pgfork/pgfork/clone"
	"github.com/pgfork/pgfork/instance"
	"github.com/pgfork/pgfork/internal/errs"
	"github.com/pgfork/pgfork/internal/flock"
	"github.com/pgfork/pgfork/internal/fsutil"
	"github.com/pgfork/pgfork/internal/proc"
	"github.com/pgfork/pgfork/internal/safefs"
	"github.com/pgfork/pgfork/internal/statedir"
)

const (
	infoFile   = "cluster.json"
	dataSubdir = "data"
)

// Info is what cluster.json records about a cluster.
type Info struct {
	Name      string    `json:"name"`
	URL       string    `json:"url"`
	Host      string    `json:"host,omitempty"` // TCP host; empty when socket-only
	Port      int       `json:"port"`
	SocketDir string    `json:"socket_dir"`
	DataDir   string    `json:"data_dir"`
	Pid       int       `json:"pid"`
	PGVersion string    `json:"pg_version"`
	PGMajor   int       `json:"pg_major"`
	BinDir    string    `json:"bin_dir"`
	Template  string    `json:"template_key"`
	RunAs     string    `json:"run_as,omitempty"`
	Created   time.Time `json:"created"`
	// Kind is what made the cluster: empty for `pgfork up`, "restore" for
	// a branch started by `pgfork restore --start` (see branch.go).
	Kind string `json:"kind,omitempty"`
	// Source names what a branch was made from (its backups).
	Source string `json:"source,omitempty"`
	// TTL, when non-zero, is how long the cluster may live (from Created).
	TTL time.Duration `json:"ttl_ns,omitempty"`
	// ParentPid, when non-zero, is a process the cluster must not outlive.
	ParentPid int `json:"parent_pid,omitempty"`
	// ParentStart and PidStart are the processes' start times (clock
	// ticks since boot, 0 when unknown), so a reused pid is not mistaken
	// for the original process.
	ParentStart uint64 `json:"parent_start,omitempty"`
	PidStart    uint64 `json:"pid_start,omitempty"`
	// DataDev and DataIno identify a branch's data directory as it was
	// when the branch started: Down removes the directory only when the
	// path still names that very directory (issue 19, F10).
	DataDev uint64 `json:"data_dev,omitempty"`
	DataIno uint64 `json:"data_ino,omitempty"`
}

// Expires returns when the TTL runs out (zero time: never).
func (i Info) Expires() time.Time {
	if i.TTL <= 0 {
		return time.Time{}
	}
	return i.Created.Add(i.TTL)
}

// State is a cluster's state as seen from outside.
type State string

// Cluster states.
const (
	// Starting: `pgfork up` is creating it right now.
	Starting State = "starting"
	// Running: its server is up.
	Running State = "running"
	// Stopped: its server was shut down cleanly (by someone else).
	Stopped State = "stopped"
	// Dead: its server is gone without a clean shutdown (crash, kill,
	// reboot), or the directory is the leftover of a failed `pgfork up`.
	Dead State = "dead"
)

// Entry is one cluster as listed.
type Entry struct {
	Info
	State State `json:"state"`
	// Size is the disk space its data directory uses (blocks allocated;
	// blocks shared with the template or source by reflink count in full).
	// List fills Size and Shared; Get and StateOf do not (0).
	Size int64 `json:"size_bytes"`
	// Shared is how much of Size is in extents shared with another file
	// (its template, backups or source, by reflink): Size - Shared is
	// what the cluster costs on its own.
	Shared int64 `json:"shared_bytes"`
}

var nameRe = regexp.MustCompile(`^[a-zA-Z0-9][a-zA-Z0-9_.-]{0,62}$`)

// ValidateName checks a cluster name (it becomes a directory name).
func ValidateName(name string) error {
	if !nameRe.MatchString(name) {
		return errs.New(errs.Usage, "bad cluster name %q", name).
			WithHint("use 1-63 letters, digits, '_', '.' or '-', starting with a letter or digit")
	}
	return nil
}

// NewName returns a fresh random name such as "pg-3f9a1c2b".
func NewName() string {
	var b [4]byte
	_, _ = rand.Read(b[:])
	return "pg-" + hex.EncodeToString(b[:])
}

// Dir returns the directory of cluster name.
func Dir(lay statedir.Layout, name string) string { return filepath.Join(lay.Clusters(), name) }

// DataDir returns the data directory of cluster name.
func DataDir(lay statedir.Layout, name string) string {
	return filepath.Join(lay.Clusters(), name, dataSubdir)
}

func lockPath(lay statedir.Layout, name string) string {
	return filepath.Join(lay.Locks(), "cluster-"+name+".lock")
}

// maxSocketPath is the longest socket directory whose socket path
// (dir + "/.s.PGSQL.NNNNN") fits in sun_path (108 bytes with the NUL).
const maxSocketPath = 107 - len("/.s.PGSQL.65535")

// SocketDirFor returns the private socket directory to use for a cluster:
// <state>/run/<name>, or, when that path is too long for a Unix socket, a
// new directory under the system temp dir.
func SocketDirFor(lay statedir.Layout, name string) (string, error) {
	d := filepath.Join(lay.Run(), name)
	if len(d) <= maxSocketPath {
		// run/ must be traversable by the PostgreSQL OS user.
		if err := os.MkdirAll(lay.Run(), 0o755); err != nil {
			return "", err
		}
		return d, nil
	}
	return os.MkdirTemp("", "pgfork-"+name+"-")
}

// Pending is a cluster being created: its name is claimed and its lock held.
type Pending struct {
	Name string
	Dir  string
	lay  statedir.Layout
	lock *flock.Lock
}

// DataDir is where the cluster's data directory goes (it does not exist yet).
func (p *Pending) DataDir() string { return filepath.Join(p.Dir, dataSubdir) }

// Create claims name. It fails with errs.Exists when the name is taken.
func Create(ctx context.Context, lay statedir.Layout, name string) (*Pending, error) {
	if err := ValidateName(name); err != nil {
		return nil, err
	}
	lp := lockPath(lay, name)
	l, err := flock.TryExclusive(lp)
	if errors.Is(err, fs.ErrNotExist) {
		if err := lay.Ensure(); err != nil {
			return nil, errs.FromOS(err, lay.Root, "cannot create the state directory")
		}
		l, err = flock.TryExclusive(lp)
	}
	if errors.Is(err, flock.ErrBusy) {
		return nil, errs.New(errs.Exists, "a cluster named %q is being created or removed", name).
			WithHint("choose another name, or wait").WithCLI("choose another --name, or wait and see `pgfork ls`")
	}
	if err != nil {
		return nil, errs.FromOS(err, lp, "cannot lock the cluster name")
	}
	dir := Dir(lay, name)
	if err := os.Mkdir(dir, 0o755); err != nil {
		l.Unlock()
		if errors.Is(err, fs.ErrExist) {
			return nil, errs.New(errs.Exists, "a cluster named %q already exists", name).WithPath(dir).
				WithHint("choose another name, or remove that cluster").WithCLI("choose another --name, or remove it with `pgfork down %s`", name)
		}
		return nil, errs.FromOS(err, dir, "cannot create the cluster directory")
	}
	_ = os.Chmod(dir, 0o755)
	return &Pending{Name: name, Dir: dir, lay: lay, lock: l}, nil
}

// Commit records the started cluster and releases the name lock.
func (p *Pending) Commit(info Info) error {
	info.Name = p.Name
	if info.Created.IsZero() {
		info.Created = time.Now()
	}
	if info.ParentPid != 0 && info.ParentStart == 0 {
		info.ParentStart = proc.StartTime(info.ParentPid)
	}
	if info.Pid != 0 && info.PidStart == 0 {
		info.PidStart = proc.StartTime(info.Pid)
	}
	b, _ := json.MarshalIndent(info, "", "  ")
	// No fsync (ReplaceFile): a cluster does not survive a crash of the
	// machine anyway (test profile), and the reaper cleans what a crash leaves.
	// 0600: the URL may hold the cluster's password (pgfork up --tcp).
	if err := fsutil.ReplaceFile(filepath.Join(p.Dir, infoFile), append(b, '\n'), 0o600); err != nil {
		return errs.FromOS(err, p.Dir, "cannot record the cluster")
	}
	p.lock.Unlock()
	return nil
}

// Abort removes everything the pending cluster created (stopping a server
// started on it) and releases the name.
func (p *Pending) Abort(socketDir string) {
	destroy(p.Dir, socketDir, instance.Expect{}, p.lay)
	p.lock.Remove()
}

// readInfo reads <dir>/cluster.json.
func readInfo(dir string) (Info, error) {
	var info Info
	b, err := os.ReadFile(filepath.Join(dir, infoFile))
	if err != nil {
		return info, err
	}
	if err := json.Unmarshal(b, &info); err != nil {
		return info, fmt.Errorf("%s: %w", filepath.Join(dir, infoFile), err)
	}
	return info, nil
}

// state determines the state of a registered cluster. Running means a
// server is proven to be its postmaster (instance.AttachExpect); a pid in
// postmaster.pid that is stale, reused or forged makes it Dead.
func state(info Info, dataDir string) State {
	if _, err := instance.ReadPidFile(dataDir); err != nil {
		if runsRecorded(info) {
			return Running // its data directory was moved or removed under it
		}
		if errors.Is(err, fs.ErrNotExist) {
			return Stopped
		}
		return Dead
	}
	inst, err := instance.AttachExpect(dataDir, expect(info))
	if err != nil {
		if runsRecorded(info) {
			return Running // postmaster.pid forged, the recorded server runs
		}
		return Dead
	}
	inst.Release()
	return Running
}

// runsRecorded reports whether the server recorded in info (pid, start
// time, user) still runs, whatever its data directory says now: a branch
// whose directory was renamed under it is still tracked, and stopped by
// down or the reaper, instead of forgotten while it runs (issue 19, F11).
func runsRecorded(info Info) bool {
	inst, err := instance.AttachRecorded(expect(info))
	if err != nil {
		return false
	}
	inst.Release()
	return true
}

// expect is what the cluster record (root's, not the data directory's)
// says about the server pgfork started.
func expect(info Info) instance.Expect {
	uid := os.Geteuid()
	if info.RunAs != "" {
		if u, err := user.Lookup(info.RunAs); err == nil {
			uid, _ = strconv.Atoi(u.Uid)
		} else {
			uid = 0 // unknown: AttachRecorded proves nothing
		}
	}
	return instance.Expect{Pid: info.Pid, Start: info.PidStart, UID: uid}
}

// alive reports whether process pid runs and, when start is known, is the
// same process that was recorded (not a reused pid). It only reads: a pid
// is never signalled on this answer.
func alive(pid int, start uint64) bool {
	if !proc.Alive(pid) {
		return false
	}
	if start != 0 {
		if s := proc.StartTime(pid); s != 0 && s != start {
			return false
		}
	}
	return true
}

// List returns every cluster, by name.
func List(lay statedir.Layout) ([]Entry, error) {
	ents, err := os.ReadDir(lay.Clusters())
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, errs.FromOS(err, lay.Clusters(), "cannot read the clusters directory")
	}
	var out []Entry
	for _, e := range ents {
		if !e.IsDir() || strings.HasPrefix(e.Name(), ".") {
			continue
		}
		out = append(out, entry(lay, e.Name(), true))
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out, nil
}

// entry reads cluster name's record; sized: with its disk use (a walk of
// its data directory, which only List does: Get and StateOf serve callers
// that hold locks, such as serve's branches, every 30 seconds).
func entry(lay statedir.Layout, name string, sized bool) Entry {
	dir := Dir(lay, name)
	info, err := readInfo(dir)
	if err != nil {
		st := Dead
		if l, lerr := flock.TryExclusive(lockPath(lay, name)); errors.Is(lerr, flock.ErrBusy) {
			st = Starting
		} else {
			l.Unlock()
		}
		return Entry{Info: Info{Name: name, DataDir: filepath.Join(dir, dataSubdir)}, State: st}
	}
	e := Entry{Info: info, State: state(info, info.DataDir)}
	if sized {
		e.Size, e.Shared = diskUsage(info.DataDir)
	}
	return e
}

// Get returns the cluster called name, or errs.NotFound, without its size
// (List measures it).
func Get(lay statedir.Layout, name string) (Entry, error) {
	if err := ValidateName(name); err != nil {
		return Entry{}, err
	}
	if _, err := os.Stat(Dir(lay, name)); err != nil {
		return Entry{}, errs.New(errs.NotFound, "no cluster named %q", name).WithCLI("see `pgfork ls`")
	}
	return entry(lay, name, false), nil
}

// StateOf is the State Get reports for cluster name, without sizing its
// data directory (Dead when there is no such cluster).
func StateOf(lay statedir.Layout, name string) State {
	if ValidateName(name) != nil {
		return Dead
	}
	info, err := readInfo(Dir(lay, name))
	if err != nil {
		return entry(lay, name, false).State
	}
	return state(info, info.DataDir)
}

// DefaultStopTimeout is how long Down waits for a fast shutdown before it
// shuts the server down immediately.
const DefaultStopTimeout = 10 * time.Second

// Down stops cluster name (fast shutdown; immediate after o.Timeout) and
// removes it: data directory, socket directory, record. A branch's data
// directory is the user's: a branch of a backup (KindRestore) keeps it
// unless o.DeleteData, a branch of a running cluster (KindClone) loses it
// unless o.KeepData; either way it is removed only when it is proven to
// be the directory the branch was started on (RemoveBranchData). A cluster being created or removed by another pgfork
// is errs.Busy.
func Down(ctx context.Context, lay statedir.Layout, name string, o DownOptions) error {
	if err := ValidateName(name); err != nil {
		return err
	}
	dir := Dir(lay, name)
	if _, err := os.Stat(dir); err != nil {
		return errs.New(errs.NotFound, "no cluster named %q", name).WithCLI("see `pgfork ls`")
	}
	l, err := flock.TryExclusive(lockPath(lay, name))
	if errors.Is(err, flock.ErrBusy) {
		return errs.New(errs.Busy, "cluster %q is being created or removed by another pgfork", name).
			WithHint("try again in a moment")
	}
	if err != nil {
		return errs.FromOS(err, lockPath(lay, name), "cannot lock the cluster")
	}
	defer l.Remove()
	if _, err := os.Stat(dir); err != nil {
		return errs.New(errs.NotFound, "no cluster named %q", name).WithCLI("see `pgfork ls`")
	}
	info, _ := readInfo(dir)
	if err := stop(ctx, filepath.Join(dir, dataSubdir), expect(info), o.Timeout); err != nil {
		return err
	}
	// A branch's data directory lives elsewhere (the registry holds a
	// symlink to it): it goes too, unless kept, once its server is down.
	branchData := ""
	if target, err := os.Readlink(filepath.Join(dir, dataSubdir)); err == nil && o.removesData(info.Kind) {
		branchData = target
	}
	if testHookBeforeRemoveData != nil && branchData != "" {
		testHookBeforeRemoveData(branchData)
	}
	if err := destroy(dir, info.SocketDir, expect(info), lay); err != nil {
		return err
	}
	if branchData != "" {
		return RemoveBranchData(branchData, info.DataDev, info.DataIno)
	}
	return nil
}

// testHookBeforeRemoveData, when set (tests only), runs after a branch's
// server is stopped and before its data directory is removed.
var testHookBeforeRemoveData func(dataDir string)

// removesData says whether Down removes a branch's data directory.
func (o DownOptions) removesData(kind string) bool {
	if kind == KindRestore {
		return o.DeleteData
	}
	return !o.KeepData
}

// RemoveBranchData removes a branch's data directory dir, but only when
// dir, looked up without following a symlink in its last component below
// its parent's descriptor, is the directory recorded as (dev, ino) when the
// branch started; anything else (a directory swapped in, a symlink, a
// record without an identity) is left alone and reported.
func RemoveBranchData(dir string, dev, ino uint64) error {
	if dev == 0 && ino == 0 {
		return errs.New(errs.Busy, "the branch is stopped and forgotten; its data directory was kept (its record does not say which directory it was)").WithPath(dir).
			WithHint("remove it yourself once you have checked it is the branch's")
	}
	parent, err := os.OpenRoot(filepath.Dir(dir))
	if err != nil {
		return errs.FromOS(err, dir, "the branch is stopped and forgotten, but its data directory could not be removed")
	}
	defer parent.Close()
	base := filepath.Base(dir)
	fi, err := parent.Lstat(base)
	if err != nil {
		return errs.FromOS(err, dir, "the branch is stopped and forgotten, but its data directory could not be removed")
	}
	if st, ok := fi.Sys().(*syscall.Stat_t); !ok || !fi.IsDir() || uint64(st.Dev) != dev || uint64(st.Ino) != ino {
		return errs.New(errs.Permission, "the branch is stopped and forgotten, but %s is no longer its data directory (it was replaced or moved); nothing was removed", dir).
			WithPath(dir).WithHint("check what is there now; remove the branch's data yourself if you find it")
	}
	if err := parent.RemoveAll(base); err != nil {
		return errs.FromOS(err, dir, "the branch is stopped and forgotten, but its data directory could not be removed")
	}
	return nil
}

// DownOptions say how Down stops a cluster and what it removes.
type DownOptions struct {
	// Timeout: a fast shutdown first, an immediate one after this long.
	Timeout time.Duration
	// KeepData keeps the data directory of a branch of a running cluster
	// (clone --start), which Down removes otherwise; a `pgfork up`
	// cluster's data is always removed.
	KeepData bool
	// DeleteData removes the data directory of a branch of a backup
	// (restore --start), which Down keeps otherwise: it is the user's
	// restore, not a throw-away cluster.
	DeleteData bool
}

// stop shuts down the server running on dataDir, if one is proven to be its
// postmaster (see instance.AttachExpect): nothing else is signalled.
func stop(ctx context.Context, dataDir string, want instance.Expect, timeout time.Duration) error {
	inst, err := instance.AttachExpect(dataDir, want)
	if err != nil {
		// The data directory no longer proves it (renamed, forged pid
		// file): the server recorded at start, if it still runs.
		if inst, err = instance.AttachRecorded(want); err != nil {
			return nil // not running
		}
	}
	if timeout <= 0 {
		timeout = DefaultStopTimeout
	}
	sctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	if err := inst.Stop(sctx, instance.Fast); err != nil && errs.KindOf(err) != errs.Interrupted {
		return err
	}
	return nil
}

// destroy removes a cluster directory (after stopping any server in it
// immediately) and its socket directory.
func destroy(dir, socketDir string, want instance.Expect, lay statedir.Layout) error {
	_ = stop(context.Background(), filepath.Join(dir, dataSubdir), want, time.Millisecond)
	if socketDir == "" {
		// Unrecorded (an up killed mid-way): the default place.
		socketDir = filepath.Join(lay.Run(), filepath.Base(dir))
	}
	if socketDir != "" && (strings.HasPrefix(socketDir, lay.Run()+"/") || strings.HasPrefix(filepath.Base(socketDir), "pgfork-")) {
		_ = os.RemoveAll(socketDir)
	}
	// Rename first so the name is free (and nothing half-removed is listed)
	// even if the removal is slow or interrupted.
	trash := filepath.Join(filepath.Dir(dir), fmt.Sprintf(".trash-%s-%d", filepath.Base(dir), os.Getpid()))
	if err := os.Rename(dir, trash); err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return nil
		}
		return errs.FromOS(err, dir, "cannot remove the cluster")
	}
	if err := os.RemoveAll(trash); err != nil {
		return errs.FromOS(err, trash, "cannot remove the cluster's files")
	}
	return nil
}

// Reaped says what Reap removed and why.
type Reaped struct {
	Name   string `json:"name"`
	Reason string `json:"reason"`
}

// Reap removes clusters that must not live on: TTL expired, parent process
// gone, server dead, or leftovers of a failed `pgfork up`; a branch whose
// server is gone is only forgotten (record and socket directory), its data
// directory kept. Clusters being
// created or removed by another pgfork are left alone. It is cheap when
// there is nothing to do (a directory listing and a few small reads).
func Reap(ctx context.Context, lay statedir.Layout) ([]Reaped, error) {
	ents, err := os.ReadDir(lay.Clusters())
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, errs.FromOS(err, lay.Clusters(), "cannot read the clusters directory")
	}
	var out []Reaped
	now := time.Now()
	for _, e := range ents {
		name := e.Name()
		dir := filepath.Join(lay.Clusters(), name)
		if strings.HasPrefix(name, ".trash-") {
			if pid := trashPid(name); pid == 0 || !alive(pid, 0) {
				_ = os.RemoveAll(dir)
			}
			continue
		}
		if !e.IsDir() || ValidateName(name) != nil {
			continue
		}
		info, err := readInfo(dir)
		reason := ""
		switch {
		case err != nil:
			reason = "left over by a failed pgfork up"
		case info.TTL > 0 && now.After(info.Expires()):
			reason = fmt.Sprintf("TTL of %s expired", info.TTL)
		case info.ParentPid != 0 && !alive(info.ParentPid, info.ParentStart):
			reason = fmt.Sprintf("parent process %d exited", info.ParentPid)
		case state(info, info.DataDir) == Dead:
			reason = "server is no longer running"
		case info.Kind != "" && state(info, info.DataDir) == Stopped:
			// A branch stopped outside pgfork (its printed pg_ctl stop):
			// forgotten, its data directory kept where it was made.
			reason = "branch was stopped; its data directory is kept"
		}
		if reason == "" {
			continue
		}
		l, lerr := flock.TryExclusive(lockPath(lay, name))
		if lerr != nil {
			continue // being created or removed right now
		}
		// Re-check under the lock: up may have just finished it.
		if err != nil {
			if _, err2 := readInfo(dir); err2 == nil {
				l.Unlock()
				continue
			}
		}
		if info.Pid != 0 {
			_ = stop(ctx, info.DataDir, expect(info), 5*time.Second)
		}
		if derr := destroy(dir, info.SocketDir, expect(info), lay); derr == nil {
			out = append(out, Reaped{Name: name, Reason: reason})
		}
		l.Remove()
	}
	return out, nil
}

func trashPid(name string) int {
	i := strings.LastIndexByte(name, '-')
	var pid int
	if i < 0 {
		return 0
	}
	_, _ = fmt.Sscanf(name[i+1:], "%d", &pid)
	return pid
}

// diskUsage returns the blocks allocated under dir and how many of those
// bytes are shared with other files (FIEMAP), following dir itself when it
// is a branch's symlink but no link below it. The tree belongs to the
// server's OS user and may change meanwhile: every file is opened relative
// to its directory, never following a link and never blocking on a FIFO
// (safefs.Walk), so that `pgfork ls` neither hangs nor measures what a
// planted link points to (issue 32, F20).
func diskUsage(dir string) (size, shared int64) {
	if t, err := filepath.EvalSymlinks(dir); err == nil {
		dir = t
	}
	d, err := safefs.OpenDir(dir)
	if err != nil {
		return 0, 0
	}
	defer d.Close()
	_ = d.Walk(func(_ string, f *os.File, fi os.FileInfo) error {
		if st, ok := fi.Sys().(*syscall.Stat_t); ok {
			size += st.Blocks * 512
		} else {
			size += fi.Size()
		}
		if fi.Mode().IsRegular() {
			if n, err := clone.SharedBytesOf(f); err == nil {
				shared += n
			}
		}
		return nil
	})
	return size, shared
}
