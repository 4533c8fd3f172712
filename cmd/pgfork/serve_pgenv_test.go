package main

import (
	"context"
	"fmt"
	"net/url"
	"path/filepath"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/pgfork/pgfork/instance"
	"github.com/pgfork/pgfork/internal/testenv"
	"github.com/pgfork/pgfork/server/managed"
)

// TestServeForARunIgnoresAppPGEnv (issue 58): a serve started for a test
// run (--exit-with-parent or --lease, as every client's glue starts it)
// runs its own PostgreSQL although PGHOST, PGPORT, PGUSER, PGPASSWORD and
// PGDATABASE name a server: they are the application's, and nothing is
// written into that server; the log says in one line which PostgreSQL
// runs and why, naming the variables left to the application.
// PGFORK_PG_URL still names a server for it. Before, the variables chose
// the application's server, and serve made its templates and test
// databases there.
func TestServeForARunIgnoresAppPGEnv(t *testing.T) {
	bin := pgforkBinary(t)
	pgBin := testenv.PGBinDirs(t)[0]
	u, err := instance.ResolveUser("")
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	app, err := managed.Start(ctx, managed.Options{BinDir: pgBin, Dir: filepath.Join(testenv.Dir(t), "app"), User: u})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = app.Stop(context.Background()) }()
	env := []string{"PGHOST=127.0.0.1", fmt.Sprintf("PGPORT=%d", app.Conn.Port), "PGUSER=" + app.Conn.Username,
		"PGPASSWORD=" + app.Conn.Password, "PGDATABASE=app"}

	home := testenv.Dir(t)
	s := startServe(t, bin, home, pgBin, env, "--exit-with-parent")
	code, body := s.call(t, "POST", "/api/v1/templates", `{"hash":"app58"}`)
	if code != 200 || strings.Contains(body, fmt.Sprintf(`"port":%d`, app.Conn.Port)) {
		t.Errorf("initialize: %d %s; want a template outside the application's server (port %d)", code, body, app.Conn.Port)
	}
	if !hasManaged(home) {
		t.Error("no managed cluster: the application's PGHOST… chose serve's PostgreSQL")
	}
	pgURL := (&url.URL{Scheme: "postgres", User: url.UserPassword(app.Conn.Username, app.Conn.Password),
		Host: fmt.Sprintf("127.0.0.1:%d", app.Conn.Port), Path: "/postgres", RawQuery: "sslmode=disable"}).String()
	c, err := pgx.Connect(ctx, pgURL)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = c.Close(ctx) }()
	var written []string
	rows, err := c.Query(ctx, `SELECT datname FROM pg_database WHERE starts_with(datname, 'pgfork')
		UNION ALL SELECT relname FROM pg_class WHERE starts_with(relname, 'pgfork_serve')`)
	if err != nil {
		t.Fatal(err)
	}
	if written, err = pgx.CollectRows(rows, pgx.RowTo[string]); err != nil {
		t.Fatal(err)
	}
	if len(written) > 0 {
		t.Errorf("serve wrote into the application's server: %v", written)
	}
	var line string
	for _, l := range strings.Split(s.stderr.String(), "\n") {
		if strings.Contains(l, "PostgreSQL server") && strings.Contains(l, "because=") {
			line = l
		}
	}
	if !strings.Contains(line, "pgfork's own") || !strings.Contains(line, "PGHOST, PGPORT, PGUSER, PGPASSWORD, PGDATABASE set: the application's") {
		t.Errorf("the start's line on its PostgreSQL does not say it runs its own and why: %q\n%s", line, s.stderr)
	}

	// PGFORK_PG_URL names a server for a run's serve too.
	home2 := testenv.Dir(t)
	s2 := startServe(t, bin, home2, pgBin, append(env, "PGFORK_PG_URL="+pgURL), "--exit-with-parent")
	if code, body := s2.call(t, "POST", "/api/v1/templates", `{"hash":"app58"}`); code != 200 || !strings.Contains(body, fmt.Sprintf(`"port":%d`, app.Conn.Port)) {
		t.Errorf("initialize with PGFORK_PG_URL: %d %s; want the server it names (port %d)", code, body, app.Conn.Port)
	}
	if hasManaged(home2) {
		t.Error("a managed cluster was started although PGFORK_PG_URL names a server")
	}
}
