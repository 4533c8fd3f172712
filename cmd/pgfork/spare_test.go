package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/pgfork/pgfork/internal/flock"
	"github.com/pgfork/pgfork/internal/pgtest"
	"github.com/pgfork/pgfork/internal/testenv"
	"github.com/pgfork/pgfork/template"
	"github.com/pgfork/pgfork/up"
)

// fileCount counts the entries under dir.
func fileCount(t *testing.T, dir string) int {
	t.Helper()
	n := 0
	if err := filepath.WalkDir(dir, func(_ string, _ fs.DirEntry, err error) error {
		n++
		return err
	}); err != nil {
		t.Fatal(err)
	}
	return n
}

func templateSpares(t *testing.T, p *pgfk, key string) int {
	t.Helper()
	r := p.run("template", "ls", "--json")
	var ms []template.Meta
	if err := json.Unmarshal([]byte(r.stdout), &ms); err != nil {
		t.Fatalf("template ls --json: %v %s", err, r.stdout)
	}
	for _, m := range ms {
		if m.Key == key {
			return m.Spares
		}
	}
	t.Fatalf("template ls does not list %s: %s", key, r.stdout)
	return 0
}

// TestUpSpares: up leaves a spare copy made in the background; the next up
// claims it (from_spare) and a new spare appears without up waiting for it;
// clusters from spares hold the setup and are independent; 8 parallel ups
// with one spare hand it to exactly one of them; template rm removes spares.
func TestUpSpares(t *testing.T) {
	t.Parallel() // see TestMain
	p := newTestPgfk(t)
	home := p.home
	schema := filepath.Join(testenv.Dir(t), "schema.sql")
	writeFile(t, schema, "create table t (id int primary key, who text); insert into t values (1, 'setup');\n")

	first := p.up("--setup", schema)
	if first.FromSpare || !first.Built {
		t.Fatalf("first up: from_spare %v, built %v; want a copy of a new template", first.FromSpare, first.Built)
	}
	key := first.TemplateKey
	spare := waitSpare(t, home, key, 1)[0]
	if n := templateSpares(t, p, key); n != 1 {
		t.Errorf("template ls counts %d spares, want 1", n)
	}
	if got, want := fileCount(t, spare), fileCount(t, filepath.Join(home, "templates", key, "data")); got != want {
		t.Errorf("spare holds %d entries, template %d", got, want)
	}

	second := p.up("--setup", schema)
	if !second.FromSpare || second.Spare != filepath.Base(spare) {
		t.Fatalf("second up: from_spare %v spare %q, want %s", second.FromSpare, second.Spare, filepath.Base(spare))
	}
	if _, ok := second.Timings["copy"]; ok {
		t.Errorf("an up from a spare copied: %v", second.Timings)
	}
	if _, err := os.Stat(spare); !os.IsNotExist(err) {
		t.Errorf("claimed spare still under its name: %v", err)
	}
	// Refilled in the background: a new spare, while up has returned.
	if again := waitSpare(t, home, key, 1)[0]; again == spare {
		t.Errorf("the spare after the claim has the claimed one's name %s", again)
	}
	// Correct and independent.
	for _, c := range []up.Result{first, second} {
		if got := pgtest.Query(t, c.URL, "select string_agg(who, ',' order by id) from t"); got != "setup" {
			t.Errorf("cluster %s: rows %q, want setup", c.Name, got)
		}
		if got := pgtest.Query(t, c.URL, "select current_setting('data_directory')"); got != c.DataDir {
			t.Errorf("cluster %s runs on %s, want %s", c.Name, got, c.DataDir)
		}
	}
	pgtest.Query(t, second.URL, "insert into t values (2, 'second') returning 'x'")
	if got := pgtest.Query(t, first.URL, "select count(*)::text from t"); got != "1" {
		t.Errorf("first cluster sees %s rows after a write to the second, want 1", got)
	}
	if os.Geteuid() == 0 {
		fi, err := os.Stat(second.DataDir)
		if err != nil {
			t.Fatal(err)
		}
		if fi.Sys().(*syscall.Stat_t).Uid == 0 {
			t.Error("as root, a cluster from a spare belongs to root, not the PostgreSQL user")
		}
	}

	// 8 parallel ups, one spare, refills held back by holding the refill
	// lock: exactly one gets the spare, the others copy, all run apart.
	refill, err := flock.Exclusive(context.Background(), filepath.Join(home, "locks", "spare-"+key+".lock"))
	if err != nil {
		t.Fatal(err)
	}
	const n = 8
	res, err := p.upsAtOnce(n, func(int) []string { return []string{"--setup", schema} })
	if err != nil {
		refill.Unlock()
		t.Fatal(err)
	}
	fromSpare, dirs := 0, map[string]bool{}
	for i, r := range res {
		if r.FromSpare {
			fromSpare++
		}
		if dirs[r.DataDir] {
			t.Errorf("data directory %s handed out twice", r.DataDir)
		}
		dirs[r.DataDir] = true
		if got := pgtest.Query(t, r.URL, "select current_setting('data_directory')"); got != r.DataDir {
			t.Errorf("cluster %s runs on %s, want %s", r.Name, got, r.DataDir)
		}
		pgtest.Query(t, r.URL, fmt.Sprintf("insert into t values (%d, 'own') returning 'x'", 10+i))
	}
	for _, r := range res {
		if got := pgtest.Query(t, r.URL, "select count(*)::text from t"); got != "2" {
			t.Errorf("cluster %s sees %s rows, want 2 (setup + its own)", r.Name, got)
		}
	}
	if fromSpare != 1 {
		t.Errorf("%d of %d parallel ups got the one spare, want 1", fromSpare, n)
	}
	if s := spareDirs(t, home, key); len(s) != 0 {
		t.Errorf("spares while refills are held back: %v", s)
	}
	refill.Unlock()
	waitSpare(t, home, key, 1)
	waitRefills(t, home)
	if s := spareDirs(t, home, key); len(s) != 1 {
		t.Errorf("%d spares after the parallel ups' refills, want 1 (--spares 1)", len(s))
	}

	// --spares 2 keeps two.
	p.up("--setup", schema, "--spares", "2")
	waitSpare(t, home, key, 2)

	// template rm takes the spares with it; clusters keep running.
	if r := p.run("template", "rm", key); r.code != 0 {
		t.Fatalf("template rm: exit %d: %s", r.code, r.stderr)
	}
	for _, n := range dirNames(t, filepath.Join(home, "clusters")) {
		if strings.HasPrefix(n, ".spare") {
			t.Errorf("template rm left %s", n)
		}
	}
	if got := pgtest.Query(t, second.URL, "select count(*)::text from t"); got != "2" {
		t.Errorf("cluster after template rm: %s rows", got)
	}
}

// TestSpareRefillKilled: a refiller killed (-9) mid-copy leaves nothing
// claimable, the next pgfork call cleans its leftover, and the next up
// does not use it. A spare whose template is gone is cleaned too.
func TestSpareRefillKilled(t *testing.T) {
	t.Parallel() // see TestMain
	p := newTestPgfk(t)
	bin, home := p.bin, p.home
	// A template big enough that its copy takes a while.
	schema := filepath.Join(testenv.Dir(t), "big.sql")
	writeFile(t, schema, "create table big as select g, repeat('x', 200) pad from generate_series(1, 400000) g;\n")
	c := p.up("--setup", schema, "--spares", "0")
	key := c.TemplateKey
	tmplData := filepath.Join(home, "templates", key, "data")
	want := fileCount(t, tmplData)

	killed := false
	for attempt := 0; attempt < 5 && !killed; attempt++ {
		cmd := exec.Command(bin, "--state-dir", home, "template", "refill", key, "--spares", "1")
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		for i := 0; i < 5000; i++ {
			if m, _ := filepath.Glob(filepath.Join(home, "clusters", ".sparebuild-"+key+"-*")); len(m) > 0 {
				break
			}
			time.Sleep(time.Millisecond)
		}
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		m, _ := filepath.Glob(filepath.Join(home, "clusters", ".sparebuild-"+key+"-*"))
		killed = len(m) > 0
		// Whatever is claimable is complete.
		for _, s := range spareDirs(t, home, key) {
			if got := fileCount(t, s); got != want {
				t.Errorf("claimable spare %s holds %d of %d entries", s, got, want)
			}
			trash := filepath.Join(home, "clusters", "x"+filepath.Base(s))
			if err := os.Rename(s, trash); err == nil {
				_ = os.RemoveAll(trash)
			}
		}
	}
	if !killed {
		t.Fatal("could not kill a refiller mid-copy in 5 attempts")
	}
	if s := spareDirs(t, home, key); len(s) != 0 {
		t.Fatalf("a killed refiller left claimable spares: %v", s)
	}
	// The next pgfork call (ls runs the reaper) removes the leftover.
	p.ls()
	if m, _ := filepath.Glob(filepath.Join(home, "clusters", ".sparebuild-*")); len(m) != 0 {
		t.Errorf("leftover of a killed refiller not cleaned: %v", m)
	}
	u := p.up("--setup", schema)
	if u.FromSpare {
		t.Error("up used a spare although the only refill was killed")
	}
	if got := pgtest.Query(t, u.URL, "select count(*)::text from big"); got != "400000" {
		t.Errorf("cluster: %s rows, want 400000", got)
	}
	waitSpare(t, home, key, 1)
	waitRefills(t, home)

	// A spare of a template that no longer exists is removed by the reaper.
	orphan := filepath.Join(home, "clusters", ".spare-"+strings.Repeat("ab", template.KeyLen/2)+"-00000000")
	if err := os.MkdirAll(filepath.Join(orphan, "base"), 0o700); err != nil {
		t.Fatal(err)
	}
	p.ls()
	if _, err := os.Stat(orphan); !os.IsNotExist(err) {
		t.Errorf("orphaned spare not removed: %v", err)
	}
	if s := spareDirs(t, home, key); len(s) != 1 {
		t.Errorf("the reaper touched a live template's spares: %v", s)
	}
}
