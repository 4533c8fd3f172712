package upgrade

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/pgfork/pgfork/instance"
	"github.com/pgfork/pgfork/internal/errs"
	"github.com/pgfork/pgfork/pgdata"
)

// An interrupt (Ctrl-C, SIGTERM: ctx cancelled) after the old cluster was
// stopped must never leave the application with nothing to connect to.
// Per phase:
//   - while the old cluster can still be used (before pg_upgrade disabled
//     it: always in clone, copy-file-range and copy modes, until the link
//     or swap step in those modes), the run stops and the old cluster is
//     started again as it ran (afterInterrupt);
//   - once pg_upgrade disabled it (link, swap: global/pg_control.old), the
//     interrupt is held until the new cluster serves (commitGuard), and
//     the run then ends saying so;
//   - after the hand-over the new cluster serves: the run ends saying so.

// committed says whether the old cluster is past the point of no return:
// a link or swap transfer began (pg_upgrade renames global/pg_control to
// pg_control.old just before it links or moves the files).
func (u *upgrader) committed() bool {
	if !u.res.Mode.destructive() {
		return false
	}
	_, err := os.Lstat(filepath.Join(u.o.OldDir, "global", "pg_control.old"))
	return err == nil
}

// commitGuard returns a context that ctx's cancellation cancels only while
// the old cluster is not committed; past that point the run goes on to the
// hand-over. release frees it.
func (u *upgrader) commitGuard(ctx context.Context) (gctx context.Context, release func()) {
	gctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	stop := context.AfterFunc(ctx, func() {
		if u.committed() {
			u.infof(PhaseUpgrade, "interrupted: the old cluster can no longer be started (--mode %s, past pg_upgrade's transfer); finishing until the new cluster serves", u.res.Mode)
			return
		}
		cancel()
	})
	return gctx, func() { stop(); cancel() }
}

// afterInterrupt turns the error of an interrupted run into what happened
// to the application's server, after starting the old cluster again where
// that is what is left to do (see above).
func (u *upgrader) afterInterrupt(err error) error {
	o := u.o
	if u.handed {
		where := ""
		if pf, perr := instance.ReadPidFile(o.NewDir); perr == nil {
			where = fmt.Sprintf(" on port %d", pf.Port)
		}
		return errs.Wrap(errs.Interrupted, err, "interrupted: the new cluster serves%s (PostgreSQL %d, %s)", where, o.New.Major, o.NewDir).
			WithHint("the upgrade is done; optimizer statistics may be incomplete: run %s against it", strings.Join(statsArgs(o.New.Major, 1, true), " "))
	}
	if u.oldPort == 0 || u.down.IsZero() {
		return err // the old cluster did not run, or was never stopped
	}
	if _, running, _ := pgdata.Running(o.OldDir); running {
		return err // before the stop: it still serves
	}
	if _, cerr := os.Lstat(filepath.Join(o.OldDir, "global", "pg_control")); cerr != nil {
		return errs.Wrap(errs.Interrupted, err, "interrupted after pg_upgrade disabled the old cluster; nothing serves").WithPath(o.OldDir).
			WithHint("if the new cluster never started, rename %s back to pg_control and start the old cluster (%s -D %s start); else run the upgrade again",
				filepath.Join(o.OldDir, "global", "pg_control.old"), o.Old.tool("pg_ctl"), o.OldDir)
	}
	port, serr := u.restartOld()
	if serr != nil {
		return errs.Wrap(errs.Interrupted, err, "interrupted after the old cluster was stopped, and it could not be started again: %v", serr).WithPath(o.OldDir).
			WithHint("it is intact: start it (%s -D %s start)", o.Old.tool("pg_ctl"), o.OldDir)
	}
	hint := "it is as it was at the stop; run the upgrade again when you are ready"
	if _, nerr := os.Stat(filepath.Join(o.NewDir, "PG_VERSION")); nerr == nil {
		hint += fmt.Sprintf(" (first remove the upgraded copy %s and its PG_%d_* directories in the tablespaces)", o.NewDir, o.New.Major)
	}
	u.infof(PhaseStopOld, "interrupted: the old cluster is running again on port %d", port)
	return errs.Wrap(errs.Interrupted, err, "interrupted: the old cluster is running again on port %d", port).WithPath(o.OldDir).WithHint("%s", hint)
}

// restartOld starts the old cluster again with its own configuration and
// the command line it ran with (postmaster.opts, as pg_ctl restart does),
// and returns its port.
func (u *upgrader) restartOld() (int, error) {
	o := u.o
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	args := []string{"start", "-D", o.OldDir, "-w", "-t", "300", "-l", filepath.Join(o.OldDir, instance.LogFileName)}
	if u.oldOpts != "" {
		args = append(args, "-o", u.oldOpts)
	}
	cmd := o.User.Command(ctx, o.Old.Env, o.Old.tool("pg_ctl"), args...)
	setpgid(cmd)
	if out, err := cmd.CombinedOutput(); err != nil {
		return 0, fmt.Errorf("pg_ctl start: %v: %s", err, strings.TrimSpace(string(out)))
	}
	inst, err := instance.Attach(o.OldDir)
	if err != nil {
		return 0, err
	}
	defer inst.Release()
	return inst.Port, nil
}

// setpgid puts cmd in a process group of its own: the terminal's Ctrl-C
// reaches pgfork alone, which decides what to stop.
func setpgid(cmd *exec.Cmd) {
	if cmd.SysProcAttr == nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{}
	}
	cmd.SysProcAttr.Setpgid = true
}
