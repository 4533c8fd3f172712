package upgrade

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"time"

	"github.com/pgfork/pgfork/instance"
	"github.com/pgfork/pgfork/internal/errs"
	"github.com/pgfork/pgfork/internal/fsutil"
	"github.com/pgfork/pgfork/internal/proc"
)

// workspace is where one upgrade builds the new cluster: a hidden directory
// beside NEW_DATADIR holding the staging data directory and a state file,
// plus a short private directory under the system temp dir that is
// pg_upgrade's working directory (its Unix sockets must fit the 107-byte
// limit) and holds the private pg_hba.conf and server logs.
type workspace struct {
	Dir     string
	Staging string
	Tmp     string
	state   wsState
	// keepServer: the new cluster was handed over running; removing the
	// workspace must not stop it.
	keepServer bool
}

// wsState is the workspace's state file: enough for the next run to stop
// servers and remove what an interrupted run left behind.
type wsState struct {
	Pid       int    `json:"pid"`
	Old       string `json:"old"`
	New       string `json:"new"`
	Tmp       string `json:"tmp"`
	Rehearsal string `json:"rehearsal,omitempty"`
	// TablespaceDirs are the new major's directories pg_upgrade creates
	// inside the old cluster's tablespace locations.
	TablespaceDirs []string `json:"tablespace_dirs,omitempty"`
	Mode           Mode     `json:"mode,omitempty"`
	Transferring   bool     `json:"transferring,omitempty"`
	// Placed: the upgraded cluster was moved into New; it and the
	// tablespace directories pg_upgrade made belong to it now.
	Placed  bool      `json:"placed,omitempty"`
	Started time.Time `json:"started"`
}

func wsDir(newDir string) string {
	return filepath.Join(filepath.Dir(newDir), "."+filepath.Base(newDir)+".pgfork-upgrade")
}

func (w *workspace) save() error {
	b, _ := json.MarshalIndent(w.state, "", "  ")
	p := filepath.Join(w.Dir, "state.json")
	if err := fsutil.WriteFileAtomic(p, b, 0o644); err != nil {
		return errs.FromOS(err, p, "cannot write the upgrade state file")
	}
	return nil
}

func readState(dir string) (*wsState, error) {
	b, err := os.ReadFile(filepath.Join(dir, "state.json"))
	if err != nil {
		return nil, err
	}
	var s wsState
	if err := json.Unmarshal(b, &s); err != nil {
		return nil, err
	}
	return &s, nil
}

// pidAlive only reads (signal 0 through proc.Alive, which refuses pids a
// kill(2) would truncate); it never decides what to signal.
func pidAlive(pid int) bool { return proc.Alive(pid) }

// newWorkspace cleans up after an interrupted earlier run on newDir and
// creates a fresh workspace.
func newWorkspace(ctx context.Context, oldDir, newDir string, u *instance.OSUser) (*workspace, []string, error) {
	cleaned, err := cleanStale(ctx, newDir)
	if err != nil {
		return nil, cleaned, err
	}
	w := &workspace{Dir: wsDir(newDir)}
	if err := os.Mkdir(w.Dir, 0o755); err != nil {
		if errors.Is(err, fs.ErrExist) {
			return nil, cleaned, errs.New(errs.Busy, "another pgfork upgrade is working on this new data directory").WithPath(w.Dir).
				WithHint("wait for it to finish")
		}
		return nil, cleaned, errs.Wrap(errs.OSKind(err), err, "cannot create the upgrade's work directory beside the new data directory").WithPath(w.Dir).
			WithHint("the parent of NEW_DATADIR must exist and be writable")
	}
	w.Staging = filepath.Join(w.Dir, "new")
	tmp, err := os.MkdirTemp("", "pgfork-upgrade-")
	if err != nil {
		_ = os.RemoveAll(w.Dir)
		return nil, cleaned, errs.Wrap(errs.Internal, err, "cannot create a temporary directory")
	}
	w.Tmp = tmp
	if err := u.MkdirOwned(tmp, userDirMode); err != nil {
		_ = os.RemoveAll(w.Dir)
		_ = os.RemoveAll(tmp)
		return nil, cleaned, errs.FromOS(err, tmp, "cannot prepare a temporary directory")
	}
	w.state = wsState{Pid: os.Getpid(), Old: oldDir, New: newDir, Tmp: tmp, Started: time.Now()}
	if err := w.save(); err != nil {
		_ = os.RemoveAll(w.Dir)
		_ = os.RemoveAll(tmp)
		return nil, cleaned, err
	}
	return w, cleaned, nil
}

// cleanStale removes the workspace an interrupted run on newDir left:
// it stops the servers that run stayed with (on the staging directory, the
// rehearsal clone, and the old cluster when pg_upgrade had started it),
// and removes the staging directory, the rehearsal clone and the new
// major's directories pg_upgrade created in the tablespaces. A swap-mode
// run interrupted during its transfer is not touched: the old cluster's
// files may be in the staging directory.
func cleanStale(ctx context.Context, newDir string) ([]string, error) {
	dir := wsDir(newDir)
	if _, err := os.Lstat(dir); err != nil {
		return nil, nil
	}
	st, err := readState(dir)
	if err != nil {
		// No state file: the run died before writing it; nothing else exists.
		return []string{dir}, os.RemoveAll(dir)
	}
	if st.Pid != os.Getpid() && pidAlive(st.Pid) {
		return nil, errs.New(errs.Busy, "another pgfork upgrade (pid %d) is working on this new data directory", st.Pid).WithPath(newDir).
			WithHint("wait for it to finish, or stop it (Ctrl-C) and run again")
	}
	placed := st.placedIn(dir)
	if st.Mode == Swap && st.Transferring && !placed {
		return nil, errs.New(errs.Internal, "an earlier swap-mode upgrade was interrupted while it moved the old cluster's files").WithPath(dir).
			WithHint("the old cluster's files may be in %s; do not delete it: restore from backup, or inspect it with pg_upgrade's logs", filepath.Join(dir, "new"))
	}
	var cleaned []string
	stopIn := []string{filepath.Join(dir, "new")}
	if st.Rehearsal != "" {
		stopIn = append(stopIn, filepath.Join(st.Rehearsal, "old"), filepath.Join(st.Rehearsal, "new"))
	}
	for _, d := range stopIn {
		if stopServer(ctx, d, "") {
			cleaned = append(cleaned, "stopped the server left running on "+d)
		}
	}
	if st.Old != "" && st.Tmp != "" {
		pf, _ := instance.ReadPidFile(st.Old)
		if stopServer(ctx, st.Old, st.Tmp) {
			cleaned = append(cleaned, fmt.Sprintf("stopped the old cluster's private server (pid %d: pg_upgrade's binary-upgrade server, or pgfork's), "+
				"which the interrupted upgrade had started on its socket %s; the old cluster can be started again", pf.Pid, st.Tmp))
		}
	}
	var rm []string
	if placed {
		// The upgraded cluster is in place: only a server pgfork started
		// on it privately (its socket in the run's temporary directory)
		// is stopped; its tablespace directories are kept.
		if st.Tmp != "" && stopServer(ctx, st.New, st.Tmp) {
			cleaned = append(cleaned, "stopped the upgraded cluster, which the interrupted upgrade had started privately")
		}
	} else {
		rm = append(rm, st.TablespaceDirs...)
	}
	if st.Rehearsal != "" {
		rm = append(rm, st.Rehearsal)
	}
	rm = append(rm, st.Tmp, dir)
	var all []error
	for _, p := range rm {
		if p == "" {
			continue
		}
		if _, err := os.Lstat(p); err != nil {
			continue
		}
		if err := os.RemoveAll(p); err != nil {
			all = append(all, err)
			continue
		}
		cleaned = append(cleaned, "removed "+p)
	}
	if err := errors.Join(all...); err != nil {
		return cleaned, errs.Wrap(errs.Internal, err, "cannot remove what an interrupted upgrade left").WithHint("remove these paths by hand")
	}
	return cleaned, nil
}

// placedIn says whether the run whose workspace is dir had moved the
// upgraded cluster into New: it recorded so, or it was killed between the
// rename and the record (the staging directory is gone, New exists).
func (st *wsState) placedIn(dir string) bool {
	if st.Placed {
		return true
	}
	if !st.Transferring || st.New == "" {
		return false
	}
	_, serr := os.Lstat(filepath.Join(dir, "new"))
	_, nerr := os.Lstat(filepath.Join(st.New, "PG_VERSION"))
	return errors.Is(serr, fs.ErrNotExist) && nerr == nil
}

// cleanPlaced cleans the workspace of an interrupted run on newDir that
// had moved the upgraded cluster into newDir (see placedIn), before
// newDir is refused because it exists. placed says whether it found one.
func cleanPlaced(ctx context.Context, newDir string) (cleaned []string, placed bool, err error) {
	dir := wsDir(newDir)
	st, err := readState(dir)
	if err != nil || st.New != newDir || !st.placedIn(dir) {
		return nil, false, nil
	}
	cleaned, err = cleanStale(ctx, newDir)
	return cleaned, true, err
}

// stopServer stops a server running on dataDir, if any (and, when
// socketDir is set, only if it listens there: one pgfork or pg_upgrade
// started). It reports whether it stopped one.
func stopServer(ctx context.Context, dataDir, socketDir string) bool {
	pf, err := instance.ReadPidFile(dataDir)
	if err != nil || !pidAlive(pf.Pid) {
		return false
	}
	if socketDir != "" && filepath.Clean(pf.SocketDir) != filepath.Clean(socketDir) {
		return false
	}
	inst, err := instance.Attach(dataDir)
	if err != nil {
		return false
	}
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Minute)
	defer cancel()
	return inst.Stop(sctx, instance.Fast) == nil
}

// remove deletes the workspace after a finished (or failed and handled) run.
func (w *workspace) remove(ctx context.Context) {
	if !w.keepServer {
		stopServer(ctx, w.Staging, "")
	}
	stopServer(ctx, w.state.Old, w.Tmp)
	_ = os.RemoveAll(w.Tmp)
	_ = os.RemoveAll(w.Dir)
}

// keepLogs moves pg_upgrade's logs and output out of the staging directory
// to <NEW_DATADIR>.pgfork-upgrade-logs-<time> and returns that path.
func (w *workspace) keepLogs(newDir, output string) string {
	dst := newDir + ".pgfork-upgrade-logs-" + time.Now().Format("20060102T150405")
	if err := os.MkdirAll(dst, 0o755); err != nil {
		return ""
	}
	if output != "" {
		_ = os.WriteFile(filepath.Join(dst, "pg_upgrade.out"), []byte(output), 0o644)
	}
	src := filepath.Join(w.Staging, "pg_upgrade_output.d")
	if _, err := os.Stat(src); err == nil {
		_ = os.Rename(src, filepath.Join(dst, "pg_upgrade_output.d"))
	}
	logs, _ := filepath.Glob(filepath.Join(w.Tmp, "*.log"))
	for _, l := range logs {
		_ = os.Rename(l, filepath.Join(dst, filepath.Base(l)))
	}
	return dst
}
