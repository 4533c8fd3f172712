package main

import (
	"encoding/json"
	"io"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// TestServeBranchesNeedToken (issue 57, G1, rule 1): `pgfork serve
// --branch-token … --branch-source …` without --token started, answered
// 401 on the branch routes, and handed out a superuser of its managed
// cluster to any anonymous client of the pool routes — the same OS user
// as the branches and the source, so that client wrote into the source
// and read other tokens' branches (COPY … FROM PROGRAM psql). Serve now
// refuses to start with branch sources and no admin token, on loopback,
// with --allow-from and with --insecure-open alike (exit 2 naming
// --token, before any PostgreSQL starts); with one, the pool routes take
// the admin token only (a branch token gets 401).
func TestServeBranchesNeedToken(t *testing.T) {
	t.Parallel() // see TestMain
	bin, pgBin, dir, src := branchSource(t)
	const alice, admin = "alice-0123456789abcdef", "admin-0123456789abcdefgh"
	branchArgs := []string{"--branch-source", "prod=cluster:" + src, "--branch-min-free", "1MiB"}
	// Tokens come from the environment (rule 2: never on a command line);
	// PGFORK_TOKEN is empty in each of these.
	for i, c := range []struct{ env, args []string }{
		{[]string{"PGFORK_BRANCH_TOKENS=" + alice}, nil},
		{[]string{"PGFORK_BRANCH_TOKENS=" + alice}, []string{"--allow-from", "10.0.0.0/8"}},
		{[]string{"PGFORK_BRANCH_TOKENS=" + alice}, []string{"--listen", "0.0.0.0:0", "--insecure-open"}},
		{[]string{"PGFORK_BRANCH_ADMIN_TOKENS=" + alice}, nil},
		{nil, nil}, // no token at all
	} {
		home := filepath.Join(dir, "home"+strconv.Itoa(i))
		env := append([]string{"PGFORK_TOKEN="}, c.env...)
		base, code, stderr := serveOrExit(t, bin, home, pgBin, env, append(append([]string(nil), branchArgs...), c.args...)...)
		if base != "" {
			// Today's hole: an anonymous client of the pool routes gets a
			// superuser of the cluster that runs as the branches' OS user.
			t.Errorf("serve %v %v without an admin token started; %s", c.env, c.args, anonymousPoolDatabase(t, base, pgBin))
			continue
		}
		if code != 2 || !strings.Contains(stderr, "--token") || !strings.Contains(stderr, "PGFORK_TOKEN") {
			t.Errorf("serve %v %v without an admin token: exit %d, want 2 naming --token and PGFORK_TOKEN:\n%s", c.env, c.args, code, stderr)
		}
		if hasManaged(home) {
			t.Errorf("serve %v %v without an admin token: a cluster was created before the refusal", c.env, c.args)
		}
	}

	s := startServe(t, bin, filepath.Join(dir, "served"), pgBin, []string{"PGFORK_TOKEN=" + admin, "PGFORK_BRANCH_TOKENS=" + alice}, branchArgs...)
	for _, tok := range []string{"", alice} {
		if code, _, body := branchAPI(t, s.base, "POST", "/api/v1/templates", tok, `{"hash":"g1"}`); code != 401 {
			t.Errorf("POST /api/v1/templates with bearer %q: %d %s, want 401", tok, code, body)
		}
		if code, _, body := branchAPI(t, s.base, "GET", "/api/v2/templates", tok, ""); code != 401 {
			t.Errorf("GET /api/v2/templates with bearer %q: %d %s, want 401", tok, code, body)
		}
	}
	if code, _, body := branchAPI(t, s.base, "POST", "/api/v1/templates", admin, `{"hash":"g1"}`); code != 200 {
		t.Errorf("POST /api/v1/templates with the admin token: %d %s, want 200", code, body)
	}
}

// serveOrExit runs `pgfork serve --json` as startServe does and returns
// its base URL once it listens, or, when it exits first, its exit code
// and stderr.
func serveOrExit(t *testing.T, bin, home, pgBin string, env []string, args ...string) (base string, code int, stderr string) {
	t.Helper()
	cmd := exec.Command(bin, append([]string{"--state-dir", home, "--pg-bin", pgBin, "--json", "serve",
		"--listen", "127.0.0.1:0", "--pool-init", "1", "--pool-max", "4"}, args...)...)
	cmd.Env = append(os.Environ(), env...)
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	errb := &lockedBuffer{}
	cmd.Stderr = errb
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	outc := make(chan string, 1)
	go func() {
		var out struct {
			Listen string `json:"listen"`
		}
		_ = json.NewDecoder(stdout).Decode(&out)
		outc <- out.Listen
		_, _ = io.Copy(io.Discard, stdout)
	}()
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); close(done) }()
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-done:
		case <-time.After(time.Minute):
			_ = cmd.Process.Kill()
		}
	})
	select {
	case l := <-outc:
		if l != "" {
			return "http://" + l, 0, ""
		}
		<-done // stdout closed: the process is ending
	case <-time.After(3 * time.Minute):
		t.Fatalf("pgfork serve %v neither listened nor exited within 3 minutes:\n%s", args, errb)
	}
	return "", cmd.ProcessState.ExitCode(), errb.String()
}

// anonymousPoolDatabase asks the serve at base for a test database with no
// token and says what the OS user nobody can do with it.
func anonymousPoolDatabase(t *testing.T, base, pgBin string) string {
	t.Helper()
	code, _, body := branchAPI(t, base, "POST", "/api/v1/templates", "", `{"hash":"g1-anonymous"}`)
	if code != 200 {
		return "an anonymous POST /api/v1/templates got " + body
	}
	var r struct {
		Database struct {
			Config struct {
				Host, Username, Password, Database string
				Port                               int
			}
		}
	}
	if err := json.Unmarshal([]byte(body), &r); err != nil {
		return "an anonymous POST /api/v1/templates got 200 " + body
	}
	c := r.Database.Config
	u := url.URL{Scheme: "postgres", User: url.UserPassword(c.Username, c.Password), Host: c.Host + ":" + strconv.Itoa(c.Port), Path: "/" + c.Database}
	psql := exec.Command(filepath.Join(pgBin, "psql"), "-X", "-w", "-At", "-d", u.String(), "-c",
		"SELECT rolsuper FROM pg_roles WHERE rolname = current_user")
	psql.Env, psql.Dir = []string{"PATH=/usr/bin:/bin", "HOME=/", "PGCONNECT_TIMEOUT=10"}, "/"
	if os.Geteuid() == 0 {
		psql.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 65534, Gid: 65534}}
	}
	out, err := psql.CombinedOutput()
	return "an anonymous client got a test database of role " + c.Username + "; as the OS user nobody, rolsuper = " +
		strings.TrimSpace(string(out)) + " (" + errString(err) + ")"
}

func errString(err error) string {
	if err == nil {
		return "no error"
	}
	return err.Error()
}
