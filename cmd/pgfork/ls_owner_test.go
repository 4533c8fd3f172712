package main

import (
	"bufio"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/pgfork/pgfork/internal/statedir"
	"github.com/pgfork/pgfork/serve"
)

// fakeServeEnv, set in a process started from the test binary, makes it
// the fake serve of TestLsTrustsOnlyAProvenServe (fakeServe) instead of
// running the tests: its value is the state directory, "STATE:nobody" to
// go on as the user nobody once it holds the state directory.
const fakeServeEnv = "PGFORK_TEST_FAKE_SERVE"

// fakeServe takes the state directory as pgfork serve does (serve.LockState
// records this process and its address), then, with ":nobody", becomes the
// user nobody (uid 65534) with the same pid, start time and lock: what a
// local user's process that came to hold a recorded pid and address looks
// like. It prints "ready ADDR", then "auth HEADER" for every request, and
// answers GET /api/v2/templates with one pool, "fake".
func fakeServe(arg string) int {
	state, who, _ := strings.Cut(arg, ":")
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		fmt.Println("error", err)
		return 1
	}
	if _, err := serve.LockState(statedir.Layout{Root: state}, ln.Addr().String()); err != nil {
		fmt.Println("error", err)
		return 1
	}
	if who == "nobody" {
		if err := syscall.Setgroups(nil); err != nil {
			fmt.Println("error", err)
			return 1
		}
		if err := syscall.Setgid(65534); err != nil {
			fmt.Println("error", err)
			return 1
		}
		if err := syscall.Setuid(65534); err != nil {
			fmt.Println("error", err)
			return 1
		}
	}
	fmt.Println("ready", ln.Addr())
	_ = http.Serve(ln, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Printf("auth %q\n", r.Header.Get("Authorization"))
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprint(w, `{"templates":[{"templateHash":"fake","state":"ready","databases":{"ready":1},"kept":0,"max":4}]}`)
	}))
	return 1
}

// TestLsTrustsOnlyAProvenServe (issue 57, G2; rule 3): pgfork ls asks the
// serve recorded in <state>/locks/serve.owner for its pools, with
// PGFORK_TOKEN, only while that record is proven: the state directory's
// lock held, the pid running as our user with its recorded start time.
// Before, a live pid was enough, and the record outlives its serve: another
// user's process holding the recorded pid and address got root's token.
// Here the process that recorded itself becomes nobody (same pid, start
// time and lock, another user): ls must send it nothing. A serve of ours
// is still asked (its pool listed, the token sent).
func TestLsTrustsOnlyAProvenServe(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: the fake serve becomes another user")
	}
	const token = "root-admin-token-0123456789"
	for _, tc := range []struct {
		name, who string
		trusted   bool
	}{{"a serve of ours", "root", true}, {"the recorded pid now another user's", "nobody", false}} {
		t.Run(tc.name, func(t *testing.T) {
			home := filepath.Join(t.TempDir(), "state")
			exe, err := os.Executable()
			if err != nil {
				t.Fatal(err)
			}
			cmd := exec.Command(exe)
			cmd.Env = append(os.Environ(), fakeServeEnv+"="+home+":"+tc.who)
			out, err := cmd.StdoutPipe()
			if err != nil {
				t.Fatal(err)
			}
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			r := bufio.NewScanner(out)
			if !r.Scan() || !strings.HasPrefix(r.Text(), "ready ") {
				_ = cmd.Process.Kill()
				_ = cmd.Wait()
				t.Fatalf("the fake serve did not start: %q", r.Text())
			}
			res := runInProcessEnv(t, []string{"PGFORK_HOME=" + home, "PGFORK_TOKEN=" + token}, "ls")
			_ = cmd.Process.Kill()
			var seen []string
			for r.Scan() {
				seen = append(seen, r.Text())
			}
			_ = cmd.Wait()
			listed := strings.Contains(res.stdout, "pool.fake")
			t.Logf("ls: exit %d\n%s%s\nthe fake serve got: %q", res.code, res.stdout, res.stderr, seen)
			if tc.trusted {
				if !listed || len(seen) == 0 || !strings.Contains(seen[0], token) {
					t.Errorf("ls did not ask the serve of ours, with the token (listed %v, requests %q)", listed, seen)
				}
				return
			}
			if listed || len(seen) > 0 {
				t.Errorf("ls asked a process of another user that holds the recorded pid (listed %v, requests %q)", listed, seen)
			}
		})
	}
}
