package branches

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/pgfork/pgfork/cluster"
	"github.com/pgfork/pgfork/internal/errs"
	"github.com/pgfork/pgfork/internal/fsutil"
)

// Homes: where a branch's files live (docs/branches.md, "Where the data
// goes"). A home is a directory laid out as the state directory's
// branches directory is (snap/, data/, tblspc/), root's and mode 0711.
// The default home is <state>/branches (Branch.Home and Snapshot.Home
// empty). A branch whose data directory the user names (restore --start
// DST: CreateOptions.DataDir) gets a home of its own beside it,
// .DST.pgfork, on DST's filesystem: its origin snapshot is restored
// there, so that the snapshot shares its blocks with the backups and DST
// shares them with the snapshot wherever the backups' filesystem clones,
// whatever filesystem the state directory is on.
//
// A branch and its snapshot always share a home (a reset is a clone); a
// snapshot of a branch and the branches of that snapshot live in the
// branch's home. state.json (in the default home, under its one lock)
// records every branch and snapshot with its home, and every home in use
// (state.Homes) before anything is made in it: the next Open sweeps what
// a crash left in each recorded home as in the default one, and a home
// nothing uses any more is removed.
//
// A named data directory (DST) is never made in place: the snapshot is
// copied into the home's data/NAME, that directory's identity (device,
// inode) is recorded, and only then is it renamed to DST, on the same
// filesystem. A crash leaves either data/NAME (swept) or DST with the
// recorded identity (removed once proven, cluster.RemoveBranchData); a
// directory someone else put at DST is never removed. A reset copies into
// data/NAME, records the new identity beside the old one and exchanges
// the two atomically (RENAME_EXCHANGE).

// homeSuffix ends the name of the home made beside a named data
// directory: .DST.pgfork.
const homeSuffix = ".pgfork"

// fileID identifies a directory (device, inode): what pgfork removes it
// first proves to be what it recorded (docs/SECURITY.md, "Delete only
// what is proven").
type fileID struct {
	Dev uint64 `json:"dev"`
	Ino uint64 `json:"ino"`
}

func (id fileID) zero() bool { return id.Dev == 0 && id.Ino == 0 }

// idOf is the identity of the directory path names (no symlink followed).
func idOf(path string) (fileID, error) {
	fi, err := os.Lstat(path)
	if err != nil {
		return fileID{}, err
	}
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !ok || !fi.IsDir() {
		return fileID{}, fmt.Errorf("%s is not a directory", path)
	}
	return fileID{Dev: uint64(st.Dev), Ino: uint64(st.Ino)}, nil
}

// replacedHome begins the path store gives a home that is no longer the
// directory pgfork made: below /dev/null, where nothing can be opened or
// made, so that every step there fails and nothing is followed.
const replacedHome = "/dev/null/pgfork-home-replaced"

// store is the directory of home ("" : the state directory's branches).
// A home beside a data directory the user named lies in a directory the
// servers' OS user may own: it is used only while its name still leads,
// without a symlink, to the directory pgfork made (its identity, recorded
// by addHome); else every path in it leads nowhere (replacedHome).
func (m *Manager) store(home string) string {
	if home == "" {
		return m.dir
	}
	if want, ok := m.homeIDs.Load(home); ok {
		if got, err := idOf(home); err != nil || got != want.(fileID) {
			return replacedHome + home
		}
	}
	return home
}

// snapPath is snapshot name's data directory in home.
func (m *Manager) snapPath(home, name string) string {
	return filepath.Join(m.store(home), "snap", name)
}

// snapOfBranch is the data directory of branch b's snapshot (in b's home).
func (m *Manager) snapOfBranch(b *Branch) string { return m.snapPath(b.Home, b.Snapshot) }

// snapOf is named snapshot s's data directory.
func (m *Manager) snapOf(s *Snapshot) string { return m.snapPath(s.Home, s.Name) }

// workDir is where branch b's data directory is made: data/NAME in its
// home (renamed to b.DataDir when the user named one).
func (m *Manager) workDir(b *Branch) string { return filepath.Join(m.store(b.Home), "data", b.Name) }

// dataOf is branch b's data directory: the one the user named, or
// data/NAME in its home.
func (m *Manager) dataOf(b *Branch) string {
	if b.DataDir != "" {
		return b.DataDir
	}
	return m.workDir(b)
}

// tblspcOf is where branch b's tablespaces are.
func (m *Manager) tblspcOf(b *Branch) string { return filepath.Join(m.store(b.Home), "tblspc", b.Name) }

// homeFor checks dataDir, a data directory the user names for a new
// branch, and returns it (absolute, its parent's symlinks resolved) with
// the home made beside it. dataDir must not exist. As root, its parent
// and every directory above must belong to root or the servers' OS user
// and be writable by no one else (a sticky directory above the parent,
// as /tmp, is fine): root then follows no path another user can change.
// The home is made (or, left by an earlier branch of the same name,
// reused once checked: a directory, root's) with mode 0711 and its
// snap/, data/ and tblspc/.
func (m *Manager) homeFor(dataDir string) (dst, home string, id fileID, err error) {
	if dst, err = resolveDataDir(dataDir); err != nil {
		return "", "", fileID{}, err
	}
	parent := filepath.Dir(dst)
	if _, err := os.Lstat(dst); err == nil {
		return "", "", fileID{}, errs.New(errs.Exists, "%s already exists", dst).WithPath(dst).
			WithHint("choose a directory that does not exist yet, or remove it")
	} else if !errors.Is(err, fs.ErrNotExist) {
		return "", "", fileID{}, errs.FromOS(err, dst, "cannot check the branch's data directory")
	}
	if why := m.untrustedParent(parent); why != "" {
		return "", "", fileID{}, errs.New(errs.Permission, "%s: %s, so another user could redirect what pgfork, as root, writes and removes there", parent, why).
			WithPath(parent).WithHint("put the data directory in a directory that belongs to root or to the servers' user and that no other user can write, on the backups' filesystem").
			WithCLI("--run-as names the servers' user")
	}
	if fsutil.Within(dst, m.o.Layout.Root) {
		return "", "", fileID{}, errs.New(errs.Usage, "%s is inside pgfork's state directory", dst).WithPath(dst).WithHint("choose a directory outside %s", m.o.Layout.Root)
	}
	home = filepath.Join(parent, "."+filepath.Base(dst)+homeSuffix)
	if err := mkdirPrivate(home); err != nil {
		return "", "", fileID{}, err
	}
	if id, err = idOf(home); err != nil {
		return "", "", fileID{}, errs.FromOS(err, home, "cannot read the branch's home")
	}
	if want, ok := m.homeIDs.Load(home); ok && want.(fileID) != id {
		return "", "", fileID{}, errs.New(errs.Permission, "%s is no longer the directory pgfork made there", home).WithPath(home).
			WithHint("check what is there; remove it to start anew")
	}
	for _, sub := range []string{"snap", "data", "tblspc"} {
		if err := mkdirPrivate(filepath.Join(home, sub)); err != nil {
			return "", "", fileID{}, err
		}
	}
	return dst, home, id, nil
}

// resolveDataDir is the data directory dataDir names: absolute, its
// parent's symlinks resolved (the parent must exist).
func resolveDataDir(dataDir string) (string, error) {
	abs, err := filepath.Abs(dataDir)
	if err != nil {
		return "", errs.Wrap(errs.Usage, err, "bad data directory %q", dataDir)
	}
	parent, err := filepath.EvalSymlinks(filepath.Dir(abs))
	if err != nil {
		return "", errs.FromOS(err, filepath.Dir(abs), "cannot use the directory the branch's data directory goes in")
	}
	return filepath.Join(parent, filepath.Base(abs)), nil
}

// untrustedParent says why a user other than root and the servers' OS
// user could change what dir names ("" when none can, or when pgfork is
// not root: it then acts with its own rights only).
func (m *Manager) untrustedParent(dir string) string {
	if os.Geteuid() != 0 {
		return ""
	}
	uid := uint32(0)
	if m.o.User != nil {
		uid = uint32(m.o.User.UID)
	}
	for p := dir; ; p = filepath.Dir(p) {
		var st unix.Stat_t
		if err := unix.Lstat(p, &st); err != nil {
			return err.Error()
		}
		if st.Mode&unix.S_IFMT != unix.S_IFDIR {
			return fmt.Sprintf("%s is not a directory", p)
		}
		if st.Uid != 0 && st.Uid != uid {
			return fmt.Sprintf("%s belongs to uid %d", p, st.Uid)
		}
		if st.Mode&0o022 != 0 && (p == dir || st.Mode&unix.S_ISVTX == 0) {
			return fmt.Sprintf("others may write %s (mode %o)", p, st.Mode&0o7777)
		}
		if p == filepath.Dir(p) {
			return ""
		}
	}
}

// homes is every home in use: the default one ("") and those recorded.
func (m *Manager) homes() []string { return append([]string{""}, m.st.Homes...) }

// addHome records home (just made by homeFor, with identity id) as in
// use (under the lock, before anything is made in it; the caller saves).
func (m *Manager) addHome(home string, id fileID) {
	if home != "" && !slices.Contains(m.st.Homes, home) {
		m.st.Homes = append(m.st.Homes, home)
		if m.st.HomeIDs == nil {
			m.st.HomeIDs = map[string]fileID{}
		}
		m.st.HomeIDs[home] = id
		m.homeIDs.Store(home, id)
	}
}

// dropUnusedHomes removes the recorded homes no branch or snapshot is in
// any more (under the lock; the caller saves).
func (m *Manager) dropUnusedHomes() {
	used := map[string]bool{}
	for _, b := range m.st.Branches {
		used[b.Home] = true
	}
	for _, s := range m.st.Snapshots {
		used[s.Home] = true
	}
	var keep []string
	for _, h := range m.st.Homes {
		if used[h] || m.pendingIn(h) {
			keep = append(keep, h)
			continue
		}
		if m.store(h) == h {
			_ = removeBelow(filepath.Dir(h), filepath.Base(h))
		}
		delete(m.st.HomeIDs, h)
		m.homeIDs.Delete(h)
	}
	m.st.Homes = keep
	m.dropUnusedStores()
}

// pendingIn says whether a snapshot is being built in home (CreateSnapshot
// records it only once built).
func (m *Manager) pendingIn(home string) bool {
	for _, h := range m.pendingHome {
		if h == home {
			return true
		}
	}
	return false
}

// placeData moves branch b's data directory, just copied into its home's
// data/NAME, to the directory the user named (b.DataDir): its identity is
// recorded first (saved), so that whatever a crash leaves is proven ours
// before it is removed. With replace (a reset), the new copy and the
// branch's data directory are exchanged atomically: the old one is then
// in data/NAME, for the caller to remove (after the branch's start).
func (m *Manager) placeData(b *Branch, replace bool) error {
	work := m.workDir(b)
	id, err := idOf(work)
	if err != nil {
		return errs.FromOS(err, work, "cannot read the branch's new data directory")
	}
	m.mu.Lock()
	b.PrevID, b.DataID = b.DataID, id
	if !replace {
		b.PrevID = fileID{}
	}
	err = m.save()
	m.mu.Unlock()
	if err != nil {
		return err
	}
	if replace {
		if err := swapDirs(work, b.DataDir); err != nil {
			return errs.FromOS(err, b.DataDir, "cannot put the branch's new data directory in place")
		}
		// work now holds the old data directory.
	} else if err := fsutil.RenameNoReplace(work, b.DataDir); err != nil {
		if errors.Is(err, fs.ErrExist) {
			return errs.New(errs.Exists, "%s appeared while the branch was made", b.DataDir).WithPath(b.DataDir).
				WithHint("choose a directory that does not exist, or remove it")
		}
		return errs.FromOS(err, b.DataDir, "cannot put the branch's data directory in place")
	}
	if err := fsutil.SyncDir(filepath.Dir(b.DataDir)); err != nil {
		return errs.FromOS(err, filepath.Dir(b.DataDir), "cannot sync the data directory's parent")
	}
	m.mu.Lock()
	b.PrevID = fileID{}
	err = m.save()
	m.mu.Unlock()
	return err
}

// removeNamedData removes the data directory the user named for branch b
// (its server stopped), only when it is proven to be one pgfork put there
// (its recorded identity, or the one a reset was replacing); something
// else there is left alone.
func (m *Manager) removeNamedData(b *Branch) {
	if b.DataDir == "" {
		return
	}
	for _, id := range []fileID{b.DataID, b.PrevID} {
		if id.zero() {
			continue
		}
		if got, err := idOf(b.DataDir); err == nil && got == id {
			_ = cluster.RemoveBranchData(b.DataDir, id.Dev, id.Ino)
			return
		}
	}
}

// snapDir, branchDir and tblspcDir are the places of snapshot, branch
// and tablespaces named so in the default home.
func (m *Manager) snapDir(name string) string   { return m.snapPath("", name) }
func (m *Manager) branchDir(name string) string { return filepath.Join(m.dir, "data", name) }
func (m *Manager) tblspcDir(name string) string { return filepath.Join(m.dir, "tblspc", name) }

// swapDirs swaps the directories next and dst (both existing, on one
// filesystem): atomically where the filesystem can, else the old one
// aside, the new one in, the old one to next.
func swapDirs(next, dst string) error {
	ok, err := fsutil.Exchange(next, dst)
	if err != nil || ok {
		return err
	}
	aside := next + ".old"
	if err := os.Rename(dst, aside); err != nil {
		return err
	}
	if err := os.Rename(next, dst); err != nil {
		_ = os.Rename(aside, dst)
		return err
	}
	return os.Rename(aside, next)
}
