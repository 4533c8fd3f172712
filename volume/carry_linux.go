package volume

// What a new volume takes over from the state directory it moves, and what
// stops the move. A volume moves pgfork's state: from the moment its record
// is written every pgfork command uses <base>/volume/state. Whatever runs
// from the old state then has no pgfork to list, stop or remove it (issue
// 32, F18), so Create refuses while anything does (checkIdle); what is
// stopped and safe to take along, the managed PostgreSQL builds and the
// cached templates, is copied onto the volume before the record is written
// and removed from the old state after (carry, dropCarried).

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"

	"github.com/pgfork/pgfork/clone"
	"github.com/pgfork/pgfork/cluster"
	"github.com/pgfork/pgfork/internal/errs"
	"github.com/pgfork/pgfork/internal/flock"
	"github.com/pgfork/pgfork/internal/fsutil"
	"github.com/pgfork/pgfork/internal/proc"
	"github.com/pgfork/pgfork/internal/safefs"
	"github.com/pgfork/pgfork/internal/servelock"
	"github.com/pgfork/pgfork/internal/statedir"
	"github.com/pgfork/pgfork/template"
)

// installLock is pgbin's install lock, which the move holds (with serve's,
// servelock.LockPath) so that no `pgfork pg install` writes into the old
// state meanwhile.
const installLock = "install.lock"

// serverDirs are the directories of the state directory where pgfork serve
// runs PostgreSQL servers (its managed server, a cluster per test, the
// branches): a server still running there (a serve killed with -9) blocks
// the move like a running serve.
var serverDirs = []string{"serve", "serve-clusters", "branches"}

// checkIdle takes the old state directory base for the move: it returns
// errs.Busy naming everything pgfork runs from it (clusters of `pgfork up`,
// branches, restores; a pgfork serve; servers a killed serve left; a
// `pgfork pg install`), and otherwise holds the serve and install locks
// until release is called.
func checkIdle(base string) (release func(), err error) {
	lay := statedir.Layout{Root: base}
	var held []*flock.Lock
	release = func() {
		for _, l := range held {
			l.Unlock()
		}
	}
	var busy, steps []string
	serveBusy := false
	if l, err := flock.TryExclusive(servelock.LockPath(lay)); err == nil {
		held = append(held, l)
	} else if errors.Is(err, flock.ErrBusy) {
		who := "pgfork serve"
		if o, ok := servelock.Find(lay); ok {
			who += " (" + o.String() + ")"
		}
		busy, serveBusy = append(busy, who), true
	} else if !errors.Is(err, fs.ErrNotExist) {
		release()
		return nil, errs.FromOS(err, lay.Locks(), "cannot lock the state directory")
	}
	for _, d := range serverDirs {
		for _, dd := range runningServers(filepath.Join(base, d), 3) {
			busy, serveBusy = append(busy, "a PostgreSQL server of pgfork serve on "+dd), true
		}
	}
	if serveBusy {
		steps = append(steps, "stop pgfork serve")
	}
	if n := recordedBranches(base); n != "" {
		busy = append(busy, n)
		steps = append(steps, "delete the branches and snapshots (`pgfork branch rm`, with serve running)")
	}
	ents, err := os.ReadDir(lay.Clusters())
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		release()
		return nil, errs.FromOS(err, lay.Clusters(), "cannot read the clusters directory")
	}
	var clusters []string
	for _, e := range ents {
		if e.IsDir() && !strings.HasPrefix(e.Name(), ".") {
			clusters = append(clusters, fmt.Sprintf("%s (%s)", e.Name(), cluster.StateOf(lay, e.Name())))
		}
	}
	if len(clusters) > 0 {
		busy = append(busy, "cluster "+strings.Join(clusters, ", cluster "))
		steps = append(steps, "`pgfork down --all` (it stops and removes them: keep what you need first)")
	}
	if l, err := flock.TryExclusive(filepath.Join(lay.Locks(), installLock)); err == nil {
		held = append(held, l)
	} else if errors.Is(err, flock.ErrBusy) {
		busy = append(busy, "a `pgfork pg install`")
		steps = append(steps, "wait for `pgfork pg install` to finish")
	} else if !errors.Is(err, fs.ErrNotExist) {
		release()
		return nil, errs.FromOS(err, lay.Locks(), "cannot lock the state directory")
	}
	if len(busy) == 0 {
		return release, nil
	}
	release()
	return nil, errs.New(errs.Busy, "cannot move pgfork's state onto a reflink volume while pgfork runs from it: %s", strings.Join(busy, "; ")).
		WithPath(base).
		WithHint("a volume moves the state: they would be left with no pgfork to list, stop or remove them (installed PostgreSQL builds and templates are carried over)").
		WithCLI("%s, then try again", strings.Join(steps, ", then "))
}

// runningServers lists the data directories below dir (depth levels at
// most, symlinks never followed, no data directory descended into) whose
// postmaster.pid names a live process.
func runningServers(dir string, depth int) []string {
	ents, err := os.ReadDir(dir)
	if err != nil {
		return nil
	}
	var out []string
	names := map[string]bool{}
	for _, e := range ents {
		names[e.Name()] = true
	}
	if names["PG_VERSION"] {
		if names["postmaster.pid"] && pidFileAlive(dir) {
			out = append(out, dir)
		}
		return out
	}
	if depth == 0 {
		return nil
	}
	for _, e := range ents {
		if e.IsDir() { // DirEntry from readdir: a symlink is not a directory here
			out = append(out, runningServers(filepath.Join(dir, e.Name()), depth-1)...)
		}
	}
	return out
}

// pidFileAlive reads dataDir/postmaster.pid through safefs (no symlink
// followed, no FIFO blocked on: the PostgreSQL user owns the directory)
// and reports whether the process it names runs; an unreadable file
// counts as running, as for PostgreSQL itself.
func pidFileAlive(dataDir string) bool {
	d, err := safefs.OpenDir(dataDir)
	if err != nil {
		return true
	}
	defer d.Close()
	b, err := d.ReadFile("postmaster.pid", 4096)
	if err != nil {
		return !errors.Is(err, fs.ErrNotExist)
	}
	line, _, _ := strings.Cut(string(b), "\n")
	pid, err := strconv.Atoi(strings.TrimSpace(line))
	if err != nil {
		return true // being written: a server starting
	}
	if pid < 0 {
		pid = -pid
	}
	return proc.Alive(pid)
}

// recordedBranches says how many branches and snapshots pgfork serve
// recorded in base (they live in its branches/ and are not carried), or "".
func recordedBranches(base string) string {
	b, err := os.ReadFile(filepath.Join(base, "branches", "state.json"))
	if err != nil {
		return ""
	}
	var st struct {
		Snapshots []struct{ Name string } `json:"snapshots"`
		Branches  []struct{ Name string } `json:"branches"`
	}
	if json.Unmarshal(b, &st) != nil {
		return "pgfork serve's branches (" + filepath.Join(base, "branches", "state.json") + " is unreadable)"
	}
	var names []string
	for _, x := range st.Branches {
		names = append(names, x.Name)
	}
	switch {
	case len(names) > 0:
		return fmt.Sprintf("pgfork serve's branches %s (and %d snapshots)", strings.Join(names, ", "), len(st.Snapshots))
	case len(st.Snapshots) > 0:
		return fmt.Sprintf("%d snapshots of pgfork serve's branches", len(st.Snapshots))
	}
	return ""
}

// carry copies the managed PostgreSQL builds and the cached templates of the
// old state directory base into state, the state directory on the new
// volume (mounted, not recorded yet). Each is copied whole (staged, then
// renamed into place) with its owners and modes; the old ones stay until
// dropCarried. The caller holds the install lock (checkIdle).
func carry(ctx context.Context, base, state string, say func(string, ...any)) error {
	var installs, keys []string
	old, lay := statedir.Layout{Root: base}, statedir.Layout{Root: state}
	ents, err := os.ReadDir(old.Installs())
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return errs.FromOS(err, old.Installs(), "cannot read the installed PostgreSQL builds")
	}
	for _, e := range ents {
		if e.IsDir() && !strings.HasPrefix(e.Name(), ".") {
			installs = append(installs, e.Name())
		}
	}
	tmpls, err := template.List(old)
	if err != nil {
		return err
	}
	for _, m := range tmpls {
		keys = append(keys, m.Key)
	}
	sort.Strings(keys)
	if len(installs) == 0 && len(keys) == 0 {
		return nil
	}
	if err := lay.Ensure(); err != nil {
		return errs.FromOS(err, state, "cannot create the state directory on the volume")
	}
	for _, v := range installs {
		say("carrying PostgreSQL %s over onto the volume", v)
		if _, err := clone.Copy(ctx, filepath.Join(old.Installs(), v), filepath.Join(lay.Installs(), v), clone.Options{}); err != nil {
			return errs.Wrap(errs.KindOf(err), err, "cannot carry PostgreSQL %s over onto the volume", v)
		}
	}
	for _, k := range keys {
		say("carrying template %s over onto the volume", k)
		if _, err := clone.Copy(ctx, filepath.Join(old.Templates(), k), filepath.Join(lay.Templates(), k), clone.Options{}); err != nil {
			return errs.Wrap(errs.KindOf(err), err, "cannot carry template %s over onto the volume", k)
		}
	}
	return nil
}

// dropCarried removes from the old state directory base the builds and
// templates that state (on the volume, recorded) has too: what carry copied,
// also when a crash came between the record and the removal. A template in
// use is left (said); it is never used again from there.
func dropCarried(ctx context.Context, base, state string, say func(string, ...any)) {
	old, lay := statedir.Layout{Root: base}, statedir.Layout{Root: state}
	ents, _ := os.ReadDir(old.Installs())
	for _, e := range ents {
		if !e.IsDir() || strings.HasPrefix(e.Name(), ".") {
			continue
		}
		if fi, err := os.Lstat(filepath.Join(lay.Installs(), e.Name(), "bin")); err != nil || !fi.IsDir() {
			continue
		}
		if err := fsutil.RemoveAll(filepath.Join(old.Installs(), e.Name())); err != nil {
			say("could not remove the old copy of PostgreSQL %s: %v", e.Name(), err)
		}
	}
	tmpls, _ := template.List(old)
	for _, m := range tmpls {
		if _, err := os.Lstat(filepath.Join(lay.Templates(), m.Key, "meta.json")); err != nil {
			continue
		}
		if err := template.Remove(ctx, old, m.Key); err != nil {
			say("could not remove the old copy of template %s: %v", m.Key, err)
		}
	}
}
