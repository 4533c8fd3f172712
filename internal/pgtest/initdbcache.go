package pgtest

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"sync"

	"golang.org/x/sys/unix"

	"github.com/pgfork/pgfork/instance"
	"github.com/pgfork/pgfork/internal/testenv"
)

// initdbCache keeps one initdb output per build and options for the test
// processes of a run: a cluster of the test profile is then a copy of it
// (reflinked where the filesystem can) instead of another initdb. Measured
// over the Go tests of `make check` (process accounting, 2 cores): 562
// initdb runs took 314 CPU-s, a quarter of the CPU the test packages
// used (0.56 CPU-s each); `cp -a` of its 39 MB took 0.01 s of user and
// 0.13 s of system CPU as a reflink on XFS, 0.09 s to tmpfs and 0.37 s
// on ext4.
//
// The cache lives under os.TempDir() (`make check` points TMPDIR into its
// run's directory, removed at the end) and on the run's XFS image
// (cacheRootFor), in a directory named by a hash of
// the initdb binary (path, size, modification time), the environment and
// the options, so a rebuilt PostgreSQL or another option never meets an
// old entry. An entry appears by rename, complete or not at all, so test
// processes of several packages can fill it at once.
var initdbCache = &initdbStore{building: map[string]*sync.Mutex{}}

type initdbStore struct {
	mu       sync.Mutex
	building map[string]*sync.Mutex
}

// copy makes o.DataDir a copy of the cached initdb output for o, making
// that first if needed: `cp -a --reflink=auto` (ownership kept as root),
// from an entry on the destination's filesystem when the test run has one
// there (the XFS image: a reflink costs nothing), else from os.TempDir().
// cp, not clone.Copy: in a race-instrumented test binary the copy cost
// as much CPU as the initdb it saves.
func (c *initdbStore) copy(ctx context.Context, o instance.InitOptions) error {
	parent := filepath.Dir(o.DataDir)
	if err := os.MkdirAll(parent, 0o755); err != nil {
		return err
	}
	src, err := c.entry(ctx, o, cacheRootFor(parent))
	if err != nil {
		return err
	}
	args := []string{"-a", "--reflink=auto", src, o.DataDir}
	if ents, err := os.ReadDir(o.DataDir); err == nil {
		if len(ents) > 0 {
			return fmt.Errorf("data directory %s is not empty", o.DataDir)
		}
		args = []string{"-a", "--reflink=auto", "-T", src, o.DataDir}
	}
	if out, err := exec.CommandContext(ctx, "cp", args...).CombinedOutput(); err != nil {
		return fmt.Errorf("cp %v: %v: %s", args, err, out)
	}
	return nil
}

// cacheRootFor is where the cached initdb outputs for a data directory in
// dir live: on dir's filesystem when it is the test run's XFS image (a
// reflink then), else under os.TempDir().
func cacheRootFor(dir string) string {
	const name = "pgfork-initdb-cache"
	if xfs := os.Getenv(testenv.EnvXFS); xfs != "" && sameFS(dir, xfs) {
		return filepath.Join(xfs, "."+name)
	}
	return filepath.Join(os.TempDir(), name)
}

func sameFS(a, b string) bool {
	var sa, sb unix.Stat_t
	return unix.Stat(a, &sa) == nil && unix.Stat(b, &sb) == nil && sa.Dev == sb.Dev
}

// entry returns the cached data directory for o, running initdb into it
// when it is not there yet (once per key in this process).
func (c *initdbStore) entry(ctx context.Context, o instance.InitOptions, root string) (string, error) {
	key, err := initdbKey(o)
	if err != nil {
		return "", err
	}
	final := filepath.Join(root, key)
	c.mu.Lock()
	l := c.building[final]
	if l == nil {
		l = &sync.Mutex{}
		c.building[final] = l
	}
	c.mu.Unlock()
	l.Lock()
	defer l.Unlock()
	if _, err := os.Stat(filepath.Join(final, "PG_VERSION")); err == nil {
		return final, nil
	}
	if err := os.MkdirAll(root, 0o755); err != nil {
		return "", err
	}
	_ = os.Chmod(root, 0o755) // initdb runs as the postgres user under root
	build, err := os.MkdirTemp(root, ".build-")
	if err != nil {
		return "", err
	}
	defer os.RemoveAll(build)
	if err := os.Chmod(build, 0o755); err != nil {
		return "", err
	}
	o.DataDir = filepath.Join(build, "data")
	if err := instance.InitDB(ctx, o); err != nil {
		return "", err
	}
	// Another test process may have made it meanwhile: theirs stays.
	if err := os.Rename(o.DataDir, final); err != nil && !errors.Is(err, fs.ErrExist) && !errors.Is(err, unix.ENOTEMPTY) {
		return "", err
	}
	return final, nil
}

// initdbKey names an initdb output: the binary (path, size, mtime), the
// environment, the OS user and the options.
func initdbKey(o instance.InitOptions) (string, error) {
	bin := filepath.Join(o.BinDir, "initdb")
	fi, err := os.Stat(bin)
	if err != nil {
		return "", err
	}
	o.DataDir = ""
	h := sha256.New()
	sums := "default"
	if o.Checksums != nil {
		sums = fmt.Sprint(*o.Checksums) // Args spells false only once Major is known
	}
	fmt.Fprintf(h, "%s\x00%d\x00%d\x00%q\x00%q\x00%s\x00%v\x00%+v", bin, fi.Size(), fi.ModTime().UnixNano(), o.Env, o.Args(), sums, o.User != nil, o.User)
	return hex.EncodeToString(h.Sum(nil))[:20], nil
}
