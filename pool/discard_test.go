package pool_test

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/pgfork/pgfork/internal/errs"
	"github.com/pgfork/pgfork/pool"
	"github.com/pgfork/pgfork/pool/dbstore"
)

// heldDrops is a dbstore.SQLCreator whose drops, once hold is set, wait
// until release is closed; held is closed when the first one waits.
type heldDrops struct {
	*dbstore.SQLCreator
	hold    atomic.Bool
	once    sync.Once
	held    chan struct{}
	release chan struct{}
}

// Drop drops name, once released when drops are held.
func (c *heldDrops) Drop(ctx context.Context, name string) error {
	if c.hold.Load() {
		c.once.Do(func() { close(c.held) })
		<-c.release
	}
	return c.SQLCreator.Drop(ctx, name)
}

// TestManagerReinitializeWaitsForDiscard (issue 58): a template of a
// hash whose discard still drops its predecessor's databases has the same
// names, and is not made until those drops have ended: it was made at
// once, and the discard then dropped the new template database under
// its client's migrations. It failed so before the fix.
func TestManagerReinitializeWaitsForDiscard(t *testing.T) {
	s := startPG(t)
	ctx := context.Background()
	cr := &heldDrops{SQLCreator: &dbstore.SQLCreator{Admin: s.admin}, held: make(chan struct{}), release: make(chan struct{})}
	if err := cr.Probe(ctx); err != nil {
		t.Fatal(err)
	}
	m, err := pool.NewManager(pool.ManagerConfig{Prefix: "rd", Initial: 2, Max: 2, GetTimeout: time.Minute}, dbstore.New(s.admin, cr))
	if err != nil {
		t.Fatal(err)
	}
	if err := m.Open(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = m.Close(context.Background()) })
	const hash = "h58d"
	readyTemplate(t, s, m, hash)
	if _, err := m.GetTestDatabase(ctx, hash); err != nil {
		t.Fatal(err)
	}

	cr.hold.Store(true)
	discarded := make(chan error, 1)
	go func() { discarded <- m.DiscardTemplate(ctx, hash) }()
	select {
	case <-cr.held:
	case <-time.After(time.Minute):
		t.Fatal("the discard dropped nothing within a minute")
	}
	// While the discard's drops are held, the new template must not be
	// made: a waiting initialize ends with its context.
	ictx, cancel := context.WithTimeout(ctx, 3*time.Second)
	_, err = m.InitializeTemplate(ictx, hash)
	cancel()
	close(cr.release)
	if derr := <-discarded; derr != nil {
		t.Fatalf("discard: %v", derr)
	}
	if err == nil {
		t.Fatal("a template was initialized while the discard of its hash was still dropping databases of the same names")
	}
	if !errs.Is(err, errs.Interrupted) {
		t.Fatalf("initialize during the discard: %v, want it interrupted while waiting", err)
	}

	// Once the discard is over, the hash is made again, and its copies
	// are there.
	readyTemplate(t, s, m, hash)
	db, err := m.GetTestDatabase(ctx, hash)
	if err != nil {
		t.Fatal(err)
	}
	s.mustExec(t, db.Name, "SELECT count(*) FROM items")
}
