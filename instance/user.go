package instance

import (
	"context"
	"os"
	"os/exec"
	"os/user"
	"strconv"
	"syscall"

	"github.com/pgfork/pgfork/clone"
	"github.com/pgfork/pgfork/internal/errs"
)

// DefaultRunAs is the OS user initdb and postgres run as when pgfork runs as root.
const DefaultRunAs = "postgres"

// OSUser is the unprivileged OS user PostgreSQL runs as when pgfork is root.
// A nil *OSUser means "the current user" (pgfork is not root).
type OSUser struct {
	Name     string
	UID, GID int
}

// ResolveUser returns the OS user to run PostgreSQL as. When pgfork is not
// root it returns nil (run as ourselves). As root it looks up name (default
// "postgres") and refuses root itself, which PostgreSQL would refuse too.
func ResolveUser(name string) (*OSUser, error) {
	if os.Geteuid() != 0 {
		return nil, nil
	}
	if name == "" {
		name = DefaultRunAs
	}
	u, err := user.Lookup(name)
	if err != nil {
		return nil, errs.Wrap(errs.NotFound, err, "OS user %q to run PostgreSQL as was not found", name).
			WithHint("PostgreSQL refuses to run as root: create the user (useradd -r %s) or name another one to run it as", name).WithCLI("--run-as USER")
	}
	uid, _ := strconv.Atoi(u.Uid)
	gid, _ := strconv.Atoi(u.Gid)
	if uid == 0 {
		return nil, errs.New(errs.Usage, "cannot run PostgreSQL as %q: it is root", name).
			WithHint("run PostgreSQL as an unprivileged user, e.g. postgres").WithCLI("--run-as postgres")
	}
	return &OSUser{Name: name, UID: uid, GID: gid}, nil
}

// passEnv are the only variables of pgfork's own environment that reach
// the PostgreSQL programs it runs (see MinimalEnv).
var passEnv = []string{"PATH", "TZ", "TMPDIR", "LANG"}

// MinimalEnv returns the environment for a PostgreSQL program pgfork runs:
// PATH, TZ, TMPDIR and LANG from pgfork's environment, LC_ALL=C, then env
// (the installation's library path, PG* variables the caller sets). Nothing
// else of pgfork's environment is passed: a server's environment is
// readable by its OS user and by every database superuser
// (pg_read_file('/proc/self/environ')), and pgfork's may hold secrets
// (tokens, passwords).
func MinimalEnv(env []string) []string {
	out := make([]string, 0, len(passEnv)+len(env)+1)
	for _, k := range passEnv {
		if v, ok := os.LookupEnv(k); ok {
			out = append(out, k+"="+v)
		}
	}
	if _, ok := os.LookupEnv("PATH"); !ok {
		out = append(out, "PATH=/usr/local/bin:/usr/bin:/bin")
	}
	out = append(out, "LC_ALL=C")
	return append(out, env...)
}

// NameOrEmpty returns u's login name, or "" when u is nil (pgfork runs
// tools as itself).
func (u *OSUser) NameOrEmpty() string {
	if u == nil {
		return ""
	}
	return u.Name
}

// Command returns an exec.Cmd that runs as u (or as the current user when u
// is nil), with MinimalEnv(env) as its environment and a working directory
// the user can enter.
func (u *OSUser) Command(ctx context.Context, env []string, name string, args ...string) *exec.Cmd {
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Env = MinimalEnv(env)
	cmd.Dir = "/"
	if u != nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: uint32(u.UID), Gid: uint32(u.GID)}}
		cmd.Env = append(cmd.Env, "HOME=/", "USER="+u.Name, "LOGNAME="+u.Name)
	}
	return cmd
}

// Chown gives path (recursively) to u without following symlinks, by
// directory descriptors (clone.ChownTree): a directory the run-as user
// swaps for a symlink during the walk is never followed. It does nothing
// when u is nil.
func (u *OSUser) Chown(path string) error {
	if u == nil {
		return nil
	}
	return clone.ChownTree(path, u.UID, u.GID)
}

// MkdirOwned creates dir (mode perm) owned by u. The mode and owner are
// set by descriptor on dir opened without following a symlink, so a name
// swapped for a symlink is refused rather than followed.
func (u *OSUser) MkdirOwned(dir string, perm os.FileMode) error {
	if err := os.MkdirAll(dir, perm); err != nil {
		return err
	}
	fd, err := syscall.Open(dir, syscall.O_RDONLY|syscall.O_DIRECTORY|syscall.O_NOFOLLOW|syscall.O_CLOEXEC, 0)
	if err != nil {
		return &os.PathError{Op: "open", Path: dir, Err: err}
	}
	defer syscall.Close(fd)
	if err := syscall.Fchmod(fd, uint32(perm.Perm())); err != nil {
		return &os.PathError{Op: "chmod", Path: dir, Err: err}
	}
	if u != nil {
		if err := syscall.Fchown(fd, u.UID, u.GID); err != nil {
			return &os.PathError{Op: "chown", Path: dir, Err: err}
		}
	}
	return nil
}

// Owner returns u as the owner clone gives copied files to; nil (keep the
// copier's own) when u is nil. The one conversion from an OS user to a
// file owner.
func (u *OSUser) Owner() *clone.Owner {
	if u == nil {
		return nil
	}
	return &clone.Owner{UID: u.UID, GID: u.GID}
}

// OwnerOf returns the OS user that owns path (following symlinks: a data
// directory may be one), by uid and name. A uid without a name in the user database is
// errs.NotFound.
func OwnerOf(path string) (*OSUser, error) {
	fi, err := os.Stat(path)
	if err != nil {
		return nil, errs.FromOS(err, path, "cannot read the owner")
	}
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !ok {
		return nil, errs.New(errs.Unsupported, "this platform does not report file owners").WithPath(path)
	}
	u, err := user.LookupId(strconv.FormatUint(uint64(st.Uid), 10))
	if err != nil {
		return nil, errs.Wrap(errs.NotFound, err, "the owner (uid %d) has no user name", st.Uid).WithPath(path)
	}
	return &OSUser{Name: u.Username, UID: int(st.Uid), GID: int(st.Gid)}, nil
}

// CheckDataOwner is the one rule for which OS user runs a cluster made
// from data pgfork did not write (a clone's source, a backup): as root, the
// data at path must belong to root (pgfork's own user) or to the user its
// copy is given to and run as (owner, the run-as user); data of any other
// user is refused, never run as the run-as user. A cluster's superuser can
// make its server load code and run commands (preload libraries, archive
// and restore commands, per-database settings in its catalogs): run as the
// run-as user, another user's data would run that user's code as postgres.
// Not root, or owner nil, it allows everything: pgfork then runs servers
// with its own rights only.
func CheckDataOwner(path string, owner *clone.Owner) error {
	if os.Geteuid() != 0 || owner == nil {
		return nil
	}
	fi, err := os.Stat(path)
	if err != nil {
		return errs.FromOS(err, path, "cannot read the owner")
	}
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !ok || st.Uid == 0 || int(st.Uid) == owner.UID {
		return nil
	}
	who := "uid " + strconv.FormatUint(uint64(st.Uid), 10)
	name := ""
	if u, err := user.LookupId(strconv.FormatUint(uint64(st.Uid), 10)); err == nil {
		name = u.Username
		who = "OS user " + name + " (" + who + ")"
	}
	runAs := "uid " + strconv.Itoa(owner.UID)
	if u, err := user.LookupId(strconv.Itoa(owner.UID)); err == nil {
		runAs = u.Username
	}
	e := errs.New(errs.Permission, "this data belongs to %s, not to %s, who would run its copy: as root, pgfork never runs another user's data as %s (its settings and catalogs could make the server run that user's code)", who, runAs, runAs).
		WithPath(path)
	if name == "" {
		return e.WithHint("give the data to the user who should run it, or copy it as its owner")
	}
	return e.WithHint("run the copy as its owner %s, or copy it as %s", name, name).WithCLI("--run-as %s", name)
}
