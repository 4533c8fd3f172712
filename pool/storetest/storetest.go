// Package storetest is the conformance suite every pool.Store backend
// passes (the model is restic's backend test suite): the same steps, run
// against the real thing — a PostgreSQL server for pool/dbstore, real
// clusters for pool/clusterstore — so that the Manager may rely on one
// behaviour whatever the backend. It is imported by _test files only.
package storetest

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgfork/pgfork/pool"
)

// Suite describes one backend to the tests.
type Suite struct {
	// Open returns the backend's store over the same state on every call
	// (the same server or directory): a second Open after Close is a
	// restart. It is called with the suite's top-level test, so cleanups
	// it registers last until the suite ends.
	Open func(t *testing.T) pool.Store
	// Connect opens a session on the database of ep as a role that may
	// read and write it (the backend's client role).
	Connect func(t *testing.T, ep pool.Endpoint) (*pgx.Conn, error)
	// CopyExists reports whether the backend still holds test copy or
	// template name, looking at the server or directory itself.
	CopyExists func(t *testing.T, name string) bool
	// Owner is the role templates and test copies are created for.
	Owner string
	// Root is the database templates start from ("" means template0).
	Root string
}

func ctxT(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	t.Cleanup(cancel)
	return ctx
}

// names are one subtest's own: its prefix (state and epochs are kept per
// prefix), its template and its test copies, so that no subtest depends on
// what another one did and a failure in one hides none of the others.
type names struct {
	prefix, testPrefix, tmpl, test, left, hash string
}

func namesFor(step string) names {
	p := "pfst" + step
	return names{prefix: p, testPrefix: p + "_test_", tmpl: p + "_template_conf",
		test: p + "_test_conf_1", left: p + "_test_conf_2", hash: "conf" + step}
}

// open opens the backend for one subtest and closes it when the subtest
// ends. restart replaces the store it points to.
func open(t *testing.T, top *testing.T, s Suite) *pool.Store {
	st := s.Open(top)
	t.Cleanup(func() { _ = st.Close(context.Background()) })
	return &st
}

// restart closes the store and opens it again over the same state.
func restart(t *testing.T, top *testing.T, s Suite, st *pool.Store) {
	t.Helper()
	if err := (*st).Close(ctxT(t)); err != nil {
		t.Fatalf("Close: %v", err)
	}
	*st = s.Open(top)
}

// ready makes n's template as a client would: recover (a server start),
// create, migrate through its endpoint, finalize, record it finalized.
func ready(t *testing.T, s Suite, st pool.Store, n names) {
	t.Helper()
	ctx := ctxT(t)
	if _, _, err := st.Recover(ctx, n.prefix, n.testPrefix, true); err != nil {
		t.Fatalf("Recover: %v", err)
	}
	if err := st.CreateTemplate(ctx, n.tmpl, s.Owner, s.Root); err != nil {
		t.Fatalf("CreateTemplate: %v", err)
	}
	exec(t, s, st.Endpoint(n.tmpl), "CREATE TABLE conf (v text); INSERT INTO conf VALUES ('from the template')")
	if err := st.FinalizeTemplate(ctx, n.tmpl); err != nil {
		t.Fatalf("FinalizeTemplate: %v", err)
	}
	if err := st.Save(ctx, n.prefix, pool.Record{Hash: n.hash, Name: n.tmpl, State: "finalized"}); err != nil {
		t.Fatalf("Save: %v", err)
	}
}

// Run runs the suite on the backend s: independent subtests, each over its
// own prefix and names, each setting up what it needs, so that a failing
// one hides none of the others.
func Run(t *testing.T, s Suite) {
	if s.Root == "" {
		s.Root = "template0"
	}
	top := t // Open registers cleanups that must outlive a subtest
	t.Run("Open", func(t *testing.T) {
		n := namesFor("a")
		st := *open(t, top, s)
		ctx := ctxT(t)
		if err := st.Ping(ctx); err != nil {
			t.Fatalf("Ping: %v", err)
		}
		recs, epoch, err := st.Recover(ctx, n.prefix, n.testPrefix, true)
		if err != nil {
			t.Fatalf("Recover on a new store: %v", err)
		}
		if len(recs) != 0 || epoch != 1 {
			t.Fatalf("Recover on a new store = %v, epoch %d; want no records, epoch 1", recs, epoch)
		}
	})
	t.Run("CreateTemplate", func(t *testing.T) {
		n := namesFor("b")
		st := *open(t, top, s)
		ctx := ctxT(t)
		if ex, err := st.TemplateExists(ctx, n.tmpl); err != nil || ex {
			t.Fatalf("TemplateExists before creation = %v, %v; want false", ex, err)
		}
		if err := st.CreateTemplate(ctx, n.tmpl, s.Owner, s.Root); err != nil {
			t.Fatalf("CreateTemplate: %v", err)
		}
		if ex, err := st.TemplateExists(ctx, n.tmpl); err != nil || !ex {
			t.Fatalf("TemplateExists after creation = %v, %v; want true", ex, err)
		}
		if err := st.Save(ctx, n.prefix, pool.Record{Hash: n.hash, Name: n.tmpl, State: "initializing"}); err != nil {
			t.Fatalf("Save: %v", err)
		}
		// The client migrates the template through its endpoint.
		exec(t, s, st.Endpoint(n.tmpl), "CREATE TABLE conf (v text); INSERT INTO conf VALUES ('from the template')")
		if got := query(t, s, st.Endpoint(n.tmpl), "SELECT v FROM conf"); got != "from the template" {
			t.Fatalf("template holds %q after migrating it", got)
		}
	})
	t.Run("Finalize", func(t *testing.T) {
		n := namesFor("c")
		st := *open(t, top, s)
		ctx := ctxT(t)
		if err := st.CreateTemplate(ctx, n.tmpl, s.Owner, s.Root); err != nil {
			t.Fatalf("CreateTemplate: %v", err)
		}
		if err := st.FinalizeTemplate(ctx, n.tmpl); err != nil {
			t.Fatalf("FinalizeTemplate: %v", err)
		}
		if err := st.Save(ctx, n.prefix, pool.Record{Hash: n.hash, Name: n.tmpl, State: "finalized"}); err != nil {
			t.Fatalf("Save: %v", err)
		}
		if ex, err := st.TemplateExists(ctx, n.tmpl); err != nil || !ex {
			t.Fatalf("TemplateExists after finalize = %v, %v; want true", ex, err)
		}
	})
	t.Run("CreateTestCopy", func(t *testing.T) {
		n := namesFor("d")
		st := *open(t, top, s)
		ready(t, s, st, n)
		strategy, err := st.Create(ctxT(t), n.test, n.tmpl, s.Owner)
		if err != nil {
			t.Fatalf("Create: %v", err)
		}
		if strategy == "" {
			t.Error("Create returned no strategy name")
		}
		if !s.CopyExists(t, n.test) {
			t.Fatalf("test copy %s does not exist after Create", n.test)
		}
		if got := query(t, s, st.Endpoint(n.test), "SELECT v FROM conf"); got != "from the template" {
			t.Fatalf("test copy holds %q, want the template's row", got)
		}
		// A test copy is the client's own: what it writes stays in it.
		exec(t, s, st.Endpoint(n.test), "UPDATE conf SET v = 'changed by the test'")
		if got := query(t, s, st.Endpoint(n.test), "SELECT v FROM conf"); got != "changed by the test" {
			t.Fatalf("test copy holds %q after the test's write", got)
		}
	})
	t.Run("Drop", func(t *testing.T) {
		n := namesFor("e")
		st := *open(t, top, s)
		ready(t, s, st, n)
		ctx := ctxT(t)
		if _, err := st.Create(ctx, n.test, n.tmpl, s.Owner); err != nil {
			t.Fatalf("Create: %v", err)
		}
		exec(t, s, st.Endpoint(n.test), "UPDATE conf SET v = 'changed by the test'")
		if err := st.Drop(ctx, n.test); err != nil {
			t.Fatalf("Drop: %v", err)
		}
		if s.CopyExists(t, n.test) {
			t.Fatalf("test copy %s exists after Drop", n.test)
		}
		if err := st.Drop(ctx, n.test); err != nil {
			t.Fatalf("Drop of a dropped copy: %v, want nil", err)
		}
		// The template is untouched by what the test copy did.
		if _, err := st.Create(ctx, n.test, n.tmpl, s.Owner); err != nil {
			t.Fatalf("Create after Drop: %v", err)
		}
		if got := query(t, s, st.Endpoint(n.test), "SELECT v FROM conf"); got != "from the template" {
			t.Fatalf("second test copy holds %q, want the template's row", got)
		}
		if err := st.Drop(ctx, n.test); err != nil {
			t.Fatalf("Drop: %v", err)
		}
	})
	t.Run("RecoverAfterRestart", func(t *testing.T) {
		n := namesFor("f")
		st := open(t, top, s)
		ready(t, s, *st, n) // the first start: epoch 1
		ctx := ctxT(t)
		// A copy the crashed run left behind, state unknown.
		if _, err := (*st).Create(ctx, n.left, n.tmpl, s.Owner); err != nil {
			t.Fatalf("Create: %v", err)
		}
		restart(t, top, s, st)
		recs, epoch, err := (*st).Recover(ctx, n.prefix, n.testPrefix, true)
		if err != nil {
			t.Fatalf("Recover after restart: %v", err)
		}
		if epoch != 2 {
			t.Errorf("epoch after one restart = %d, want 2", epoch)
		}
		if len(recs) != 1 || recs[0] != (pool.Record{Hash: n.hash, Name: n.tmpl, State: "finalized"}) {
			t.Fatalf("Recover = %+v, want the finalized template's record", recs)
		}
		if s.CopyExists(t, n.left) {
			t.Fatalf("test copy %s left by the previous run survives Recover", n.left)
		}
		if ex, err := (*st).TemplateExists(ctx, n.tmpl); err != nil || !ex {
			t.Fatalf("TemplateExists after restart = %v, %v; want true", ex, err)
		}
		// The recovered template still makes copies.
		if _, err := (*st).Create(ctx, n.test, n.tmpl, s.Owner); err != nil {
			t.Fatalf("Create after restart: %v", err)
		}
		if got := query(t, s, (*st).Endpoint(n.test), "SELECT v FROM conf"); got != "from the template" {
			t.Fatalf("test copy after restart holds %q, want the template's row", got)
		}
		if err := (*st).Drop(ctx, n.test); err != nil {
			t.Fatalf("Drop: %v", err)
		}
	})
	t.Run("DropTemplate", func(t *testing.T) {
		n := namesFor("g")
		st := open(t, top, s)
		ready(t, s, *st, n) // epoch 1
		ctx := ctxT(t)
		if err := (*st).DropTemplate(ctx, n.tmpl); err != nil {
			t.Fatalf("DropTemplate: %v", err)
		}
		if ex, err := (*st).TemplateExists(ctx, n.tmpl); err != nil || ex {
			t.Fatalf("TemplateExists after DropTemplate = %v, %v; want false", ex, err)
		}
		if err := (*st).Forget(ctx, n.prefix, n.hash); err != nil {
			t.Fatalf("Forget: %v", err)
		}
		restart(t, top, s, st)
		recs, epoch, err := (*st).Recover(ctx, n.prefix, n.testPrefix, true)
		if err != nil || len(recs) != 0 || epoch != 2 {
			t.Fatalf("Recover after Forget = %+v, epoch %d, %v; want no records, epoch 2", recs, epoch, err)
		}
	})
}

func exec(t *testing.T, s Suite, ep pool.Endpoint, sql string) {
	t.Helper()
	c, err := s.Connect(t, ep)
	if err != nil {
		t.Fatalf("connect to %+v: %v", ep, err)
	}
	defer c.Close(context.Background())
	if _, err := c.Exec(ctxT(t), sql); err != nil {
		t.Fatalf("%s on %+v: %v", sql, ep, err)
	}
}

func query(t *testing.T, s Suite, ep pool.Endpoint, sql string) string {
	t.Helper()
	c, err := s.Connect(t, ep)
	if err != nil {
		t.Fatalf("connect to %+v: %v", ep, err)
	}
	defer c.Close(context.Background())
	var v string
	if err := c.QueryRow(ctxT(t), sql).Scan(&v); err != nil {
		t.Fatalf("%s on %+v: %v", sql, ep, err)
	}
	return v
}
