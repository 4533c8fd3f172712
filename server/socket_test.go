package server_test

import (
	"context"
	"net/http/httptest"
	"net/url"
	"strconv"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/pgfork/pgfork/server"
)

// socketAnswer is a hand-out's answer with its socketDir, nil when absent.
type socketAnswer struct {
	Database struct {
		Config struct {
			config
			SocketDir *string `json:"socketDir"`
		} `json:"config"`
	} `json:"database"`
}

// TestSocketOnRequest: a hand-out asked with ?socket=1 names the managed
// server's Unix socket directory (socketDir), where the role handed out
// connects without its password and without SCRAM (issue 33: 0.2-0.3 s of
// CPU per connection in a Rust debug build) and is the same role, owner of
// the same objects; a hand-out that does not ask is IntegreSQL's answer
// exactly (no socketDir), and a server given no socket directory never
// names one.
func TestSocketOnRequest(t *testing.T) {
	e := newEnv(t, opts{init: 1, max: 8})
	sock := e.managed.Inst.SocketDir
	withSock := httptest.NewServer(server.New(server.Config{Manager: e.mgr, Conn: e.managed.Conn, SocketDir: sock}))
	t.Cleanup(withSock.Close)
	const h = "50c4e7d1a2b3c4d5e6f708192a3b4c5d"
	// Initialize asked too: the migrating client may connect there as well.
	var tpl struct {
		Database struct {
			Config struct {
				config
				SocketDir string `json:"socketDir"`
			} `json:"config"`
		} `json:"database"`
	}
	(&env{srv: withSock}).expect(t, "POST", "/api/v2/templates?socket=1", map[string]string{"hash": h}, 200).json(t, &tpl)
	if tpl.Database.Config.SocketDir != sock {
		t.Errorf("initialize with ?socket=1: socketDir %q, want %s", tpl.Database.Config.SocketDir, sock)
	}
	if err := execAs(t, tpl.Database.Config.config, "CREATE TABLE t(id int)"); err != nil {
		t.Fatal(err)
	}
	e.expect(t, "PUT", "/api/v1/templates/"+h, nil, 204)

	get := func(srv *httptest.Server, path string) socketAnswer {
		t.Helper()
		e2 := &env{srv: srv}
		var a socketAnswer
		e2.expect(t, "GET", path, nil, 200).json(t, &a)
		return a
	}
	// Not asked, or a server without a socket: no socketDir at all.
	for _, c := range []struct {
		srv  *httptest.Server
		path string
	}{{withSock, "/api/v2/templates/" + h + "/tests"}, {withSock, "/api/v1/templates/" + h + "/tests?socket=0"},
		{e.srv, "/api/v2/templates/" + h + "/tests?socket=1"}} {
		if a := get(c.srv, c.path); a.Database.Config.SocketDir != nil {
			t.Errorf("GET %s (socket dir configured: %v) answered socketDir %q", c.path, c.srv == withSock, *a.Database.Config.SocketDir)
		}
	}
	for _, path := range []string{"/api/v2/templates/" + h + "/tests?socket=1", "/api/v1/templates/" + h + "/tests?socket=1"} {
		a := get(withSock, path)
		c := a.Database.Config
		if c.SocketDir == nil || *c.SocketDir != sock {
			t.Fatalf("GET %s: socketDir %v, want %s", path, c.SocketDir, sock)
		}
		// The TCP address is still there for clients that cannot reach the socket.
		if c.Host != e.managed.Conn.Host || c.Port != e.managed.Conn.Port || c.Password == "" {
			t.Errorf("GET %s: TCP config %+v lost", path, c.config)
		}
		q := url.Values{"host": {sock}, "port": {strconv.Itoa(c.Port)}, "user": {c.Username}, "sslmode": {"disable"}}
		ctx := context.Background()
		conn, err := pgx.Connect(ctx, "postgres:///"+c.Database+"?"+q.Encode())
		if err != nil {
			t.Fatalf("connecting on the socket without a password: %v", err)
		}
		var cur, sess, owner string
		err = conn.QueryRow(ctx, `INSERT INTO t VALUES (1) RETURNING current_user, session_user,
			(SELECT tableowner FROM pg_tables WHERE tablename = 't')`).Scan(&cur, &sess, &owner)
		conn.Close(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if cur != c.Username || sess != c.Username || owner != c.Username {
			t.Errorf("on the socket: current_user %s, session_user %s, table owner %s; want %s for all", cur, sess, owner, c.Username)
		}
	}
}
