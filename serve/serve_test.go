package serve_test

import (
	"context"
	"path/filepath"
	"testing"
	"time"

	"github.com/pgfork/pgfork/instance"
	"github.com/pgfork/pgfork/internal/errs"
	"github.com/pgfork/pgfork/internal/pgtest"
	"github.com/pgfork/pgfork/internal/statedir"
	"github.com/pgfork/pgfork/internal/testenv"
	"github.com/pgfork/pgfork/pgbin"
	"github.com/pgfork/pgfork/pool"
	"github.com/pgfork/pgfork/serve"
)

func managedOptions(t *testing.T, root string) serve.ManagedOptions {
	t.Helper()
	pg, err := pgbin.Find(pgbin.Options{Explicit: testenv.PGBinDirs(t)[0]}, 0)
	if err != nil {
		t.Fatal(err)
	}
	u := pgtest.User(t)
	return serve.ManagedOptions{Manager: pool.ManagerConfig{Prefix: "pfsv", Max: 4, Parallel: 2},
		Layout: statedir.Layout{Root: root}, PG: pg, User: u}
}

func running(data string) bool {
	_, err := instance.Attach(data)
	return err == nil
}

// TestManagedClosedOnEveryPath: the managed server NewManaged starts is
// stopped by Close, and also when the constructor fails after starting it
// (here: the manager refuses its configuration), so no exit path of
// `pgfork serve` leaves it running.
func TestManagedClosedOnEveryPath(t *testing.T) {
	root := testenv.Dir(t)
	data := filepath.Join(root, "serve", "pgdata")
	ctx := context.Background()

	o := managedOptions(t, root)
	b, err := serve.NewManaged(ctx, o)
	if err != nil {
		t.Fatal(err)
	}
	if !running(data) {
		t.Fatal("the managed server does not run after NewManaged")
	}
	if b.Owner == "" || b.Conn.Port == 0 || b.Manager == nil {
		t.Fatalf("backend = %+v, want an owner, a port and a manager", b)
	}
	if _, err := b.Manager.InitializeTemplate(ctx, "closepath"); err != nil {
		t.Fatal(err)
	}
	cctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	if err := b.Close(cctx); err != nil {
		t.Fatalf("Close: %v", err)
	}
	if running(data) {
		t.Fatal("the managed server still runs after Close")
	}
	if err := b.Close(cctx); err != nil {
		t.Fatalf("second Close: %v", err)
	}

	// A failure after the server started stops it too.
	bad := managedOptions(t, root)
	bad.Manager.Prefix = "Not A Prefix"
	if _, err := serve.NewManaged(ctx, bad); errs.KindOf(err) != errs.Usage {
		t.Fatalf("NewManaged with a bad prefix: %v, want a usage error", err)
	}
	if running(data) {
		t.Fatal("the managed server still runs after NewManaged failed")
	}
}

// TestExternalUnreachable: an external server that does not answer is an
// error naming the connection, and nothing is left open.
func TestExternalUnreachable(t *testing.T) {
	conn, err := serve.ParseConn("postgres://someone:pw@127.0.0.1:1/postgres?connect_timeout=5")
	if err != nil {
		t.Fatal(err)
	}
	if conn.Username != "someone" || conn.Port != 1 || conn.Password != "pw" {
		t.Fatalf("ParseConn = %+v", conn)
	}
	_, err = serve.NewExternal(context.Background(), serve.ExternalOptions{
		Manager: pool.ManagerConfig{Prefix: "pfsv"}, AdminURL: "postgres://someone:pw@127.0.0.1:1/postgres?connect_timeout=5", Conn: conn})
	if err == nil {
		t.Fatal("NewExternal of an unreachable server succeeded")
	}
	if _, err := serve.ParseConn("postgres://[bad"); errs.KindOf(err) != errs.Usage {
		t.Fatalf("ParseConn of a bad URL: %v, want a usage error", err)
	}
}
