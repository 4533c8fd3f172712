package branches

import (
	"context"
	"path/filepath"
	"sync"
	"testing"

	"github.com/pgfork/pgfork/internal/pgtest"
	"github.com/pgfork/pgfork/internal/statedir"
	"github.com/pgfork/pgfork/internal/testenv"
	"github.com/pgfork/pgfork/pgbackup"
	"github.com/pgfork/pgfork/pgbin"
)

// TestCrossingNotice: a backup chain and a stopped cluster on XFS, the
// state directory on a tmpfs: each branch made of them is a full copy,
// and OnNotice is told so before it is made, with the size and both
// filesystems; the branches are made all the same. With the state
// directory on the same XFS the copies clone and nothing is said.
func TestCrossingNotice(t *testing.T) {
	t.Parallel() // see env
	ctx := context.Background()
	b := pgtest.Builds(t, 0)[0]
	dir := testenv.XFSDir(t)
	src := filepath.Join(dir, "src")
	pgtest.InitDB(t, src, pgtest.Server{BinDir: b.Bin})
	in := pgtest.Start(t, src, pgtest.Server{BinDir: b.Bin})
	pgtest.Exec(t, in.ConnString("", ""), "CREATE TABLE t AS SELECT g AS id FROM generate_series(1, 1000) g")
	chain := filepath.Join(dir, "chain")
	if _, err := pgbackup.Take(ctx, pgbackup.TakeOptions{Dir: chain, ConnString: in.ConnString("", ""),
		PGBin: pgbin.Options{Explicit: b.Bin, StateDir: t.TempDir()}}); err != nil {
		t.Fatal(err)
	}
	pgtest.Stop(t, in)
	sources := []Source{{Name: "nightly", Kind: SourceBackup, Chain: chain}, {Name: "stopped", Kind: SourceCluster, DataDir: src}}
	const minBytes = 10 << 20 // an initdb'd cluster is bigger

	var mu sync.Mutex
	var got []Notice
	onNotice := func(n Notice) { mu.Lock(); got = append(got, n); mu.Unlock() }

	state := filepath.Join(testenv.TmpfsDir(t), "state")
	m := open(t, Options{Layout: statedir.Layout{Root: state}, Installation: b.Inst, User: b.User,
		Sources: sources, AdminTokens: []string{"admin"}, OnNotice: onNotice})
	admin := Caller{Token: "admin"}
	for _, s := range sources {
		br, err := m.Create(ctx, admin, CreateOptions{Name: "of-" + s.Name, Source: s.Name})
		if err != nil {
			t.Fatal(err)
		}
		if n := pgtest.Query(t, br.URL(), "SELECT count(*) FROM t"); n != "1000" {
			t.Errorf("branch of %s has %s rows, want 1000", s.Name, n)
		}
	}
	if len(got) != 2 {
		t.Fatalf("notices %+v, want one for each source", got)
	}
	for i, n := range got {
		s := sources[i]
		from := map[string]string{"nightly": chain, "stopped": src}[s.Name]
		if n.Source != s.Name || n.From != from || n.To != state || n.SrcFS != "xfs" || n.DstFS != "tmpfs" || n.Bytes < minBytes {
			t.Errorf("notice %+v, want source %s from %s (xfs) to %s (tmpfs), at least %d bytes", n, s.Name, from, state, minBytes)
		}
	}

	got = nil
	m = open(t, Options{Layout: statedir.Layout{Root: filepath.Join(dir, "state")}, Installation: b.Inst, User: b.User,
		Sources: sources, AdminTokens: []string{"admin"}, OnNotice: onNotice})
	for _, s := range sources {
		if _, err := m.CreateSnapshot(ctx, admin, SnapshotOptions{Name: "snap-" + s.Name, Source: s.Name}); err != nil {
			t.Fatal(err)
		}
	}
	if len(got) != 0 {
		t.Errorf("state on the sources' XFS: notices %+v, want none", got)
	}
}
