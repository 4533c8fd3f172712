package main

import (
	"encoding/json"
	"fmt"
	"hash/fnv"
	"os"
	"path/filepath"

	"github.com/pgfork/pgfork/internal/fsutil"
	"github.com/pgfork/pgfork/internal/statedir"
	"github.com/pgfork/pgfork/pgbin"
)

// Finding PostgreSQL runs `postgres --version` for every candidate (and
// pg_config): 15-100 ms, a large part of pgfork up's budget. up remembers
// the answer in <state>/run/up-pg.json, keyed by everything that can change
// it: the flags and environment that choose a build, and the modification
// times of the places builds are found in (PATH directories, the system
// PostgreSQL directories, pgfork's installs) and of the chosen binary.

type pgCache struct {
	Key  string             `json:"key"`
	Inst pgbin.Installation `json:"installation"`
}

func pgCachePath(lay statedir.Layout) string { return filepath.Join(lay.Run(), "up-pg.json") }

func (cl *cli) pgCacheKey(lay statedir.Layout, binDir string) string {
	h := fnv.New64a()
	fmt.Fprintf(h, "%s\x00%s\x00%s\x00%s\x00%s\x00", cl.g.pgBin, cl.g.pgMajor, cl.getenv(pgbin.EnvBin), cl.getenv("PATH"), lay.Root)
	dirs := filepath.SplitList(cl.getenv("PATH"))
	dirs = append(dirs, pgbin.SearchDirs(lay.Root)...)
	if binDir != "" {
		dirs = append(dirs, binDir, filepath.Join(binDir, "postgres"))
	}
	for _, d := range dirs {
		if fi, err := os.Stat(d); err == nil {
			fmt.Fprintf(h, "%s %d %d\x00", d, fi.ModTime().UnixNano(), fi.Size())
		} else {
			fmt.Fprintf(h, "%s -\x00", d)
		}
	}
	return fmt.Sprintf("%x", h.Sum64())
}

// findPGCached is findPG with the answer remembered between runs.
func (cl *cli) findPGCached(lay statedir.Layout) (pgbin.Installation, error) {
	if b, err := os.ReadFile(pgCachePath(lay)); err == nil {
		var c pgCache
		if json.Unmarshal(b, &c) == nil && c.Inst.BinDir != "" && c.Key == cl.pgCacheKey(lay, c.Inst.BinDir) {
			return c.Inst, nil
		}
	}
	in, err := cl.findPG()
	if err != nil {
		return in, err
	}
	if b, err := json.Marshal(pgCache{Key: cl.pgCacheKey(lay, in.BinDir), Inst: in}); err == nil {
		_ = os.MkdirAll(lay.Run(), 0o755)
		_ = fsutil.ReplaceFile(pgCachePath(lay), b, 0o644) // a cache: losing it costs one search
	}
	return in, nil
}
