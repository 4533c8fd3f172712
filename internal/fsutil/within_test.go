package fsutil

import "testing"

func TestWithin(t *testing.T) {
	for _, c := range []struct {
		p, dir string
		want   bool
	}{
		{"/a/b", "/a", true}, {"/a", "/a", true}, {"/a/b/c", "/a/b", true},
		{"/ab", "/a", false}, {"/a/../b", "/a", false}, {"/", "/a", false}, {"/a", "/a/b", false},
		{"/srv/pg/..x", "/srv/pg", true},
	} {
		if got := Within(c.p, c.dir); got != c.want {
			t.Errorf("Within(%q, %q) = %v, want %v", c.p, c.dir, got, c.want)
		}
	}
	if a, b := RandomTag(), RandomTag(); len(a) != 8 || a == b {
		t.Errorf("RandomTag: %q %q", a, b)
	}
}
