package pool_test

import (
	"testing"

	"github.com/pgfork/pgfork/pool"
)

// TestDefaultSizes: clones get a bigger pool than full copies, both
// scale with the cores, and sizes given by the user win, keeping
// Initial ≤ Max (issue 33).
func TestDefaultSizes(t *testing.T) {
	if got := pool.DefaultSizes(true, 2); got != (pool.Sizes{Initial: 8, Max: 128, Parallel: 2, Learned: 512}) {
		t.Errorf("clone, 2 cores: %+v", got)
	}
	if got := pool.DefaultSizes(false, 2); got != (pool.Sizes{Initial: 2, Max: 8, Parallel: 2, Learned: 8}) {
		t.Errorf("full copies, 2 cores (IntegreSQL's constants): %+v", got)
	}
	if got := pool.DefaultSizes(false, 0); got.Parallel != 1 || got.Max != 4 {
		t.Errorf("no core count: %+v", got)
	}
	d := pool.DefaultSizes(true, 2)
	base := pool.ManagerConfig{Initial: 2, Max: 8, Parallel: 2}
	for _, c := range []struct {
		name  string
		cfg   pool.ManagerConfig
		given pool.Given
		want  [4]int // Initial, Max, Parallel, LearnMax
	}{
		{"nothing given", base, pool.Given{}, [4]int{8, 128, 2, 512}},
		{"all given", pool.ManagerConfig{Initial: 1, Max: 3, Parallel: 5, LearnMax: 9}, pool.Given{Initial: true, Max: true, Parallel: true}, [4]int{1, 3, 5, 0}},
		{"a small max bounds the default initial and the demand", pool.ManagerConfig{Max: 4}, pool.Given{Max: true}, [4]int{4, 4, 2, 0}},
		{"a big initial raises the default max", pool.ManagerConfig{Initial: 200}, pool.Given{Initial: true}, [4]int{200, 200, 2, 512}},
		{"an initial above the learned bound", pool.ManagerConfig{Initial: 600}, pool.Given{Initial: true}, [4]int{600, 600, 2, 600}},
		{"initial 0 given", pool.ManagerConfig{Initial: 0}, pool.Given{Initial: true}, [4]int{0, 128, 2, 512}},
	} {
		got := d.Apply(c.cfg, c.given)
		if [4]int{got.Initial, got.Max, got.Parallel, got.LearnMax} != c.want {
			t.Errorf("%s: %d/%d/%d/%d, want %v", c.name, got.Initial, got.Max, got.Parallel, got.LearnMax, c.want)
		}
		// The pool learns its demand unless the user chose Initial.
		if got.LearnDemand == c.given.Initial {
			t.Errorf("%s: LearnDemand %v with Initial given %v", c.name, got.LearnDemand, c.given.Initial)
		}
	}
}

// TestSpaceMax: a pool of full copies holds as many as fit in a quarter
// of the free space, no fewer than the full-copy default and no more
// than a learned demand fills clones to; unknown sizes keep the caller's
// Max (issue 33).
func TestSpaceMax(t *testing.T) {
	const mb, gb = int64(1) << 20, int64(1) << 30
	for _, c := range []struct {
		name       string
		free, size int64
		want       int
	}{
		{"70 GiB free, 180 MiB template: 99 fit in a quarter", 70 * gb, 180 * mb, 99},
		{"a quarter holds fewer than the default: the default", 10 * gb, 2 * gb, 8},
		{"a small template: what a learned demand fills clones to caps it", 70 * gb, 8 * mb, 512},
		{"free space unknown", 0, 180 * mb, 0},
		{"size unknown", 70 * gb, 0, 0},
	} {
		if got := pool.SpaceMax(c.free, c.size, 2); got != c.want {
			t.Errorf("%s: %d, want %d", c.name, got, c.want)
		}
	}
}
