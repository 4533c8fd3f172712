package logical

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgfork/pgfork/instance"
	"github.com/pgfork/pgfork/internal/errs"
	"github.com/pgfork/pgfork/internal/proc"
	"github.com/pgfork/pgfork/pgclone"
	"github.com/pgfork/pgfork/pgdata"
)

// state is what a run has created or may have, written beside NEW_DATADIR
// before it creates it, so that the next run cleans up after a run that
// was killed (kill -9 runs no deferred code).
type state struct {
	Pid      int    `json:"pid"`
	PidStart uint64 `json:"pid_start"`
	OldDir   string `json:"old_dir"`
	CloneDir string `json:"clone_dir"`
	// Databases and their slots: publications and slots are dropped by
	// name where they exist.
	Databases map[string]string `json:"databases"`
	// ReadOnly: default_transaction_read_only may be set on the old cluster.
	ReadOnly bool `json:"read_only"`
	// NewMade: NEW_DATADIR is the run's.
	NewMade bool `json:"new_made"`
	// HandingOver: the old cluster may be stopped and the new one started
	// at its address.
	HandingOver bool `json:"handing_over"`
	// OldCarries: the hand-over is done (the new cluster serves at the old
	// one's address) and the stopped old cluster still carries the run's
	// slots and publications; the clean-up starts it privately to drop them
	// (an old cluster left with logical slots would keep WAL for ever).
	OldCarries bool `json:"old_carries"`
	// OldOpts is the old cluster's postmaster.opts as it ran: a private
	// start rewrites it, and it is put back afterwards (Rollback starts
	// the old cluster from it, at its address).
	OldOpts string `json:"old_opts,omitempty"`
	// OldHost and OldPort are the old cluster's address (its socket
	// directory and port), where a private start never runs.
	OldHost string `json:"old_host,omitempty"`
	OldPort int    `json:"old_port,omitempty"`
	// OldSettings are what the old cluster's command line set (from
	// pg_settings), for its private start.
	OldSettings map[string]string `json:"old_settings,omitempty"`
}

func statePath(newDir string) string { return newDir + ".pgfork-logical.json" }

// readOwnState reads the state file at p only if this user wrote it: a
// regular file (no symlink followed, no FIFO waited on) owned by this
// process's user that no other user may read or write. The clean-up acts on
// what it names (stops servers, removes directories): as root, a file
// another user planted beside NEW_DATADIR must never steer that (docs/
// SECURITY.md, "Upgrades"). os.ErrNotExist when there is none.
func readOwnState(p string) ([]byte, error) {
	f, err := os.OpenFile(p, os.O_RDONLY|syscall.O_NOFOLLOW|syscall.O_NONBLOCK, 0)
	if errors.Is(err, os.ErrNotExist) {
		return nil, err
	}
	if errors.Is(err, syscall.ELOOP) {
		return nil, errs.New(errs.Permission, "%s is a symlink, not a state file this user wrote", p).
			WithPath(p).WithHint("remove it: the upgrade never acts on a state file another user could have written")
	}
	if err != nil {
		return nil, errs.FromOS(err, p, "cannot read the state of an earlier run")
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return nil, errs.FromOS(err, p, "cannot read the state of an earlier run")
	}
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !fi.Mode().IsRegular() || !ok || int(st.Uid) != os.Geteuid() || fi.Mode().Perm()&0o077 != 0 {
		return nil, errs.New(errs.Permission, "%s is not a state file this user wrote (a regular file of uid %d, mode 0600)", p, os.Geteuid()).
			WithPath(p).WithHint("remove it: the upgrade never acts on a state file another user could have written")
	}
	return io.ReadAll(io.LimitReader(f, 1<<20))
}

// isClonePath reports whether dir is where a run upgrading oldDir makes its
// clone (beside it, .BASE.pgfork-logical-PID): the only directory, besides
// NEW_DATADIR, that the clean-up of a killed run removes.
func isClonePath(oldDir, dir string) bool {
	if filepath.Dir(dir) != filepath.Dir(oldDir) {
		return false
	}
	prefix := "." + filepath.Base(oldDir) + ".pgfork-logical-"
	pid := strings.TrimPrefix(filepath.Base(dir), prefix)
	if pid == filepath.Base(dir) || pid == "" {
		return false
	}
	_, err := strconv.Atoi(pid)
	return err == nil
}

// save writes the run's state (best effort before the first object is
// created: a failure to write it fails the run).
func (r *run) save() error {
	st := state{Pid: os.Getpid(), PidStart: proc.StartTime(os.Getpid()), OldDir: r.o.OldDir, CloneDir: r.clonePath,
		Databases: map[string]string{}, ReadOnly: r.readOnly, NewMade: r.newMade, HandingOver: r.handingOver,
		OldCarries: r.oldCarries, OldOpts: r.oldOptsRaw, OldHost: r.appHost, OldPort: r.appPort, OldSettings: r.oldSettings}
	for _, d := range r.dbs {
		st.Databases[d.name] = d.slot
	}
	b, err := json.Marshal(st)
	if err != nil {
		return err
	}
	p := statePath(r.o.NewDir)
	if err := os.WriteFile(p+".tmp", b, 0o600); err != nil {
		return errs.FromOS(err, p, "cannot write the run's state beside the new data directory")
	}
	if err := os.Rename(p+".tmp", p); err != nil {
		return errs.FromOS(err, p, "cannot write the run's state beside the new data directory")
	}
	r.saved = true
	return nil
}

// forget removes the run's state file: nothing of it is left to clean. A
// state file this run did not write (another run's) is left alone.
func (r *run) forget() {
	if r.saved {
		_ = os.Remove(statePath(r.o.NewDir))
	}
}

// cleanKilled cleans up after a killed run on the same NEW_DATADIR: it
// stops the servers it left (on its clone and on NEW_DATADIR), gives
// writes back to the old cluster, drops its slots and publications,
// removes the clone and NEW_DATADIR. It returns what it did.
func (r *run) cleanKilled(ctx context.Context) ([]string, error) {
	p := statePath(r.o.NewDir)
	b, err := readOwnState(p)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var st state
	if err := json.Unmarshal(b, &st); err != nil {
		return nil, errs.Wrap(errs.Internal, err, "bad state file of an earlier run").WithPath(p).WithHint("remove it once you have checked both clusters")
	}
	if st.CloneDir != "" && !isClonePath(r.o.OldDir, st.CloneDir) {
		return nil, errs.New(errs.Permission, "the state file of an earlier run names %s as its clone, which is not where a run of %s makes one", st.CloneDir, r.o.OldDir).
			WithPath(p).WithHint("remove %s once you have checked both clusters", p)
	}
	if proc.Alive(st.Pid) && proc.StartTime(st.Pid) == st.PidStart {
		return nil, errs.New(errs.Busy, "another upgrade of this cluster runs (pid %d)", st.Pid).WithPath(p).WithHint("wait for it to end")
	}
	if st.OldDir != r.o.OldDir {
		return nil, errs.New(errs.Usage, "an earlier run on this new data directory upgraded %s, not %s", st.OldDir, r.o.OldDir).WithPath(p).
			WithHint("run again with %s to clean up after it, or choose another new data directory", st.OldDir)
	}
	if st.OldCarries {
		// The upgrade was done: the new cluster serves at the old one's
		// address. Left: the old side's slots and publications, the new
		// side's disabled subscriptions.
		did, err := r.finishCleanup(ctx, &st)
		r.closeAll()
		r.dbs, r.control, r.ownPIDs = nil, nil, nil
		if err != nil {
			return nil, err
		}
		_ = os.Remove(p)
		return nil, errs.New(errs.Exists, "an earlier run upgraded %s into %s and was killed before its clean-up ended; the clean-up is done now: %s", r.o.OldDir, r.o.NewDir, strings.Join(did, "; ")).
			WithPath(r.o.NewDir).WithHint("the new cluster serves at the old one's address: nothing is left to do").
			WithCLI("to go back to the old cluster: the same command with --rollback")
	}
	if st.HandingOver {
		return nil, errs.New(errs.Internal, "an earlier run was killed during the hand-over: the old cluster may be stopped and the new one may serve").WithPath(p).
			WithHint("check which cluster runs at the old address; if it is the new one, the upgrade is done: drop the subscriptions left on it, and the slots pgfork_upgrade_* and publications pgfork_upgrade on the old cluster (start it on a private socket), remove %s and the clone %s; else start the old cluster, drop the slots and publications and ALTER SYSTEM RESET default_transaction_read_only", p, st.CloneDir)
	}
	var did []string
	for _, dir := range []string{st.CloneDir, r.o.NewDir} {
		if dir == "" || (dir == r.o.NewDir && !st.NewMade) {
			continue
		}
		if _, running, _ := pgdata.Running(dir); running {
			if inst, err := instance.Attach(dir); err == nil {
				if err := inst.Stop(ctx, instance.Fast); err != nil {
					return nil, errs.Wrap(errs.Busy, err, "cannot stop the server an earlier run left on %s", dir)
				}
				did = append(did, "stopped the server left on "+dir)
			}
		}
	}
	for name, slot := range st.Databases {
		r.dbs = append(r.dbs, &database{name: name, slot: slot, pub: true, slotMade: true})
	}
	r.phys, r.readOnly = true, st.ReadOnly
	if err := r.connectOld(ctx); err != nil {
		return nil, err
	}
	for _, d := range r.dbs {
		conn, err := pgx.Connect(ctx, r.oldURL(d.name, "pgfork upgrade"))
		if err != nil {
			continue // a database dropped since: its slot and publication went with it
		}
		d.old = conn
	}
	if r.readOnly {
		if _, err := r.control.Exec(ctx, "ALTER SYSTEM RESET default_transaction_read_only"); err != nil {
			return nil, errs.Wrap(errs.Internal, err, "cannot give writes back to the old cluster")
		}
		if _, err := r.control.Exec(ctx, "SELECT pg_reload_conf()"); err != nil {
			return nil, errs.Wrap(errs.Internal, err, "cannot give writes back to the old cluster")
		}
		r.readOnly = false
		did = append(did, "gave writes back to the old cluster")
	}
	dctx, cancel := context.WithTimeout(ctx, time.Minute)
	left := r.dropReplication(dctx)
	cancel()
	r.closeAll()
	r.dbs, r.control, r.ownPIDs = nil, nil, nil
	if left != "" {
		return nil, errs.New(errs.Busy, "cannot clean up after an earlier run%s", left).WithPath(p).WithHint("drop them by hand and remove %s", p)
	}
	did = append(did, fmt.Sprintf("dropped its slots and publications in %d databases", len(st.Databases)))
	if st.CloneDir != "" {
		_ = os.RemoveAll(st.CloneDir)
		_ = os.RemoveAll(pgclone.TablespaceDir(st.CloneDir))
	}
	if st.NewMade {
		if err := os.RemoveAll(r.o.NewDir); err != nil {
			return nil, errs.FromOS(err, r.o.NewDir, "cannot remove the new data directory an earlier run left")
		}
		did = append(did, "removed "+r.o.NewDir)
	}
	r.phys = false
	_ = os.Remove(p)
	return did, nil
}
