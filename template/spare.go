package template

// Spare copies. Copying a template's ~1,000 files is most of what `pgfork up`
// costs, so up keeps a few copies of each template ready ("spares"), made
// in the background, and claims one with a single rename:
//
//	<state>/clusters/.spare-<key>-<rand>       a ready copy of templates/<key>/data
//	<state>/clusters/.sparebuild-<key>-<rand>  a copy being made (never claimed)
//	<state>/locks/spare-<key>.lock             held by the one refiller of a key
//	<state>/locks/spare-<key>.wait             held by the refiller waiting for it
//	<state>/locks/spares.fg                    shared by each up while it runs
//
// Spares are background work and an up is foreground work: a `pgfork up`
// that finds no spare copies the template itself, and must not be slower
// for the spares. From its start until its server is ready, every up holds
// the .fg lock shared (Foreground), and every refiller pauses meanwhile — it
// cancels the copy it is making (removed when the refill ends) and starts
// none until the lock is free. The refiller also runs at background CPU and
// I/O priority (the CLI's, see proc.Background).
//
// A spare is built under its .sparebuild- name and renamed to its .spare-
// name only when complete and only if its template is still the one it was
// copied from (checked under the template's shared lock), so a claimable
// spare is never half-built and never outlives its template: Remove deletes a
// template's spares under the template's exclusive lock, and claims happen
// under the shared lock. rename(2) is atomic, so two claims of one spare
// cannot both succeed. Leftovers of a killed refiller (.sparebuild- dirs whose
// key's refill lock is free) and spares of templates that no longer exist are
// removed by CleanSpares.

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/pgfork/pgfork/clone"
	"github.com/pgfork/pgfork/internal/errs"
	"github.com/pgfork/pgfork/internal/flock"
	"github.com/pgfork/pgfork/internal/fsutil"
	"github.com/pgfork/pgfork/internal/statedir"
	"github.com/pgfork/pgfork/internal/units"
)

const (
	spareTag      = ".spare-"
	spareBuildTag = ".sparebuild-"
	spareTrashTag = ".trash-spare-"
)

func spareLockPath(lay statedir.Layout, key string) string {
	return filepath.Join(lay.Locks(), "spare-"+key+".lock")
}

func spareFgPath(lay statedir.Layout) string {
	return filepath.Join(lay.Locks(), "spares.fg")
}

// fgPoll is how often a refiller's copy checks for an up at work.
const fgPoll = 2 * time.Millisecond

// errYield ends a spare copy that an up preempted.
var errYield = errors.New("a pgfork up is at work")

// Foreground says that the caller is an up at work (it may copy a template
// itself and then starts a server) until release is called: every refill
// pauses meanwhile, so background copies do not compete with it for the
// disk and CPU. Best effort: if the lock cannot be taken, nothing pauses.
func Foreground(ctx context.Context, lay statedir.Layout) (release func()) {
	l, err := flock.Shared(ctx, spareFgPath(lay))
	if errors.Is(err, fs.ErrNotExist) && lay.Ensure() == nil {
		l, err = flock.Shared(ctx, spareFgPath(lay))
	}
	if err != nil {
		return func() {}
	}
	return l.Unlock
}

// foregroundBusy reports whether an up is at work.
func foregroundBusy(lay statedir.Layout) bool {
	l, err := flock.TryExclusive(spareFgPath(lay))
	if err != nil {
		return errors.Is(err, flock.ErrBusy)
	}
	l.Unlock()
	return false
}

// waitForeground waits until no up is at work.
func waitForeground(ctx context.Context, lay statedir.Layout) error {
	l, err := flock.Exclusive(ctx, spareFgPath(lay))
	if err != nil {
		return lockErr(ctx, err, spareFgPath(lay))
	}
	l.Unlock()
	return nil
}

func spareWaitPath(lay statedir.Layout, key string) string {
	return filepath.Join(lay.Locks(), "spare-"+key+".wait")
}

// spareKey returns the template key of a clusters/ entry named
// <tag><key>-<rand>, or "" when name is not one.
func spareKey(name, tag string) string {
	rest, ok := strings.CutPrefix(name, tag)
	if !ok {
		return ""
	}
	key, _, ok := strings.Cut(rest, "-")
	if !ok || len(key) != KeyLen || !validKey(key) {
		return ""
	}
	return key
}

// spares returns the paths of the claimable spares, by template key.
func spares(lay statedir.Layout) (map[string][]string, error) {
	ents, err := os.ReadDir(lay.Clusters())
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	out := map[string][]string{}
	for _, e := range ents {
		if k := spareKey(e.Name(), spareTag); k != "" && e.IsDir() {
			out[k] = append(out[k], filepath.Join(lay.Clusters(), e.Name()))
		}
	}
	return out, nil
}

// SpareCount returns how many claimable spares each template key has.
func SpareCount(lay statedir.Layout) map[string]int {
	all, _ := spares(lay)
	n := map[string]int{}
	for k, s := range all {
		n[k] = len(s)
	}
	return n
}

// ClaimSpare moves one of the template's spares to dst (which must not
// exist) and returns the spare's name, or "" when none was ready. The
// caller holds the template (from Get), so the spare cannot be removed
// under it. A spare another process claimed first is skipped.
func (t *Template) ClaimSpare(lay statedir.Layout, dst string) (string, error) {
	all, err := spares(lay)
	if err != nil {
		return "", errs.FromOS(err, lay.Clusters(), "cannot read the clusters directory")
	}
	cands := all[t.Key]
	// Start at a different spare in each process, so that parallel
	// claims do not all race for the first one.
	off := os.Getpid()
	for i := range cands {
		src := cands[(off+i)%len(cands)]
		err := os.Rename(src, dst)
		if err == nil {
			return filepath.Base(src), nil
		}
		if !errors.Is(err, fs.ErrNotExist) {
			return "", errs.Wrap(errs.Internal, err, "cannot claim a spare copy of the template").WithPath(src)
		}
	}
	return "", nil
}

// MaxSpares bounds RefillOptions.Spares (and pgfork up --spares). A spare
// only pays off for the `pgfork up` calls that come faster than one copy
// takes (tens of milliseconds to a second): a few cover any realistic burst
// (parallel CI jobs on one host), and every spare is a full data directory
// on disk where the filesystem cannot share blocks. 16 is well above
// useful and well below "fill the disk".
const MaxSpares = 16

// Free-space margin of the refill: a spare copy is not started when the
// free space left after it would be below max(SpareMinFreeBytes,
// SpareMinFreePercent of the filesystem). Spares are a convenience; the disk
// they share is not theirs to fill.
const (
	SpareMinFreeBytes   = 1 << 30
	SpareMinFreePercent = 10
)

// RefillOptions say how many spares to keep and who owns them.
type RefillOptions struct {
	// Spares is how many claimable spares the template should have.
	Spares int
	// Owner owns the copied files (nil: the current user).
	Owner *clone.Owner
	// Wait bounds the wait for another refiller of the same key.
	Wait time.Duration
	// MinFree overrides the free-space margin (bytes that must stay free
	// after a spare copy); 0: max(SpareMinFreeBytes, SpareMinFreePercent
	// of the filesystem); negative: no margin (the copy runs until the
	// disk is full; tests of the ENOSPC path).
	MinFree int64
	// OnSkip, when set, is told why the refill stopped early (margin).
	OnSkip func(reason string)
}

// Refill makes spares of template key until it has o.Spares of them. Only
// one refiller per key works at a time; one more may wait for it (it
// recounts once the first is done, so a spare claimed meanwhile is
// replaced); any further caller returns at once, since the waiting one will
// do its work. It returns how many spares it made. A template that is gone
// (or removed while being copied) ends the refill without error.
func Refill(ctx context.Context, lay statedir.Layout, key string, o RefillOptions) (int, error) {
	if !validKey(key) || len(key) != KeyLen {
		return 0, errs.New(errs.Usage, "%q is not a template key", key).WithCLI("see `pgfork template ls`")
	}
	if o.Spares <= 0 {
		return 0, nil
	}
	if o.Spares > MaxSpares {
		return 0, errs.New(errs.Usage, "%d spares is more than the limit of %d", o.Spares, MaxSpares).
			WithHint("keep at most %d spares per template", MaxSpares)
	}
	if err := lay.Ensure(); err != nil {
		return 0, errs.FromOS(err, lay.Root, "cannot create the state directory")
	}
	wait, err := flock.TryExclusive(spareWaitPath(lay, key))
	if errors.Is(err, flock.ErrBusy) {
		return 0, nil // another refiller waits, and will recount
	}
	if err != nil {
		return 0, errs.FromOS(err, spareWaitPath(lay, key), "cannot lock the spares")
	}
	if o.Wait == 0 {
		o.Wait = 10 * time.Minute
	}
	wctx, cancel := context.WithTimeout(ctx, o.Wait)
	l, err := flock.Exclusive(wctx, spareLockPath(lay, key))
	cancel()
	wait.Unlock()
	if err != nil {
		return 0, lockErr(ctx, err, spareLockPath(lay, key))
	}
	defer l.Unlock()
	// We are the only refiller of key: anything being built is a leftover.
	cleanSpareBuilds(lay, key)
	// Copies cancelled for an up are removed last, once the spares are
	// made: the removal is work nobody waits for.
	defer cleanSpareBuilds(lay, key)

	made, yields := 0, 0
	for {
		all, err := spares(lay)
		if err != nil {
			return made, errs.FromOS(err, lay.Clusters(), "cannot read the clusters directory")
		}
		if len(all[key]) >= o.Spares {
			return made, nil
		}
		if why := lowSpace(lay, key, o.MinFree); why != "" {
			if o.OnSkip != nil {
				o.OnSkip(why)
			}
			return made, nil
		}
		if err := waitForeground(ctx, lay); err != nil {
			return made, err
		}
		// The first error (ENOSPC among them) ends the refill: the failed
		// copy was removed by makeSpare, the finished spares stay.
		ok, err := makeSpare(ctx, lay, key, o.Owner)
		if errors.Is(err, errYield) {
			// The cancelled copy is removed when the refill ends; in a
			// burst of ups, earlier ones go now, so they do not pile up.
			if yields++; yields > 1 {
				if err := waitForeground(ctx, lay); err != nil {
					return made, err
				}
				cleanSpareBuilds(lay, key)
			}
			continue
		}
		if err != nil || !ok {
			return made, err
		}
		made++
	}
}

// lowSpace returns why no spare of key may be started now (the margin, see
// SpareMinFreeBytes), or "". The copy's cost is taken as the template's
// full size, also where the filesystem could share blocks.
func lowSpace(lay statedir.Layout, key string, minFree int64) string {
	if minFree < 0 {
		return ""
	}
	free, total, err := fsSpace(lay.Clusters())
	if err != nil {
		return "" // cannot tell; ENOSPC still ends the refill
	}
	if minFree == 0 {
		minFree = max(SpareMinFreeBytes, total/100*SpareMinFreePercent)
	}
	need := dirBytes(filepath.Join(lay.Templates(), key, dataSubdir))
	if free-need < minFree {
		return fmt.Sprintf("a spare (%s) would leave %s free, below the margin of %s",
			units.Bytes(need), units.Bytes(max(free-need, 0)), units.Bytes(minFree))
	}
	return ""
}

// dirBytes is the total size of the regular files under dir.
func dirBytes(dir string) int64 {
	var n int64
	_ = filepath.WalkDir(dir, func(_ string, d fs.DirEntry, err error) error {
		if err == nil && d.Type().IsRegular() {
			if fi, err := d.Info(); err == nil {
				n += fi.Size()
			}
		}
		return nil
	})
	return n
}

// makeSpare copies template key into a new spare. It returns false when the
// template is gone or changed while it was copied.
func makeSpare(ctx context.Context, lay statedir.Layout, key string, owner *clone.Owner) (bool, error) {
	dir := filepath.Join(lay.Templates(), key)
	before, err := os.Stat(dir)
	if err != nil {
		return false, nil
	}
	if _, err := readMeta(dir); err != nil {
		return false, nil
	}
	if err := os.MkdirAll(lay.Clusters(), 0o755); err != nil {
		return false, errs.FromOS(err, lay.Clusters(), "cannot create the clusters directory")
	}
	tag := fsutil.RandomTag()
	build := filepath.Join(lay.Clusters(), spareBuildTag+key+"-"+tag)
	if err := os.Mkdir(build, 0o700); err != nil {
		return false, errs.FromOS(err, build, "cannot create a spare")
	}
	done := false
	defer func() {
		if !done {
			_ = os.RemoveAll(build)
		}
	}()
	// Give way to any up at work.
	cctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	watched := make(chan struct{})
	go func() {
		defer close(watched)
		t := time.NewTicker(fgPoll)
		defer t.Stop()
		for {
			select {
			case <-cctx.Done():
				return
			case <-t.C:
				if foregroundBusy(lay) {
					cancel(errYield)
					return
				}
			}
		}
	}()
	// One syncfs at the end: in the background, it keeps the copy's dirty
	// data from being written back (and, on ext4, from stalling journal
	// commits) while a later up starts postgres on the spare.
	copts := clone.Options{Sync: clone.SyncFS, Owner: owner}
	_, err = clone.CopyInto(cctx, filepath.Join(dir, dataSubdir), build, copts)
	cancel(nil)
	<-watched
	if errors.Is(context.Cause(cctx), errYield) && ctx.Err() == nil {
		done = true // removed by Refill (see errYield there)
		return false, errYield
	}
	if err != nil {
		if _, serr := os.Stat(dir); serr != nil {
			return false, nil // removed while we copied
		}
		return false, err
	}
	// Publish only if the template is still the one we copied.
	sh, err := flock.Shared(ctx, lockPath(lay, key))
	if err != nil {
		return false, lockErr(ctx, err, lockPath(lay, key))
	}
	defer sh.Unlock()
	after, err := os.Stat(dir)
	if err != nil || !os.SameFile(before, after) {
		return false, nil
	}
	final := filepath.Join(lay.Clusters(), spareTag+key+"-"+tag)
	if err := os.Rename(build, final); err != nil {
		return false, errs.Wrap(errs.Internal, err, "cannot move the finished spare into place").WithPath(final)
	}
	done = true
	return true, nil
}

// removeSpares deletes every spare of key (the caller holds the template's
// exclusive lock). Each is renamed out of its claimable name first.
func removeSpares(lay statedir.Layout, key string) {
	all, _ := spares(lay)
	for _, s := range all[key] {
		trashSpare(lay, s)
	}
}

func trashSpare(lay statedir.Layout, p string) {
	trash := filepath.Join(lay.Clusters(), fmt.Sprintf("%s%s-%d", spareTrashTag, fsutil.RandomTag(), os.Getpid()))
	if os.Rename(p, trash) == nil {
		_ = os.RemoveAll(trash)
	}
}

// cleanSpareBuilds removes key's unfinished spares; the caller holds key's
// refill lock, so no one is building them.
func cleanSpareBuilds(lay statedir.Layout, key string) {
	ents, _ := os.ReadDir(lay.Clusters())
	for _, e := range ents {
		if spareKey(e.Name(), spareBuildTag) == key {
			_ = os.RemoveAll(filepath.Join(lay.Clusters(), e.Name()))
		}
	}
}

// CleanSpares removes what no one will use: unfinished spares of refillers
// that died (their key's refill lock is free) and spares of templates that
// no longer exist. It is cheap when there is nothing to do (one directory
// listing and a stat per spare); entries in use are left alone.
func CleanSpares(lay statedir.Layout) {
	ents, err := os.ReadDir(lay.Clusters())
	if err != nil {
		return
	}
	builds, orphans := map[string]bool{}, map[string][]string{}
	for _, e := range ents {
		n := e.Name()
		if k := spareKey(n, spareBuildTag); k != "" {
			builds[k] = true
		} else if k := spareKey(n, spareTag); k != "" {
			if _, err := os.Stat(filepath.Join(lay.Templates(), k, metaFile)); errors.Is(err, fs.ErrNotExist) {
				orphans[k] = append(orphans[k], filepath.Join(lay.Clusters(), n))
			}
		}
	}
	for k := range builds {
		if l, err := flock.TryExclusive(spareLockPath(lay, k)); err == nil {
			cleanSpareBuilds(lay, k)
			l.Unlock()
		}
	}
	for k, ps := range orphans {
		// Under the template's lock: not while it is being built or used.
		l, err := flock.TryExclusive(lockPath(lay, k))
		if err != nil {
			continue
		}
		if _, err := os.Stat(filepath.Join(lay.Templates(), k, metaFile)); errors.Is(err, fs.ErrNotExist) {
			for _, p := range ps {
				trashSpare(lay, p)
			}
		}
		l.Unlock()
	}
}
