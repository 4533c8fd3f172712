package branches

import (
	"context"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/pgfork/pgfork/internal/errs"
	"github.com/pgfork/pgfork/internal/pgtest"
)

// bindable says whether this process can listen on a branch's host:port
// (as another local user could, to pose as the branch).
func bindable(b Branch) bool {
	l, err := net.Listen("tcp", net.JoinHostPort(b.Host, strconv.Itoa(b.Port)))
	if err != nil {
		return false
	}
	l.Close()
	return true
}

// TestStoppedBranchKeepsPort: the port of a branch whose server is not
// running cannot be taken by another process (which could ask the
// branch's clients for their password in clear text): while a create
// copies, after Stop, during a reset's copy, and when serve opens with
// branches left stopped; a client gets an error saying the branch is not
// running. Start runs it on the same port. A port another process took
// anyway makes the start fail naming the port and the process.
func TestStoppedBranchKeepsPort(t *testing.T) {
	ctx := context.Background()
	o := env(t)
	m := open(t, o)
	me := Caller{Token: "me"}
	var during []string
	testHook = func(step string) {
		if step != "copied" {
			return
		}
		m.mu.Lock()
		var b Branch
		for _, x := range m.st.Branches {
			if x.Name == "p" {
				b = *x
			}
		}
		m.mu.Unlock()
		if bindable(b) {
			during = append(during, step)
		}
	}
	t.Cleanup(func() { testHook = nil })
	b, err := m.Create(ctx, me, CreateOptions{Name: "p", Source: "prod"})
	if err != nil {
		t.Fatal(err)
	}
	if len(during) > 0 {
		t.Error("the port of a branch being created was free before its server started")
	}

	if _, err := m.Stop(ctx, me, "p"); err != nil {
		t.Fatal(err)
	}
	if bindable(b) {
		t.Fatalf("port %d of a stopped branch is free for the taking", b.Port)
	}
	if err := tryQuery(b.URL()); err == nil || !strings.Contains(err.Error(), "not running") {
		t.Errorf("a client of the stopped branch got %v, want an error saying it is not running", err)
	}
	if _, err := m.Start(ctx, me, "p"); err != nil {
		t.Fatal(err)
	}
	if got := pgtest.Query(t, b.URL(), "SELECT count(*) FROM seed"); got != "1" {
		t.Errorf("started on its port: %s rows", got)
	}

	during = nil
	if _, err := m.Reset(ctx, me, "p"); err != nil {
		t.Fatal(err)
	}
	if len(during) > 0 {
		t.Error("the port was free during the reset's copy")
	}

	// Left stopped by a restart of serve.
	m.StopAll(ctx)
	m.Close()
	o.LeaveStopped = true
	if m, err = Open(ctx, o); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = m.Delete(ctx, me, "p"); m.Close() })
	if bindable(b) {
		t.Errorf("port %d of a branch left stopped at Open is free for the taking", b.Port)
	}

	// Taken anyway (here by this process, between a release and a start).
	m.releasePort("p")
	l, err := net.Listen("tcp", net.JoinHostPort(b.Host, strconv.Itoa(b.Port)))
	if err != nil {
		t.Fatal(err)
	}
	_, err = m.Start(ctx, me, "p")
	wantKind(t, "a start on a port another process holds", err, errs.Busy)
	if err != nil && (!strings.Contains(err.Error(), strconv.Itoa(b.Port)) || !strings.Contains(err.Error(), "pid "+strconv.Itoa(os.Getpid()))) {
		t.Errorf("the refusal %q does not name the port and the process holding it", err)
	}
	l.Close()
	if _, err := m.Start(ctx, me, "p"); err != nil {
		t.Fatal(err)
	}
	if got := pgtest.Query(t, b.URL(), "SELECT count(*) FROM seed"); got != "1" {
		t.Errorf("started on its port after the other process let it go: %s rows", got)
	}
}

// TestResetMadeWhileRunning: a reset makes the branch's new data
// directory while its server still runs and answers (down only for the
// swap and the start), and the reset's result is the snapshot again.
func TestResetMadeWhileRunning(t *testing.T) {
	ctx := context.Background()
	o := env(t)
	m := open(t, o)
	me := Caller{Token: "me"}
	b, err := m.Create(ctx, me, CreateOptions{Name: "r", Source: "prod"})
	if err != nil {
		t.Fatal(err)
	}
	pgtest.Exec(t, b.URL(), "CREATE TABLE written_in_branch (id int)")
	// A branch whose name is r's plus a suffix keeps its data through r's
	// reset (the reset's new directory is named so that no branch can be).
	other, err := m.Create(ctx, me, CreateOptions{Name: "r.new", Source: "prod"})
	if err != nil {
		t.Fatal(err)
	}
	pgtest.Exec(t, other.URL(), "CREATE TABLE kept_in_other (id int)")
	var answered []string
	testHook = func(step string) {
		if step == "reset-made" {
			if err := tryQuery(b.URL()); err != nil {
				answered = append(answered, err.Error())
			} else {
				answered = append(answered, "")
			}
		}
	}
	t.Cleanup(func() { testHook = nil })
	if _, err := m.Reset(ctx, me, "r"); err != nil {
		t.Fatal(err)
	}
	if len(answered) != 1 || answered[0] != "" {
		t.Errorf("when the reset's new data directory was made the branch answered %q, want one answer and no error: it runs until the swap", answered)
	}
	if got := pgtest.Query(t, b.URL(), "SELECT count(*) FROM pg_class WHERE relname = 'written_in_branch'"); got != "0" {
		t.Errorf("after the reset the table written in the branch is still there (%s)", got)
	}
	if err := tryQuery(other.URL()); err != nil {
		t.Fatalf("branch r.new after r's reset: %v", err)
	}
	if got := pgtest.Query(t, other.URL(), "SELECT count(*) FROM pg_class WHERE relname = 'kept_in_other'"); got != "1" {
		t.Errorf("branch r.new lost its table in r's reset (%s)", got)
	}
}

// TestCreateStartFails: a create whose server does not start (here a
// setting its server refuses, written into the new data directory once it
// is in place) fails naming the branch with the server log's last lines,
// says that the data directory and its log are removed (they are), and
// leaves no branch and no data directory behind.
func TestCreateStartFails(t *testing.T) {
	ctx := context.Background()
	o := env(t)
	m := open(t, o)
	me := Caller{Token: "me"}
	var data string
	testHook = func(step string) {
		if step != "copied" {
			return
		}
		m.mu.Lock()
		for _, x := range m.st.Branches {
			if x.Name == "bad" {
				data = m.dataOf(x)
			}
		}
		m.mu.Unlock()
		f, err := os.OpenFile(filepath.Join(data, "postgresql.conf"), os.O_APPEND|os.O_WRONLY, 0)
		if err != nil {
			t.Error(err)
			return
		}
		_, _ = f.WriteString("\nwork_mem = 'not a size'\n")
		_ = f.Close()
	}
	t.Cleanup(func() { testHook = nil })
	_, err := m.Create(ctx, me, CreateOptions{Name: "bad", Source: "prod"})
	if err == nil {
		t.Fatal("a branch whose server cannot start was created")
	}
	if !strings.Contains(err.Error(), `branch "bad" did not start`) || !strings.Contains(err.Error(), "work_mem") {
		t.Errorf("the error %q does not name the branch and the server log's complaint (work_mem)", err)
	}
	if h := errs.HintOf(err); !strings.Contains(h, "removed") || strings.Contains(h, "kept") {
		t.Errorf("the hint %q does not say that the data directory and its log are removed", h)
	}
	if data == "" {
		t.Fatal("the create never reached its start")
	}
	if _, serr := os.Stat(data); !os.IsNotExist(serr) {
		t.Errorf("the failed create's data directory %s is still there (%v)", data, serr)
	}
	if l := m.List(Caller{Token: "admin"}).Branches; len(l) != 0 {
		t.Errorf("a failed create left branches %v", l)
	}
	// The name is free again, and a create that can start works.
	testHook = nil
	if _, err := m.Create(ctx, me, CreateOptions{Name: "bad", Source: "prod"}); err != nil {
		t.Fatalf("a create under the failed one's name: %v", err)
	}
}
