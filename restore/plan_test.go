package restore

import (
	"fmt"
	"reflect"
	"strings"
	"sync"
	"testing"

	"github.com/pgfork/pgfork/pgbackup"
)

// The planner's rules on chains described in memory: no file is read.

const bs = pgbackup.BlockSize

// memChain is a chain described in memory: backups[k][rel] is what backup
// k holds for the output file rel (missing: Absent). It records the
// lookups made.
type memChain struct {
	backups []map[string]Entry
	mu      sync.Mutex
	asked   []string
}

func (c *memChain) look(k int, rel string) (Entry, error) {
	c.mu.Lock()
	c.asked = append(c.asked, fmt.Sprintf("%d:%s", k, rel))
	c.mu.Unlock()
	if e, ok := c.backups[k][rel]; ok {
		return e, nil
	}
	return Entry{Kind: Absent}, nil
}

func full(rel string, blocks int64) Entry { return Entry{Kind: Full, Path: rel, Size: blocks * bs} }

// incr is an INCREMENTAL file of rel holding blocks, with a header of
// one block (PostgreSQL 17's alignment) and truncation length trunc.
func incr(rel string, trunc uint32, blocks ...uint32) Entry {
	i := strings.LastIndex(rel, "/")
	return Entry{Kind: Incr, Path: rel[:i+1] + pgbackup.IncrementalPrefix + rel[i+1:],
		Inc: &pgbackup.Incremental{Blocks: blocks, TruncationBlocks: trunc, HeaderLen: bs}}
}

// data is the offset of the i-th block of an incr file.
func data(i int64) int64 { return bs + i*bs }

func node(rel string, e Entry) Node { return Node{Rel: rel, Mode: 0o600, Entry: e} }

func TestBuildPlan(t *testing.T) {
	const rel = "base/5/16384"
	names := []string{"/b/full", "/b/incr1", "/b/incr2"}
	tests := []struct {
		name    string
		older   []map[string]Entry // backups 0 and 1
		newest  Entry
		noMerge bool
		// want
		size    int64
		whole   *Source // copied whole from
		sources []Source
		runs    []BlockRun
		asked   []string
		bySrc   []int64
		zero    int64
		base    [2]int64 // rebuilt files: Base and BaseBytes
	}{{
		name:   "whole file from the newest backup",
		older:  []map[string]Entry{{rel: full(rel, 8)}, {rel: incr(rel, 8, 1)}},
		newest: full(rel, 3),
		size:   3 * bs, whole: &Source{2, rel},
		bySrc: []int64{0, 0, 0},
	}, {
		name:    "block runs from several backups",
		older:   []map[string]Entry{{rel: full(rel, 6)}, {rel: incr(rel, 6, 1, 2)}},
		newest:  incr(rel, 6, 2, 3),
		size:    6 * bs,
		sources: []Source{{2, "base/5/INCREMENTAL.16384"}, {1, "base/5/INCREMENTAL.16384"}, {0, rel}},
		runs: []BlockRun{
			{Source: 2, SrcOff: 0, DstOff: 0, Blocks: 1},            // block 0: full
			{Source: 1, SrcOff: data(0), DstOff: 1 * bs, Blocks: 1}, // block 1: incr1's first
			{Source: 0, SrcOff: data(0), DstOff: 2 * bs, Blocks: 2}, // blocks 2-3: the newest's, one call
			{Source: 2, SrcOff: 4 * bs, DstOff: 4 * bs, Blocks: 2},  // blocks 4-5: full, one call
		},
		asked: []string{"1:" + rel, "0:" + rel},
		bySrc: []int64{3, 1, 2},
		base:  [2]int64{2, 6 * bs},
	}, {
		name:    "no merge: a call per block",
		older:   []map[string]Entry{{rel: full(rel, 3)}, {rel: incr(rel, 3)}},
		newest:  incr(rel, 3, 2),
		noMerge: true,
		size:    3 * bs,
		sources: []Source{{2, "base/5/INCREMENTAL.16384"}, {1, "base/5/INCREMENTAL.16384"}, {0, rel}},
		runs: []BlockRun{
			{Source: 2, SrcOff: 0, DstOff: 0, Blocks: 1},
			{Source: 2, SrcOff: bs, DstOff: bs, Blocks: 1},
			{Source: 0, SrcOff: data(0), DstOff: 2 * bs, Blocks: 1},
		},
		bySrc: []int64{2, 0, 1},
		base:  [2]int64{2, 3 * bs},
	}, {
		name:    "truncated: blocks beyond the truncation length are not taken from older backups",
		older:   []map[string]Entry{{rel: full(rel, 8)}, {rel: incr(rel, 8, 6)}},
		newest:  incr(rel, 2, 1),
		size:    2 * bs,
		sources: []Source{{2, "base/5/INCREMENTAL.16384"}, {1, "base/5/INCREMENTAL.16384"}, {0, rel}},
		runs: []BlockRun{
			{Source: 2, SrcOff: 0, DstOff: 0, Blocks: 1},
			{Source: 0, SrcOff: data(0), DstOff: bs, Blocks: 1},
		},
		bySrc: []int64{1, 0, 1},
		base:  [2]int64{2, 2 * bs},
	}, {
		name:    "extended: blocks past the full version and the truncation length are zeros",
		older:   []map[string]Entry{{rel: full(rel, 2)}, {rel: incr(rel, 4)}},
		newest:  incr(rel, 4, 5),
		size:    6 * bs,
		sources: []Source{{2, "base/5/INCREMENTAL.16384"}, {1, "base/5/INCREMENTAL.16384"}, {0, rel}},
		runs: []BlockRun{
			{Source: 2, SrcOff: 0, DstOff: 0, Blocks: 2},
			{Source: -1, SrcOff: 0, DstOff: 2 * bs, Blocks: 3},
			{Source: 0, SrcOff: data(0), DstOff: 5 * bs, Blocks: 1},
		},
		bySrc: []int64{2, 0, 1},
		zero:  3,
		base:  [2]int64{2, 2 * bs},
	}, {
		name:    "grown past its truncation length: the blocks between are zeros, even where the full version has them",
		older:   []map[string]Entry{{rel: full(rel, 8)}, {rel: incr(rel, 8)}},
		newest:  incr(rel, 2, 4),
		size:    5 * bs,
		sources: []Source{{2, "base/5/INCREMENTAL.16384"}, {1, "base/5/INCREMENTAL.16384"}, {0, rel}},
		runs: []BlockRun{
			{Source: 2, SrcOff: 0, DstOff: 0, Blocks: 2},
			{Source: -1, SrcOff: 0, DstOff: 2 * bs, Blocks: 2},
			{Source: 0, SrcOff: data(0), DstOff: 4 * bs, Blocks: 1},
		},
		bySrc: []int64{2, 0, 1},
		zero:  2,
		base:  [2]int64{2, 2 * bs},
	}, {
		name:    "truncated with no block changed: rebuilt from the full version, not copied whole",
		older:   []map[string]Entry{{rel: full(rel, 8)}, {rel: incr(rel, 8)}},
		newest:  incr(rel, 3),
		size:    3 * bs,
		sources: []Source{{2, "base/5/INCREMENTAL.16384"}, {1, "base/5/INCREMENTAL.16384"}, {0, rel}},
		runs:    []BlockRun{{Source: 2, SrcOff: 0, DstOff: 0, Blocks: 3}},
		bySrc:   []int64{3, 0, 0},
		base:    [2]int64{2, 3 * bs},
	}, {
		name:    "a relation that appears in a middle backup only",
		older:   []map[string]Entry{{}, {rel: full(rel, 4)}},
		newest:  incr(rel, 4, 0),
		size:    4 * bs,
		sources: []Source{{2, "base/5/INCREMENTAL.16384"}, {1, rel}},
		runs: []BlockRun{
			{Source: 0, SrcOff: data(0), DstOff: 0, Blocks: 1},
			{Source: 1, SrcOff: bs, DstOff: bs, Blocks: 3},
		},
		asked: []string{"1:" + rel}, // the full backup is never asked
		bySrc: []int64{0, 3, 1},
		base:  [2]int64{1, 4 * bs},
	}, {
		name:   "unchanged since an older backup: copied whole from it",
		older:  []map[string]Entry{{rel: full(rel, 5)}, {rel: incr(rel, 5)}},
		newest: incr(rel, 5),
		size:   5 * bs, whole: &Source{0, rel},
		bySrc: []int64{0, 0, 0},
	}}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			c := &memChain{backups: append(tc.older, map[string]Entry{rel: tc.newest})}
			tree := []Node{
				{Rel: "base", Dir: true, Mode: 0o700},
				{Rel: "base/5", Dir: true, Mode: 0o700},
				node(rel, tc.newest),
				node("backup_label", full("backup_label", 0)),
				node("backup_manifest", full("backup_manifest", 1)),
			}
			p, err := BuildPlan(names, tree, c.look, PlanOptions{NoMerge: tc.noMerge, Jobs: 2})
			if err != nil {
				t.Fatal(err)
			}
			if len(p.Dirs) != 2 || len(p.Files) != 1 {
				t.Fatalf("plan has %d dirs and %d files, want 2 and 1 (label and manifest left out)", len(p.Dirs), len(p.Files))
			}
			f := p.Files[0]
			if f.Rel != rel || f.Size != tc.size || p.Bytes != tc.size {
				t.Errorf("file %s of %d bytes (plan %d), want %s of %d", f.Rel, f.Size, p.Bytes, rel, tc.size)
			}
			if tc.whole != nil {
				if !f.Whole() || !reflect.DeepEqual(f.Sources, []Source{*tc.whole}) {
					t.Errorf("want a whole copy from %v; got sources %v, runs %v", *tc.whole, f.Sources, f.Runs)
				}
				if f.Older != (tc.whole.Backup != 2) || p.FilesWhole != 1 || p.FilesOlder != map[bool]int64{true: 1}[f.Older] {
					t.Errorf("older=%v whole=%d olderFiles=%d", f.Older, p.FilesWhole, p.FilesOlder)
				}
			} else {
				if f.Whole() || p.FilesRebuilt != 1 {
					t.Fatalf("want a rebuilt file; got a whole copy from %v", f.Sources)
				}
				if !reflect.DeepEqual(f.Sources, tc.sources) {
					t.Errorf("sources\n got %v\nwant %v", f.Sources, tc.sources)
				}
				if !reflect.DeepEqual(f.Runs, tc.runs) {
					t.Errorf("runs\n got %+v\nwant %+v", f.Runs, tc.runs)
				}
				if got := [2]int64{int64(f.Base), f.BaseBytes}; got != tc.base {
					t.Errorf("base %v, want %v", got, tc.base)
				}
			}
			if !reflect.DeepEqual(p.BlocksBySource, tc.bySrc) || p.ZeroBlocks != tc.zero {
				t.Errorf("blocks by source %v zeros %d, want %v and %d", p.BlocksBySource, p.ZeroBlocks, tc.bySrc, tc.zero)
			}
			calls := int64(0)
			for _, r := range f.Runs {
				if r.Source >= 0 {
					calls++
				}
			}
			if p.Calls != calls {
				t.Errorf("calls %d, want %d", p.Calls, calls)
			}
			if tc.asked != nil && !reflect.DeepEqual(c.asked, tc.asked) {
				t.Errorf("lookups %v, want %v", c.asked, tc.asked)
			}
		})
	}
}

// A file removed in the newest backup is not in its tree: it is not
// restored and no older backup is asked about it.
func TestBuildPlanFileRemovedInNewest(t *testing.T) {
	names := []string{"/b/full", "/b/incr"}
	c := &memChain{backups: []map[string]Entry{
		{"base/5/100": full("base/5/100", 2), "base/5/200": full("base/5/200", 2)},
		{"base/5/100": incr("base/5/100", 2, 1)},
	}}
	tree := []Node{{Rel: "base", Dir: true}, {Rel: "base/5", Dir: true}, node("base/5/100", c.backups[1]["base/5/100"])}
	p, err := BuildPlan(names, tree, c.look, PlanOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range p.Files {
		if f.Rel == "base/5/200" {
			t.Errorf("base/5/200, removed in the newest backup, is planned: %+v", f)
		}
	}
	if len(p.Files) != 1 || !reflect.DeepEqual(c.asked, []string{"0:base/5/100"}) {
		t.Errorf("files %d, lookups %v; want 1 and only base/5/100 asked of the full backup", len(p.Files), c.asked)
	}
}

// Chains the rules refuse, each naming the file.
func TestBuildPlanRefuses(t *testing.T) {
	const rel = "base/5/16384"
	for _, tc := range []struct {
		name   string
		names  []string
		older  []map[string]Entry
		newest Entry
		want   string
	}{
		{"incremental file in a full backup (alone)", []string{"/b/full"}, nil, incr(rel, 1, 0), "full backup contains unexpected incremental file"},
		{"incremental file in the chain's full backup", []string{"/b/full", "/b/incr"}, []map[string]Entry{{rel: incr(rel, 1)}}, incr(rel, 1, 0), "full backup contains unexpected incremental file"},
		{"file missing from a middle backup", []string{"/b/full", "/b/incr1", "/b/incr2"}, []map[string]Entry{{rel: full(rel, 1)}, {}}, incr(rel, 1, 0), "the chain is inconsistent: base/5/16384 is incremental in a later backup but neither it nor an INCREMENTAL file is in incr1"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := &memChain{backups: append(tc.older, map[string]Entry{rel: tc.newest})}
			_, err := BuildPlan(tc.names, []Node{node(rel, tc.newest)}, c.look, PlanOptions{})
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error %v, want one saying %q", err, tc.want)
			}
		})
	}
}
