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

const (
	prefix     = "pfst"
	testPrefix = prefix + "_test_"
	tmplName   = prefix + "_template_conf"
	testName   = testPrefix + "conf_1"
	leftName   = testPrefix + "conf_2"
)

func ctxT(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	t.Cleanup(cancel)
	return ctx
}

// Run runs every test of the suite on the backend s, in order (each step
// builds on the previous ones, as a server's life does).
func Run(t *testing.T, s Suite) {
	if s.Root == "" {
		s.Root = "template0"
	}
	ctx := ctxT(t)
	top := t // Open registers cleanups that must outlive a subtest
	st := s.Open(top)
	closed := false
	t.Cleanup(func() {
		if !closed {
			_ = st.Close(context.Background())
		}
	})
	ok := t.Run("Open", func(t *testing.T) {
		if err := st.Ping(ctx); err != nil {
			t.Fatalf("Ping: %v", err)
		}
		recs, epoch, err := st.Recover(ctx, prefix, testPrefix, true)
		if err != nil {
			t.Fatalf("Recover on a new store: %v", err)
		}
		if len(recs) != 0 || epoch != 1 {
			t.Fatalf("Recover on a new store = %v, epoch %d; want no records, epoch 1", recs, epoch)
		}
	})
	ok = ok && t.Run("CreateTemplate", func(t *testing.T) {
		if ex, err := st.TemplateExists(ctx, tmplName); err != nil || ex {
			t.Fatalf("TemplateExists before creation = %v, %v; want false", ex, err)
		}
		if err := st.CreateTemplate(ctx, tmplName, s.Owner, s.Root); err != nil {
			t.Fatalf("CreateTemplate: %v", err)
		}
		if ex, err := st.TemplateExists(ctx, tmplName); err != nil || !ex {
			t.Fatalf("TemplateExists after creation = %v, %v; want true", ex, err)
		}
		if err := st.Save(ctx, prefix, pool.Record{Hash: "conf", Name: tmplName, State: "initializing"}); err != nil {
			t.Fatalf("Save: %v", err)
		}
		// The client migrates the template through its endpoint.
		exec(t, s, st.Endpoint(tmplName), "CREATE TABLE conf (v text); INSERT INTO conf VALUES ('from the template')")
	})
	ok = ok && t.Run("Finalize", func(t *testing.T) {
		if err := st.FinalizeTemplate(ctx, tmplName); err != nil {
			t.Fatalf("FinalizeTemplate: %v", err)
		}
		if err := st.Save(ctx, prefix, pool.Record{Hash: "conf", Name: tmplName, State: "finalized"}); err != nil {
			t.Fatalf("Save: %v", err)
		}
	})
	ok = ok && t.Run("CreateTestCopy", func(t *testing.T) {
		strategy, err := st.Create(ctx, testName, tmplName, s.Owner)
		if err != nil {
			t.Fatalf("Create: %v", err)
		}
		if strategy == "" {
			t.Error("Create returned no strategy name")
		}
		if !s.CopyExists(t, testName) {
			t.Fatalf("test copy %s does not exist after Create", testName)
		}
		if got := query(t, s, st.Endpoint(testName), "SELECT v FROM conf"); got != "from the template" {
			t.Fatalf("test copy holds %q, want the template's row", got)
		}
		// A test copy is the client's own: what it writes stays in it.
		exec(t, s, st.Endpoint(testName), "UPDATE conf SET v = 'changed by the test'")
	})
	ok = ok && t.Run("Drop", func(t *testing.T) {
		if err := st.Drop(ctx, testName); err != nil {
			t.Fatalf("Drop: %v", err)
		}
		if s.CopyExists(t, testName) {
			t.Fatalf("test copy %s exists after Drop", testName)
		}
		if err := st.Drop(ctx, testName); err != nil {
			t.Fatalf("Drop of a dropped copy: %v, want nil", err)
		}
		// The template is untouched by what the test copy did.
		if _, err := st.Create(ctx, testName, tmplName, s.Owner); err != nil {
			t.Fatalf("Create after Drop: %v", err)
		}
		if got := query(t, s, st.Endpoint(testName), "SELECT v FROM conf"); got != "from the template" {
			t.Fatalf("second test copy holds %q, want the template's row", got)
		}
		if err := st.Drop(ctx, testName); err != nil {
			t.Fatalf("Drop: %v", err)
		}
	})
	ok = ok && t.Run("RecoverAfterRestart", func(t *testing.T) {
		// A copy the crashed run left behind, state unknown.
		if _, err := st.Create(ctx, leftName, tmplName, s.Owner); err != nil {
			t.Fatalf("Create: %v", err)
		}
		closed = true
		if err := st.Close(ctx); err != nil {
			t.Fatalf("Close: %v", err)
		}
		st = s.Open(top)
		closed = false
		recs, epoch, err := st.Recover(ctx, prefix, testPrefix, true)
		if err != nil {
			t.Fatalf("Recover after restart: %v", err)
		}
		if epoch != 2 {
			t.Errorf("epoch after one restart = %d, want 2", epoch)
		}
		if len(recs) != 1 || recs[0] != (pool.Record{Hash: "conf", Name: tmplName, State: "finalized"}) {
			t.Fatalf("Recover = %+v, want the finalized template's record", recs)
		}
		if s.CopyExists(t, leftName) {
			t.Fatalf("test copy %s left by the previous run survives Recover", leftName)
		}
		if ex, err := st.TemplateExists(ctx, tmplName); err != nil || !ex {
			t.Fatalf("TemplateExists after restart = %v, %v; want true", ex, err)
		}
		// The recovered template still makes copies.
		if _, err := st.Create(ctx, testName, tmplName, s.Owner); err != nil {
			t.Fatalf("Create after restart: %v", err)
		}
		if got := query(t, s, st.Endpoint(testName), "SELECT v FROM conf"); got != "from the template" {
			t.Fatalf("test copy after restart holds %q, want the template's row", got)
		}
		if err := st.Drop(ctx, testName); err != nil {
			t.Fatalf("Drop: %v", err)
		}
	})
	ok = ok && t.Run("DropTemplate", func(t *testing.T) {
		if err := st.DropTemplate(ctx, tmplName); err != nil {
			t.Fatalf("DropTemplate: %v", err)
		}
		if ex, err := st.TemplateExists(ctx, tmplName); err != nil || ex {
			t.Fatalf("TemplateExists after DropTemplate = %v, %v; want false", ex, err)
		}
		if err := st.Forget(ctx, prefix, "conf"); err != nil {
			t.Fatalf("Forget: %v", err)
		}
		closed = true
		if err := st.Close(ctx); err != nil {
			t.Fatalf("Close: %v", err)
		}
		st = s.Open(top)
		closed = false
		recs, epoch, err := st.Recover(ctx, prefix, testPrefix, true)
		if err != nil || len(recs) != 0 || epoch != 3 {
			t.Fatalf("Recover after Forget = %+v, epoch %d, %v; want no records, epoch 3", recs, epoch, err)
		}
	})
	_ = ok
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
