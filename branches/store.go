package branches

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"

	"golang.org/x/sys/unix"

	"github.com/pgfork/pgfork/clone"
	"github.com/pgfork/pgfork/internal/errs"
)

// Branch stores (docs/branches.md, "Where the data goes"): a create from
// a source that names no data directory, when the source's filesystem
// clones and the state directory is on another one, puts the branch in a
// store beside the source, <parent of the source>/.pgfork-branches, with
// NAME as its data directory and .NAME.pgfork as its home: the path a
// data directory the user names takes (homeFor, placeData,
// removeNamedData), so the branch is a clone of the source instead of a
// copy onto the state directory's filesystem. Only where
// Options.BranchStore allows it (pgfork branch on this machine; never a
// serve's tenants, docs/SECURITY.md).
//
// The store is made by pgfork (mkdir, never following a planted name),
// the servers' user's, mode 0700, in a parent that, as root, only root or
// that user may change (untrustedParent); its identity is recorded
// (state.Stores) with the branch, and it is removed, once no home is left
// in it, when it is still that directory and empty (rmdir).

// storeName is the branch store's name in the source's parent directory:
// hidden, as the homes beside a named data directory are, and named for
// pgfork so that whoever lists the directory knows whose it is.
const storeName = ".pgfork-branches"

// storePlan is where a create from a source goes when it names no data
// directory: a branch store (Dir, with its data directory and home made
// by homeFor), or none (Dir empty; Why, when set, says why the store
// was not used though the copy crosses filesystems: Notice.NoStore).
type storePlan struct {
	Dir     string
	ID      fileID
	DataDir string
	Home    string
	HomeID  fileID
	Why     string
}

// sample is where source s's data is read from, for a notice and a
// store: from (its data directory, or its backup chain, or its full
// backup), a regular file of it (sample: PG_VERSION of the data directory
// or of the full backup) and, for a backup source, its backups (dirs).
func (s Source) sample() (from, sample string, dirs []string, err error) {
	from, sample = s.DataDir, filepath.Join(s.DataDir, "PG_VERSION")
	if s.Kind == SourceBackup {
		if dirs, err = s.backupDirs(); err != nil {
			return "", "", nil, err
		}
		if len(dirs) == 0 {
			return "", "", nil, errs.New(errs.NotFound, "source %q holds no backup", s.Name)
		}
		from, sample = dirs[0], filepath.Join(dirs[0], "PG_VERSION")
		if s.Chain != "" {
			from = s.Chain
		}
	}
	return from, sample, dirs, nil
}

// planStore decides where a branch named name of source s goes when no
// data directory is named (under the lock): in the branch store beside
// the source when the source's filesystem clones, the state directory is
// on another one and the store can be used (made, or reused once
// checked, with the branch's home in it); else nowhere new, with why when
// a copy across filesystems follows.
func (m *Manager) planStore(ctx context.Context, s Source, name string) storePlan {
	if !m.o.BranchStore || s.Kind == SourceStandby {
		return storePlan{}
	}
	from, sample, _, err := s.sample()
	if err != nil {
		return storePlan{}
	}
	if c, err := clone.CrossesFS(ctx, sample, m.dir); err != nil || c == nil {
		return storePlan{} // a clone already (or cannot tell): the state directory
	}
	abs, err := filepath.Abs(from)
	if err != nil {
		return storePlan{Why: err.Error()}
	}
	parent, err := filepath.EvalSymlinks(filepath.Dir(abs))
	if err != nil {
		return storePlan{Why: err.Error()}
	}
	dir := filepath.Join(parent, storeName)
	if why := m.untrustedParent(parent); why != "" {
		return storePlan{Why: fmt.Sprintf("%s: %s, so another user could redirect what pgfork, as root, writes there", dir, why)}
	}
	id, made, err := m.makeStore(dir)
	if err != nil {
		return storePlan{Why: err.Error()}
	}
	fail := func(why string) storePlan {
		if made {
			dropStore(dir, id)
		}
		return storePlan{Why: why}
	}
	if c, err := clone.CrossesFS(ctx, sample, dir); err != nil {
		return fail(err.Error())
	} else if c != nil {
		return fail(fmt.Sprintf("%s is on another filesystem (%s) than %s (%s)", dir, c.DstFS, from, c.SrcFS))
	}
	if p, err := clone.Probe(ctx, dir, dir); err != nil {
		return fail(err.Error())
	} else if !p.Clone {
		return fail(fmt.Sprintf("the filesystem of %s (%s) does not clone", dir, p.FSType))
	}
	dataDir, home, homeID, err := m.homeFor(filepath.Join(dir, name))
	if err != nil {
		return fail(err.Error())
	}
	return storePlan{Dir: dir, ID: id, DataDir: dataDir, Home: home, HomeID: homeID}
}

// makeStore makes the branch store dir (its parent checked) or reuses
// the one there once checked: a directory (no symlink followed), the
// servers' user's (pgfork's own when it runs them), mode 0700. made says
// whether this call made it.
func (m *Manager) makeStore(dir string) (id fileID, made bool, err error) {
	uid, gid := os.Geteuid(), os.Getegid()
	if m.o.User != nil {
		uid, gid = m.o.User.UID, m.o.User.GID
	}
	if err := unix.Mkdir(dir, 0o700); err == nil {
		made = true
	} else if !errors.Is(err, unix.EEXIST) {
		return fileID{}, false, errs.FromOS(err, dir, "cannot make the branch store")
	}
	fd, err := unix.Open(dir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return fileID{}, false, errs.New(errs.Permission, "%s is not a directory", dir).WithPath(dir)
	}
	defer unix.Close(fd)
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return fileID{}, false, errs.FromOS(err, dir, "cannot read the branch store")
	}
	id = fileID{Dev: uint64(st.Dev), Ino: uint64(st.Ino)}
	if !made {
		if int(st.Uid) != uid {
			return fileID{}, false, errs.New(errs.Permission, "%s belongs to uid %d, not to the servers' user", dir, st.Uid).WithPath(dir)
		}
		if st.Mode&0o077 != 0 {
			return fileID{}, false, errs.New(errs.Permission, "%s is open to others (mode %o)", dir, st.Mode&0o7777).WithPath(dir)
		}
		return id, false, nil
	}
	if int(st.Uid) != uid {
		if err := unix.Fchown(fd, uid, gid); err != nil {
			dropStore(dir, id)
			return fileID{}, false, errs.FromOS(err, dir, "cannot give the branch store to the servers' user")
		}
	}
	if err := unix.Fchmod(fd, 0o700); err != nil {
		dropStore(dir, id)
		return fileID{}, false, errs.FromOS(err, dir, "cannot make the branch store private")
	}
	return id, true, nil
}

// dropStore removes the branch store dir when it is still the directory
// of identity id and empty (rmdir: never what is in it).
func dropStore(dir string, id fileID) {
	if got, err := idOf(dir); err == nil && got == id {
		_ = unix.Rmdir(dir)
	}
}

// addStore records the branch store dir (identity id) as in use (under
// the lock; the caller saves).
func (m *Manager) addStore(dir string, id fileID) {
	if dir == "" {
		return
	}
	if m.st.Stores == nil {
		m.st.Stores = map[string]fileID{}
	}
	m.st.Stores[dir] = id
}

// dropUnusedStores removes the recorded branch stores no home and no
// branch is in any more (under the lock, after dropUnusedHomes; the
// caller saves): each only when still the directory recorded and empty.
func (m *Manager) dropUnusedStores() {
	for dir, id := range m.st.Stores {
		if slices.ContainsFunc(m.st.Homes, func(h string) bool { return filepath.Dir(h) == dir }) ||
			slices.ContainsFunc(m.st.Branches, func(b *Branch) bool { return b.Store == dir }) {
			continue
		}
		dropStore(dir, id)
		delete(m.st.Stores, dir)
	}
}
