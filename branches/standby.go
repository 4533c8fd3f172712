package branches

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"github.com/pgfork/pgfork/clone"
	"github.com/pgfork/pgfork/cluster"
	"github.com/pgfork/pgfork/internal/errs"
	"github.com/pgfork/pgfork/internal/fsutil"
	"github.com/pgfork/pgfork/internal/proc"
)

// SourceStandby is a physical standby of a remote primary that the Manager
// makes (pg_basebackup -R) on its volume and keeps running: snapshots are
// online clones of it, the primary is never touched again.
const SourceStandby = "standby"

// kindStandby is the registry kind of a standby source's server.
const kindStandby = "standby"

func (m *Manager) standbyDir(name string) string { return filepath.Join(m.dir, "standby", name) }

func standbyReg(name string) string { return "standby." + name }

// ensureStandby makes the standby of s if it does not exist yet (a base
// backup of the primary with its replication settings, built in a private
// directory and renamed when complete) and starts it if it is not running.
func (m *Manager) ensureStandby(ctx context.Context, s Source) error {
	if err := mkdirPrivate(filepath.Join(m.dir, "standby")); err != nil {
		return err
	}
	dir := m.standbyDir(s.Name)
	// A base backup killed mid-way leaves a partial directory: removed.
	if ents, err := os.ReadDir(filepath.Join(m.dir, "standby")); err == nil {
		for _, e := range ents {
			if strings.HasPrefix(e.Name(), ".partial-"+s.Name+"-") {
				_ = removeBelow(filepath.Join(m.dir, "standby"), e.Name())
			}
		}
	}
	if _, err := os.Stat(filepath.Join(dir, "PG_VERSION")); err != nil {
		_ = removeBelow(filepath.Join(m.dir, "standby"), s.Name)
		tmp := filepath.Join(m.dir, "standby", ".partial-"+s.Name+"-"+fsutil.RandomTag())
		if err := os.Mkdir(tmp, 0o700); err != nil {
			return errs.FromOS(err, tmp, "cannot create the standby's directory")
		}
		cmd := exec.CommandContext(ctx, m.o.Installation.Tool("pg_basebackup"), "-d", s.PrimaryURL, "-D", tmp, "-Fp",
			"-X", "stream", "-R", "-c", "fast")
		cmd.Env = append(os.Environ(), m.o.Installation.Env()...)
		// pg_basebackup dies with serve: a kill -9 must not leave it
		// writing into a directory nobody will rename.
		proc.DieWithParent(cmd)
		if out, err := cmd.CombinedOutput(); err != nil {
			_ = removeBelow(filepath.Join(m.dir, "standby"), filepath.Base(tmp))
			return errs.Wrap(errs.Internal, err, "pg_basebackup of source %q failed: %s", s.Name, strings.TrimSpace(string(out))).
				WithHint("check the primary's URL, its REPLICATION role and pg_hba.conf")
		}
		if o := m.o.User.Owner(); o != nil {
			if err := clone.ChownTree(tmp, o.UID, o.GID); err != nil {
				_ = removeBelow(filepath.Join(m.dir, "standby"), filepath.Base(tmp))
				return errs.FromOS(err, tmp, "cannot give the standby to its user")
			}
		}
		if err := os.Rename(tmp, dir); err != nil {
			return errs.FromOS(err, dir, "cannot put the standby in place")
		}
	}
	if e, err := cluster.Get(m.o.Layout, standbyReg(s.Name)); err == nil && e.State == cluster.Running {
		return nil
	}
	_ = cluster.Down(ctx, m.o.Layout, standbyReg(s.Name), cluster.DownOptions{KeepData: true, Timeout: 10 * time.Second})
	inst := m.o.Installation
	_, err := cluster.StartBranch(ctx, m.o.Layout, cluster.BranchOptions{Name: standbyReg(s.Name), DataDir: dir,
		Kind: kindStandby, Source: "standby of " + s.Name, BinDir: inst.BinDir, Env: inst.Env(), PGVersion: inst.Version,
		PGMajor: inst.Major, User: m.o.User, StartTimeout: 10 * time.Minute})
	return err
}
