package server_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgfork/pgfork/internal/testenv"
)

// TestRestartUnderLoad restarts the API server (not PostgreSQL) while
// clients are mid-run, some of them holding databases. After the restart:
// the finalized template is back without its migration running again
// (every client's initialize gets 423), the databases handed out before
// are dropped (their names are gone from the catalog), an old holder's
// unlock on the native API gets 404, and clients carry on getting fresh databases (a marker
// table proves none is handed to two clients or handed out dirty).
func TestRestartUnderLoad(t *testing.T) {
	const (
		clients = 8
		holders = 3 // clients 0..holders-1 keep their database across the restart
		after   = 15
	)
	o := opts{init: 4, max: 12, getTimeout: 20 * time.Second}
	e := newEnv(t, o)
	var base atomic.Pointer[string]
	setURL := func() { u := e.srv.URL; base.Store(&u) }
	setURL()
	var epoch atomic.Int64   // restarts so far
	var stopping atomic.Bool // the old server is being stopped
	var migrations atomic.Int64
	client := &http.Client{Timeout: 30 * time.Second}

	// call retries while the server is away (connection refused, or 503
	// while it shuts down or a pool under load made nothing in time), each
	// call within a deadline of its own that no load reaches.
	call := func(method, path string) (int, []byte, error) {
		for deadline := time.Now().Add(testenv.WaitTimeout); ; time.Sleep(20 * time.Millisecond) {
			req, _ := http.NewRequest(method, *base.Load()+path, nil)
			if method == "POST" && path == "/api/v1/templates" {
				req, _ = http.NewRequest(method, *base.Load()+path, strings.NewReader(`{"hash":"load"}`))
			}
			res, err := client.Do(req)
			if err == nil {
				var b [4096]byte
				n, _ := res.Body.Read(b[:])
				res.Body.Close()
				if res.StatusCode != 503 {
					return res.StatusCode, b[:n], nil
				}
				err = fmt.Errorf("503: %s", b[:n])
			}
			if time.Now().After(deadline) {
				return 0, nil, err
			}
		}
	}
	// setup is what every test process does first: initialize, and migrate
	// and finalize only when it got the template to itself.
	setup := func() error {
		code, body, err := call("POST", "/api/v1/templates")
		if err != nil {
			return err
		}
		switch code {
		case 423:
			return nil
		case 200:
			var tpl struct {
				Database struct{ Config config } `json:"database"`
			}
			if err := json.Unmarshal(body, &tpl); err != nil {
				return err
			}
			migrations.Add(1)
			if err := execAs(t, tpl.Database.Config, "CREATE TABLE migrated(x int)"); err != nil {
				return err
			}
			if code, _, err := call("PUT", "/api/v1/templates/load"); err != nil || code != 204 {
				return fmt.Errorf("finalize: %d %v", code, err)
			}
			return nil
		}
		return fmt.Errorf("initialize: %d %s", code, body)
	}
	// use gets a database and proves it is fresh and ours with a marker.
	use := func() (testDB2, error) {
		ep := epoch.Load()
		code, body, err := call("GET", "/api/v2/templates/load/tests")
		if err != nil || code != 200 {
			return testDB2{}, fmt.Errorf("get: %d %s %v", code, body, err)
		}
		var d testDB2
		if err := json.Unmarshal(body, &d); err != nil {
			return d, err
		}
		if err := execAs(t, d.Database.Config, "SELECT x FROM migrated; CREATE TABLE _marker()"); err != nil {
			if epoch.Load() != ep {
				return testDB2{}, nil // handed out just before the restart and dropped since
			}
			return d, fmt.Errorf("database %s (id %s): %v", d.Database.Config.Database, d.ID, err)
		}
		return d, nil
	}

	var (
		wg       sync.WaitGroup
		errMu    sync.Mutex
		errList  []error
		heldMu   sync.Mutex
		held     []testDB2
		holding  sync.WaitGroup
		restart  = make(chan struct{})
		phaseOne atomic.Int64
	)
	fail := func(err error) {
		errMu.Lock()
		errList = append(errList, err)
		errMu.Unlock()
	}
	holding.Add(holders)
	for w := 0; w < clients; w++ {
		wg.Add(1)
		go func(w int) {
			defer wg.Done()
			if err := setup(); err != nil {
				fail(err)
				if w < holders {
					holding.Done()
				}
				return
			}
			if w < holders {
				d, err := use()
				holding.Done()
				if err != nil {
					fail(err)
					return
				}
				if err := execAs(t, d.Database.Config, "CREATE TABLE _held()"); err != nil {
					fail(err)
				}
				heldMu.Lock()
				held = append(held, d)
				heldMu.Unlock()
				<-restart
				if code, body, err := call("POST", fmt.Sprintf("/api/v2/templates/load/tests/%s/unlock", d.ID)); err != nil || code != 404 {
					fail(fmt.Errorf("unlock of id %s from before the restart: %d %s %v, want 404", d.ID, code, body, err))
				}
			} else {
				for i := 0; ; i++ {
					select {
					case <-restart:
					default:
						d, err := use()
						if err != nil {
							fail(err)
							return
						}
						phaseOne.Add(1)
						if d.Database.Config.Database != "" {
							action := "unlock"
							if i%3 == 0 {
								action = "recreate"
							} else if err := execAs(t, d.Database.Config, "DROP TABLE _marker"); err != nil && epoch.Load() == 0 {
								fail(fmt.Errorf("database %s (id %s), the old server stopping: %v: %v", d.Database.Config.Database, d.ID, stopping.Load(), err))
								return
							}
							_, _, _ = call("POST", fmt.Sprintf("/api/v2/templates/load/tests/%s/%s", d.ID, action))
						}
						continue
					}
					break
				}
			}
			// A new test process after the restart: its setup must not
			// migrate again, and it gets fresh databases.
			if err := setup(); err != nil {
				fail(err)
				return
			}
			for i := 0; i < after; i++ {
				d, err := use()
				if err != nil {
					fail(err)
					return
				}
				if code, _, err := call("POST", fmt.Sprintf("/api/v2/templates/load/tests/%s/recreate", d.ID)); err != nil || code != 204 {
					fail(fmt.Errorf("recreate after restart: %d %v", code, err))
					return
				}
			}
		}(w)
	}
	holding.Wait()
	waitFor(t, "clients to be busy", 60*time.Second, func() bool { return phaseOne.Load() >= 30 })

	// Restart mid-run, crash-like: nothing dropped by the old manager.
	stopping.Store(true)
	_ = e.mgr.Stop(context.Background())
	e.srv.Close()
	epoch.Add(1)
	e.startServer(t, o)
	setURL()
	close(restart)
	wg.Wait()
	for _, err := range errList {
		t.Error(err)
	}
	if n := migrations.Load(); n != 1 {
		t.Errorf("migrations ran %d times, want once", n)
	}
	if len(held) != holders {
		t.Fatalf("%d holders, want %d", len(held), holders)
	}
	// Names come back (IntegreSQL's small ids), the databases do not: no
	// database of a held name still has the holder's table.
	for _, d := range held {
		if e.dbsLike(t, d.Database.Config.Database) == 0 {
			continue
		}
		c := d.Database.Config
		c.Username, c.Password = e.managed.Conn.Username, e.managed.Conn.Password
		conn, err := pgx.Connect(context.Background(), c.url())
		if err != nil {
			continue // dropped meanwhile
		}
		var survived bool
		_ = conn.QueryRow(context.Background(), "SELECT to_regclass('_held') IS NOT NULL").Scan(&survived)
		conn.Close(context.Background())
		if survived {
			t.Errorf("database %s held across the restart still exists", d.Database.Config.Database)
		}
	}
}

// testDB2 is a hand-out of the native API (an unguessable id).
type testDB2 struct {
	ID       string `json:"id"`
	Database struct {
		Config config `json:"config"`
	} `json:"database"`
}
