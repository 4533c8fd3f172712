package template

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/pgfork/pgfork/internal/errs"
	"github.com/pgfork/pgfork/internal/statedir"
	"github.com/pgfork/pgfork/internal/testenv"
)

// fakeTemplate makes a finished template of size bytes (in 1 MiB files)
// under lay, the way Get leaves one: templates/<key>/{meta.json,data/}.
func fakeTemplate(t *testing.T, lay statedir.Layout, size int) string {
	t.Helper()
	key := strings.Repeat("ab", KeyLen/2)
	data := filepath.Join(lay.Templates(), key, dataSubdir)
	if err := os.MkdirAll(data, 0o755); err != nil {
		t.Fatal(err)
	}
	chunk := bytes.Repeat([]byte{7}, 1<<20)
	for i := 0; i < size>>20; i++ {
		if err := os.WriteFile(filepath.Join(data, fmt.Sprintf("f%04d", i)), chunk, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(filepath.Join(lay.Templates(), key, metaFile), []byte(`{"key":"`+key+`"}`), 0o644); err != nil {
		t.Fatal(err)
	}
	return key
}

// leftovers lists the clusters/ entries that are not finished spares.
func leftovers(t *testing.T, lay statedir.Layout) (spares, other []string) {
	t.Helper()
	ents, _ := os.ReadDir(lay.Clusters())
	for _, e := range ents {
		if strings.HasPrefix(e.Name(), spareTag) {
			spares = append(spares, e.Name())
		} else {
			other = append(other, e.Name())
		}
	}
	return spares, other
}

// TestRefillKeepsFreeMargin: on a 64 MiB filesystem no spare may be started
// (the margin is at least 1 GiB): the refill makes none, says why, and
// leaves nothing behind.
func TestRefillKeepsFreeMargin(t *testing.T) {
	lay := statedir.Layout{Root: testenv.SmallFSDir(t)}
	key := fakeTemplate(t, lay, 4<<20)
	why := ""
	made, err := Refill(context.Background(), lay, key, RefillOptions{Spares: MaxSpares, OnSkip: func(s string) { why = s }})
	if err != nil || made != 0 {
		t.Fatalf("refill: made %d, %v; want 0 spares and no error", made, err)
	}
	if !strings.Contains(why, "margin") {
		t.Errorf("no reason given for stopping: %q", why)
	}
	if s, o := leftovers(t, lay); len(s)+len(o) != 0 {
		t.Errorf("refill left %v %v", s, o)
	}
	if _, err := Refill(context.Background(), lay, key, RefillOptions{Spares: MaxSpares + 1}); errs.KindOf(err) != errs.Usage {
		t.Errorf("refill of %d spares: %v, want a usage error", MaxSpares+1, err)
	}
}

// TestRefillStopsAtENOSPC: without the margin, the refill copies until the
// disk is full, stops at the first ENOSPC with a NoSpace error, and leaves
// only complete spares (the failed copy is removed).
func TestRefillStopsAtENOSPC(t *testing.T) {
	lay := statedir.Layout{Root: testenv.SmallFSDir(t)}
	key := fakeTemplate(t, lay, 12<<20)
	made, err := Refill(context.Background(), lay, key, RefillOptions{Spares: MaxSpares, MinFree: -1})
	if errs.KindOf(err) != errs.NoSpace {
		t.Fatalf("refill on a full disk: made %d, %v; want a NoSpace error", made, err)
	}
	s, o := leftovers(t, lay)
	if len(o) != 0 {
		t.Errorf("half-built copies left: %v", o)
	}
	if len(s) != made {
		t.Errorf("%d spares on disk, refill says it made %d", len(s), made)
	}
	for _, sp := range s {
		if n := dirBytes(filepath.Join(lay.Clusters(), sp)); n != 12<<20 {
			t.Errorf("spare %s holds %d bytes, want %d", sp, n, 12<<20)
		}
	}
}

// TestRefillPausesForForegroundCopy: while an up is at work (Foreground),
// the refill starts no copy, and a copy it is making stops
// growing; once the up is done, the refill finishes.
func TestRefillPausesForForegroundCopy(t *testing.T) {
	lay := statedir.Layout{Root: testenv.Dir(t)}
	key := fakeTemplate(t, lay, 256<<20)
	ctx := context.Background()

	// Held before the refill starts: no copy is started.
	release := Foreground(ctx, lay)
	type result struct {
		made int
		err  error
	}
	done := make(chan result, 1)
	go func() { n, err := Refill(ctx, lay, key, RefillOptions{Spares: 1, MinFree: -1}); done <- result{n, err} }()
	time.Sleep(500 * time.Millisecond)
	if s, o := leftovers(t, lay); len(s)+len(o) != 0 {
		t.Errorf("refill copied during a foreground copy: %v %v", s, o)
	}
	release()
	r := <-done
	if r.err != nil || r.made != 1 {
		t.Fatalf("refill after the foreground copy: made %d, %v", r.made, r.err)
	}

	// Taken while the refill copies: the copy stops growing.
	go func() { n, err := Refill(ctx, lay, key, RefillOptions{Spares: 2, MinFree: -1}); done <- result{n, err} }()
	var build string
	for i := 0; i < 2000 && build == ""; i++ {
		_, o := leftovers(t, lay)
		for _, n := range o {
			if strings.HasPrefix(n, spareBuildTag) {
				build = filepath.Join(lay.Clusters(), n)
			}
		}
		time.Sleep(time.Millisecond)
	}
	release = Foreground(ctx, lay)
	if build == "" {
		release()
		t.Skip("the refill's copy finished before the test saw it")
	}
	// The copy stops once it sees the lock taken, which a loaded machine
	// may delay: wait until it holds still. One that went on instead would
	// finish, and a second spare would show below.
	testenv.WaitFor(t, "the refill's copy to stop growing during a foreground copy", func() bool {
		a := dirBytes(build)
		time.Sleep(400 * time.Millisecond)
		return dirBytes(build) == a
	})
	if s, _ := leftovers(t, lay); len(s) != 1 {
		t.Errorf("spares during the foreground copy: %v", s)
	}
	release()
	r = <-done
	if r.err != nil || r.made != 1 {
		t.Fatalf("refill after the foreground copy: made %d, %v", r.made, r.err)
	}
	if s, o := leftovers(t, lay); len(s) != 2 || len(o) != 0 {
		t.Errorf("after the refill: spares %v, other %v", s, o)
	}
}
