package branches

import (
	"context"
	"encoding/binary"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/pgfork/pgfork/cluster"
	"github.com/pgfork/pgfork/internal/errs"
)

// A branch's port is its own while its server is not running: otherwise
// any local user could listen on it and ask the branch's clients for
// their password in clear text (issue 32, F19). So the Manager holds a
// listener on the branch's host:port from the moment the port is chosen
// until the server starts, and again from the moment the server stops (a
// Stop, a reset's copy, a branch left stopped when serve opens) until it
// starts again; a start releases it just before the server binds it. A
// client that comes meanwhile gets a PostgreSQL error saying the branch is
// stopped. The ports are not held while serve itself is not running.

// portRetry is how long a start retries while its port is taken by
// another process (one that raced the release).
const portRetry = 3 * time.Second

// holdPort binds host:port for branch name until releasePort (one held
// already for name is kept).
func (m *Manager) holdPort(name, host string, port int) error {
	m.portMu.Lock()
	defer m.portMu.Unlock()
	if l := m.held[name]; l != nil {
		if l.Addr().(*net.TCPAddr).Port == port {
			return nil
		}
		l.Close()
		delete(m.held, name)
	}
	l, err := net.Listen("tcp", net.JoinHostPort(host, strconv.Itoa(port)))
	if err != nil {
		return err
	}
	m.keep(name, l)
	return nil
}

// keep records l as the listener of branch name (portMu held) and answers
// its clients.
func (m *Manager) keep(name string, l net.Listener) {
	if m.held == nil {
		m.held = map[string]net.Listener{}
	}
	m.held[name] = l
	go refuse(l, name)
}

// choosePort picks a free port for a new branch, not one of used, and
// holds it for the branch name at once.
func (m *Manager) choosePort(name, host string, used map[int]bool) (int, error) {
	var extra []net.Listener
	defer func() {
		for _, l := range extra {
			l.Close()
		}
	}()
	for range 20 {
		l, err := net.Listen("tcp", net.JoinHostPort(host, "0"))
		if err != nil {
			return 0, errs.Wrap(errs.Internal, err, "cannot find a free TCP port on %s", host).WithHint("check the address branches listen on").WithCLI("check --branch-host")
		}
		port := l.Addr().(*net.TCPAddr).Port
		if used[port] {
			extra = append(extra, l) // kept open meanwhile: not picked again
			continue
		}
		m.portMu.Lock()
		if old := m.held[name]; old != nil {
			old.Close()
		}
		m.keep(name, l)
		m.portMu.Unlock()
		return port, nil
	}
	return 0, errs.New(errs.Busy, "no free port for branch %q", name).WithHint("try again")
}

// askedPort is the port of a new branch (reserve): o.Port when one is
// asked for (an admin's call; free and not another branch's), else a free
// one (choosePort); either is held for the branch from now on.
func (m *Manager) askedPort(c Caller, o CreateOptions, used map[int]bool) (int, error) {
	if o.Port == 0 {
		return m.choosePort(o.Name, m.o.Host, used)
	}
	if !m.admin(c) {
		return 0, errs.New(errs.Permission, "only an admin chooses a branch's port").WithHint("leave the port out: the branch gets a free one")
	}
	if o.Port < 1 || o.Port > 65535 {
		return 0, errs.New(errs.Usage, "bad port %d", o.Port).WithHint("give a port between 1 and 65535")
	}
	if used[o.Port] {
		return 0, errs.New(errs.Exists, "port %d is another branch's", o.Port).WithHint("choose another port, or leave it out for a free one")
	}
	if err := m.holdPort(o.Name, m.o.Host, o.Port); err != nil {
		return 0, errs.Wrap(errs.Busy, err, "port %d on %s is taken", o.Port, m.o.Host).WithHint("choose another port, or leave it out for a free one")
	}
	return o.Port, nil
}

// releasePort closes the listener held for branch name, if any.
func (m *Manager) releasePort(name string) {
	m.portMu.Lock()
	defer m.portMu.Unlock()
	if l := m.held[name]; l != nil {
		l.Close()
		delete(m.held, name)
	}
}

// releaseAll closes every listener held (Close).
func (m *Manager) releaseAll() {
	m.portMu.Lock()
	defer m.portMu.Unlock()
	for name, l := range m.held {
		l.Close()
		delete(m.held, name)
	}
}

// keepStoppedPort holds the port of branch b after its server stopped; it
// fails, naming who took it, when another process got there first.
func (m *Manager) keepStoppedPort(b *Branch) error {
	if err := m.holdPort(b.Name, b.Host, b.Port); err != nil {
		return portTaken(b, err)
	}
	return nil
}

// startOnPort starts a branch's server (cluster.StartBranch with o) on the
// port the Manager holds for it: released just before, retried for a few
// seconds while another process has it, held again if the start fails.
func (m *Manager) startOnPort(ctx context.Context, b *Branch, o cluster.BranchOptions) (*cluster.Branch, error) {
	deadline := time.Now().Add(portRetry)
	for {
		m.releasePort(b.Name)
		st, err := cluster.StartBranch(ctx, m.o.Layout, o)
		if err == nil {
			return st, nil
		}
		herr := m.holdPort(b.Name, b.Host, b.Port)
		if herr == nil {
			return nil, err // the port was free: the start failed for another reason
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return nil, portTaken(b, herr)
		}
		select {
		case <-ctx.Done():
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// portTaken is the error for a branch whose port another process holds.
func portTaken(b *Branch, err error) error {
	who := "another process"
	if h := portHolder(b.Port); h != "" {
		who = h
	}
	return errs.Wrap(errs.Busy, err, "port %d of branch %q is taken by %s", b.Port, b.Name, who).
		WithHint("stop that process (it may be posing as the branch to get its password), then start the branch")
}

// refuse answers every client of a held port with a PostgreSQL error
// (the branch is not running), until l is closed.
func refuse(l net.Listener, name string) {
	msg := errorResponse("57P03", fmt.Sprintf("branch %q is not running", name), "start it (pgfork branch start)")
	for {
		c, err := l.Accept()
		if err != nil {
			return
		}
		go func() {
			defer c.Close()
			_ = c.SetDeadline(time.Now().Add(time.Second))
			var buf [512]byte
			_, _ = c.Read(buf[:]) // the startup or SSL request: read so that the close is no reset
			_, _ = c.Write(msg)
		}()
	}
}

// errorResponse is a PostgreSQL ErrorResponse message (FATAL).
func errorResponse(code, message, hint string) []byte {
	var body []byte
	for _, f := range []struct {
		t byte
		v string
	}{{'S', "FATAL"}, {'V', "FATAL"}, {'C', code}, {'M', message}, {'H', hint}} {
		body = append(append(append(body, f.t), f.v...), 0)
	}
	body = append(body, 0)
	out := []byte{'E', 0, 0, 0, 0}
	binary.BigEndian.PutUint32(out[1:], uint32(len(body)+4))
	return append(out, body...)
}

// portHolder names the process listening on TCP port port ("pid N
// (command)"), read from /proc as root can; "" when not known.
func portHolder(port int) string {
	inodes := map[string]bool{}
	for _, f := range []string{"/proc/net/tcp", "/proc/net/tcp6"} {
		b, err := os.ReadFile(f)
		if err != nil {
			continue
		}
		for _, line := range strings.Split(string(b), "\n")[1:] {
			fs := strings.Fields(line)
			if len(fs) < 10 || fs[3] != "0A" { // 0A: LISTEN
				continue
			}
			i := strings.LastIndexByte(fs[1], ':')
			if p, err := strconv.ParseInt(fs[1][i+1:], 16, 32); err == nil && int(p) == port {
				inodes["socket:["+fs[9]+"]"] = true
			}
		}
	}
	if len(inodes) == 0 {
		return ""
	}
	procs, _ := os.ReadDir("/proc")
	for _, p := range procs {
		pid, err := strconv.Atoi(p.Name())
		if err != nil {
			continue
		}
		fds, _ := os.ReadDir(filepath.Join("/proc", p.Name(), "fd"))
		for _, fd := range fds {
			if t, err := os.Readlink(filepath.Join("/proc", p.Name(), "fd", fd.Name())); err == nil && inodes[t] {
				comm, _ := os.ReadFile(filepath.Join("/proc", p.Name(), "comm"))
				return fmt.Sprintf("pid %d (%s)", pid, strings.TrimSpace(string(comm)))
			}
		}
	}
	return ""
}
