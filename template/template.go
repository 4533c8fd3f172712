// Package template keeps cached template clusters: cleanly shut down
// PostgreSQL data directories, made by initdb and optionally set up by SQL
// files and/or a command, from which `pgfork up` clones fresh clusters.
//
// A template's key is a hash of everything that shapes it (format version,
// PostgreSQL version, initdb arguments, setup file names and contents, setup
// command). It is built at most once however many processes ask at the same
// moment (an flock per key), in a staging directory under templates/, and
// renamed to templates/<key> only when complete: a failed or interrupted
// build leaves nothing behind (its staging directory is removed, or cleaned
// on the next build). Users of a template hold a shared lock on it while
// they copy it, so it is never removed under them.
//
// On disk:
//
//	<state>/templates/<key>/data       the data directory (owned by the PostgreSQL OS user)
//	<state>/templates/<key>/meta.json  Meta; its mtime is the last-use time
//	<state>/locks/template-<key>.lock  build (exclusive) / use (shared) lock
package template

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"time"

	"github.com/pgfork/pgfork/instance"
	"github.com/pgfork/pgfork/internal/errs"
	"github.com/pgfork/pgfork/internal/flock"
	"github.com/pgfork/pgfork/internal/statedir"
	"github.com/pgfork/pgfork/pgbin"
)

// FormatVersion is part of every key: bump it when the way templates are
// built changes, so old templates are not reused.
const FormatVersion = 1

// KeyLen is the length of a template key (hex digits of a SHA-256).
const KeyLen = 24

const (
	metaFile   = "meta.json"
	dataSubdir = "data"
	stagingTag = ".staging-"
	trashTag   = ".trash-"
)

// Options describe the template wanted.
type Options struct {
	// PG is the PostgreSQL build to make it with.
	PG pgbin.Installation
	// Init shapes initdb; its BinDir, Env, DataDir and User are filled in,
	// and NoSync is forced (the finished template is synced as a whole).
	Init instance.InitOptions
	// User is the OS user PostgreSQL runs as (nil: the current user).
	User *instance.OSUser
	// Setup lists SQL files or directories of them, applied in this order;
	// a directory's *.sql files are applied in name order (when it holds
	// *.up.sql files, its *.down.sql files are left out).
	Setup []string
	// SetupCmd is a shell command run (sh -c, as the invoking user, in the
	// current directory) after the SQL files, with DATABASE_URL and PG*
	// set to the template's server.
	SetupCmd string
	// OnProgress, when set, receives one-line progress messages.
	OnProgress func(msg string)
}

// Meta is what a template's meta.json records.
type Meta struct {
	Format    int           `json:"format"`
	Key       string        `json:"key"`
	PGVersion string        `json:"pg_version"`
	PGMajor   int           `json:"pg_major"`
	BinDir    string        `json:"bin_dir"`
	InitArgs  []string      `json:"initdb_args"`
	Setup     []string      `json:"setup,omitempty"`
	SetupCmd  string        `json:"setup_cmd,omitempty"`
	Created   time.Time     `json:"created"`
	BuildTime time.Duration `json:"build_ns"`
	Size      int64         `json:"size_bytes"`
	// LastUsed is the modification time of meta.json (not stored in it).
	LastUsed time.Time `json:"last_used"`
	// Spares is how many ready copies of it wait to be claimed by
	// `pgfork up` (counted by List, not stored).
	Spares int `json:"spares"`
}

// Template is a ready template, held with a shared lock until Release.
type Template struct {
	Key string
	// Dir is templates/<key>.
	Dir  string
	Meta Meta
	// Built says whether this call built it (false: it was cached).
	Built bool

	lock *flock.Lock
}

// DataDir is the template's data directory, the source of clones.
func (t *Template) DataDir() string { return filepath.Join(t.Dir, dataSubdir) }

// Release drops the shared lock that keeps the template from being removed.
func (t *Template) Release() { t.lock.Unlock() }

// SetupFile is one SQL file of a template's setup.
type SetupFile struct {
	Name string // as hashed and recorded: base name, or dir/base for files of a directory
	Path string
	Data []byte
}

// ResolveSetup expands the setup paths into the SQL files to apply, in order.
func ResolveSetup(paths []string) ([]SetupFile, error) {
	var out []SetupFile
	for _, p := range paths {
		fi, err := os.Stat(p)
		if err != nil {
			if errors.Is(err, fs.ErrNotExist) {
				return nil, errs.New(errs.NotFound, "setup file or directory not found").WithPath(p).
					WithHint("setup takes SQL files or directories of *.sql files").WithCLI("--setup FILE|DIR")
			}
			return nil, errs.FromOS(err, p, "cannot read setup path")
		}
		if !fi.IsDir() {
			b, err := os.ReadFile(p)
			if err != nil {
				return nil, errs.FromOS(err, p, "cannot read setup file")
			}
			out = append(out, SetupFile{Name: filepath.Base(p), Path: p, Data: b})
			continue
		}
		ents, err := os.ReadDir(p)
		if err != nil {
			return nil, errs.FromOS(err, p, "cannot read setup directory")
		}
		var names []string
		hasUp := false
		for _, e := range ents {
			n := e.Name()
			if !e.Type().IsRegular() && e.Type()&fs.ModeSymlink == 0 || !strings.HasSuffix(n, ".sql") {
				continue
			}
			hasUp = hasUp || strings.HasSuffix(n, ".up.sql")
			names = append(names, n)
		}
		sort.Strings(names)
		n0 := len(out)
		for _, n := range names {
			if hasUp && strings.HasSuffix(n, ".down.sql") {
				continue
			}
			fp := filepath.Join(p, n)
			b, err := os.ReadFile(fp)
			if err != nil {
				return nil, errs.FromOS(err, fp, "cannot read setup file")
			}
			out = append(out, SetupFile{Name: filepath.Base(filepath.Clean(p)) + "/" + n, Path: fp, Data: b})
		}
		if len(out) == n0 {
			return nil, errs.New(errs.Usage, "setup directory holds no *.sql files").WithPath(p).
				WithHint("put the schema in *.sql files (applied in name order), or pass the files themselves")
		}
	}
	return out, nil
}

// initOptions returns o.Init completed for building in dataDir.
func (o Options) initOptions(dataDir string) instance.InitOptions {
	io := o.Init
	io.BinDir, io.Env, io.DataDir, io.User, io.NoSync = o.PG.BinDir, o.PG.Env(), dataDir, o.User, true
	return io
}

// Key returns the template key for o and its resolved setup files.
func Key(o Options, files []SetupFile) string {
	h := sha256.New()
	fmt.Fprintf(h, "pgfork-template %d\n", FormatVersion)
	fmt.Fprintf(h, "version %q\n", o.PG.Version)
	for _, a := range o.initOptions("").Args() {
		fmt.Fprintf(h, "initdb %q\n", a)
	}
	for _, f := range files {
		fmt.Fprintf(h, "setup %q %d\n", f.Name, len(f.Data))
		h.Write(f.Data)
	}
	fmt.Fprintf(h, "cmd %q\n", o.SetupCmd)
	return hex.EncodeToString(h.Sum(nil))[:KeyLen]
}

func lockPath(lay statedir.Layout, key string) string {
	return filepath.Join(lay.Locks(), "template-"+key+".lock")
}

// Get returns the template for o, building it first if it is not cached. The
// returned template is held with a shared lock: call Release once it has been
// copied.
func Get(ctx context.Context, lay statedir.Layout, o Options) (*Template, error) {
	if o.PG.BinDir == "" || o.PG.Version == "" {
		return nil, errs.New(errs.Usage, "template.Get needs a PostgreSQL installation")
	}
	files, err := ResolveSetup(o.Setup)
	if err != nil {
		return nil, err
	}
	key := Key(o, files)
	dir := filepath.Join(lay.Templates(), key)
	lp := lockPath(lay, key)
	built := false
	for attempt := 0; attempt < 5; attempt++ {
		sh, err := flock.TryShared(lp)
		if errors.Is(err, fs.ErrNotExist) {
			if err := lay.Ensure(); err != nil {
				return nil, errs.FromOS(err, lay.Root, "cannot create the state directory")
			}
			sh, err = flock.TryShared(lp)
		}
		if errors.Is(err, flock.ErrBusy) {
			progress(o, "waiting for another pgfork to finish building template %s", key)
			sh, err = flock.Shared(ctx, lp)
		}
		if err != nil {
			return nil, lockErr(ctx, err, lp)
		}
		if m, err := readMeta(dir); err == nil {
			touch(dir)
			return &Template{Key: key, Dir: dir, Meta: m, Built: built, lock: sh}, nil
		}
		sh.Unlock()

		ex, err := flock.Exclusive(ctx, lp)
		if err != nil {
			return nil, lockErr(ctx, err, lp)
		}
		if _, err := readMeta(dir); err == nil {
			ex.Unlock() // someone else built it meanwhile
			continue
		}
		err = build(ctx, lay, o, files, key)
		ex.Unlock()
		if err != nil {
			return nil, err
		}
		built = true
	}
	return nil, errs.New(errs.Busy, "template %s keeps disappearing while being used", key).
		WithHint("another process is removing it; try again")
}

func lockErr(ctx context.Context, err error, p string) error {
	if ctx.Err() != nil {
		return errs.Wrap(errs.Interrupted, ctx.Err(), "interrupted while waiting for the template lock")
	}
	return errs.FromOS(err, p, "cannot lock the template")
}

func progress(o Options, format string, args ...any) {
	if o.OnProgress != nil {
		o.OnProgress(fmt.Sprintf(format, args...))
	}
}

func readMeta(dir string) (Meta, error) {
	var m Meta
	p := filepath.Join(dir, metaFile)
	f, err := os.Open(p)
	if err != nil {
		return m, err
	}
	defer f.Close()
	if err := json.NewDecoder(f).Decode(&m); err != nil {
		return m, fmt.Errorf("%s: %w", p, err)
	}
	if fi, err := f.Stat(); err == nil {
		m.LastUsed = fi.ModTime()
	}
	return m, nil
}

// touch records a use of the template (for prune).
func touch(dir string) {
	now := time.Now()
	_ = os.Chtimes(filepath.Join(dir, metaFile), now, now)
}

// List returns the cached templates, most recently used first. It also
// removes leftovers of crashed builds and removals that no one holds.
func List(lay statedir.Layout) ([]Meta, error) {
	ents, err := os.ReadDir(lay.Templates())
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, errs.FromOS(err, lay.Templates(), "cannot read the templates directory")
	}
	var out []Meta
	nspares := SpareCount(lay)
	for _, e := range ents {
		n := e.Name()
		if strings.HasPrefix(n, ".") {
			cleanLeftover(lay, n)
			continue
		}
		if m, err := readMeta(filepath.Join(lay.Templates(), n)); err == nil {
			m.Spares = nspares[m.Key]
			out = append(out, m)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].LastUsed.After(out[j].LastUsed) })
	return out, nil
}

// cleanLeftover removes templates/<name> when it is a staging or trash
// directory whose owner is gone (its key's lock is free).
func cleanLeftover(lay statedir.Layout, name string) {
	var key string
	switch {
	case strings.HasPrefix(name, stagingTag):
		key = strings.TrimPrefix(name, stagingTag)
	case strings.HasPrefix(name, trashTag):
		key = strings.TrimPrefix(name, trashTag)
	default:
		return
	}
	if i := strings.IndexByte(key, '-'); i > 0 {
		key = key[:i]
	}
	if !validKey(key) {
		return
	}
	l, err := flock.TryExclusive(lockPath(lay, key))
	if err != nil {
		return
	}
	defer l.Unlock()
	removeTree(filepath.Join(lay.Templates(), name))
}

// removeTree stops a server left running in dir/data (a build killed
// mid-setup) and removes dir.
func removeTree(dir string) {
	if inst, err := instance.Attach(filepath.Join(dir, dataSubdir)); err == nil {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		_ = inst.Stop(ctx, instance.Immediate)
		cancel()
	}
	_ = os.RemoveAll(dir)
}

func validKey(k string) bool {
	if len(k) == 0 || len(k) > KeyLen {
		return false
	}
	for _, c := range k {
		if !(c >= '0' && c <= '9' || c >= 'a' && c <= 'f') {
			return false
		}
	}
	return true
}

// Resolve returns the key of the cached template named by key or by a
// unique prefix of it.
func Resolve(lay statedir.Layout, key string) (string, error) {
	if !validKey(key) {
		return "", errs.New(errs.Usage, "%q is not a template key", key).
			WithHint("template keys are hex digits").WithCLI("see `pgfork template ls`")
	}
	all, err := List(lay)
	if err != nil {
		return "", err
	}
	var match []string
	for _, m := range all {
		if m.Key == key {
			return key, nil
		}
		if strings.HasPrefix(m.Key, key) {
			match = append(match, m.Key)
		}
	}
	switch len(match) {
	case 1:
		return match[0], nil
	case 0:
		return "", errs.New(errs.NotFound, "no template %s", key).WithCLI("see `pgfork template ls`")
	}
	return "", errs.New(errs.Usage, "%q matches %d templates (%s)", key, len(match), strings.Join(match, ", ")).
		WithHint("give more digits of the key")
}

// busyWait is how long Remove waits for a template's users to let go.
const busyWait = time.Second

// Remove deletes the cached template with this exact key and its spare
// copies. It refuses (errs.Busy) while the template is being built or copied.
func Remove(ctx context.Context, lay statedir.Layout, key string) error {
	if !validKey(key) || len(key) != KeyLen {
		return errs.New(errs.Usage, "%q is not a template key", key).WithCLI("see `pgfork template ls`")
	}
	lp := lockPath(lay, key)
	dir := filepath.Join(lay.Templates(), key)
	if _, err := os.Stat(dir); err != nil {
		return errs.New(errs.NotFound, "no template %s", key).WithCLI("see `pgfork template ls`")
	}
	deadline := time.Now().Add(busyWait)
	var l *flock.Lock
	for {
		var err error
		l, err = flock.TryExclusive(lp)
		if err == nil {
			break
		}
		if !errors.Is(err, flock.ErrBusy) {
			return errs.FromOS(err, lp, "cannot lock the template")
		}
		if time.Now().After(deadline) {
			return errs.New(errs.Busy, "template %s is being built or copied by another pgfork", key).
				WithPath(dir).WithHint("try again when it is done")
		}
		select {
		case <-ctx.Done():
			return errs.Wrap(errs.Interrupted, ctx.Err(), "interrupted")
		case <-time.After(10 * time.Millisecond):
		}
	}
	defer l.Unlock()
	if _, err := os.Stat(dir); err != nil {
		return errs.New(errs.NotFound, "no template %s", key).WithCLI("see `pgfork template ls`")
	}
	// Rename first, so the template disappears at once and completely.
	trash := filepath.Join(lay.Templates(), fmt.Sprintf("%s%s-%d", trashTag, key, os.Getpid()))
	if err := os.Rename(dir, trash); err != nil {
		return errs.FromOS(err, dir, "cannot remove the template")
	}
	// Its spare copies go with it (no one claims them: we hold the lock).
	removeSpares(lay, key)
	if err := os.RemoveAll(trash); err != nil {
		return errs.FromOS(err, trash, "cannot remove the template's files (the next listing of templates retries)")
	}
	return nil
}

// PruneResult says what Prune did.
type PruneResult struct {
	Removed []Meta `json:"removed"`
	// Busy are templates that were due but in use.
	Busy []Meta `json:"busy,omitempty"`
}

// Prune removes templates not used for longer than olderThan (0: all).
func Prune(ctx context.Context, lay statedir.Layout, olderThan time.Duration) (*PruneResult, error) {
	all, err := List(lay)
	if err != nil {
		return nil, err
	}
	res := &PruneResult{Removed: []Meta{}}
	now := time.Now()
	for _, m := range all {
		if now.Sub(m.LastUsed) < olderThan {
			continue
		}
		if err := Remove(ctx, lay, m.Key); err != nil {
			switch errs.KindOf(err) {
			case errs.Busy:
				res.Busy = append(res.Busy, m)
				continue
			case errs.NotFound:
				continue
			}
			return res, err
		}
		res.Removed = append(res.Removed, m)
	}
	return res, nil
}

// DiskUsage returns the bytes allocated to the files under dir.
func DiskUsage(dir string) int64 {
	var n int64
	_ = filepath.WalkDir(dir, func(_ string, d fs.DirEntry, err error) error {
		if err != nil {
			return nil
		}
		if fi, err := d.Info(); err == nil {
			n += allocated(fi)
		}
		return nil
	})
	return n
}
