package main

import (
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/pgfork/pgfork/cluster"
	"github.com/pgfork/pgfork/instance"
	"github.com/pgfork/pgfork/internal/statedir"
	"github.com/pgfork/pgfork/internal/testenv"
)

// cloneSource makes a stopped PostgreSQL cluster to clone.
func cloneSource(t *testing.T, pgBin string) string {
	t.Helper()
	u, err := instance.ResolveUser("")
	if err != nil {
		t.Fatal(err)
	}
	src := filepath.Join(testenv.Dir(t), "src")
	if err := instance.InitDB(context.Background(), instance.InitOptions{BinDir: pgBin, DataDir: src, User: u, NoSync: true}); err != nil {
		t.Fatal(err)
	}
	return src
}

type cloneOut struct {
	Dst          string `json:"dst"`
	StartCommand string `json:"start_command"`
	StopCommand  string `json:"stop_command"`
}

func (p *pgfk) clone(args ...string) cloneOut {
	p.t.Helper()
	r := p.run(append([]string{"clone", "--json", "--port", "auto"}, args...)...)
	if r.code != 0 {
		p.t.Fatalf("pgfork clone %v: exit %d\n%s", args, r.code, r.stderr)
	}
	var o cloneOut
	if err := json.Unmarshal([]byte(r.stdout), &o); err != nil {
		p.t.Fatalf("clone --json: %v\n%s", err, r.stdout)
	}
	return o
}

func sh(t *testing.T, command string) {
	t.Helper()
	out, err := exec.Command("/bin/sh", "-c", command).CombinedOutput()
	if err != nil {
		t.Fatalf("the printed command failed: %s: %v\n%s", command, err, out)
	}
}

// TestClonePrintedCommandsWork: the start and stop commands `pgfork clone`
// prints work as printed, also as root with the clone in a root-owned
// directory (the log used to go next to the data directory, where the
// clone's owner cannot write).
func TestClonePrintedCommandsWork(t *testing.T) {
	t.Parallel() // see TestMain
	p := newTestPgfk(t)
	pgBin := p.pgBin
	dst := filepath.Join(testenv.Dir(t), "clone")
	o := p.clone(cloneSource(t, pgBin), dst)
	sh(t, o.StartCommand)
	inst, err := instance.Attach(dst)
	if err != nil {
		t.Fatalf("no server after the printed start command: %v", err)
	}
	inst.Release()
	sh(t, o.StopCommand)
	if _, err := instance.Attach(dst); err == nil {
		t.Errorf("server still running after the printed stop command")
	}
}

// TestCloneStartLeavesNoSocketDir: the private socket directory of a
// branch made by clone --start is removed by the next pgfork once its
// server is stopped outside pgfork (it used to stay in /tmp forever).
func TestCloneStartLeavesNoSocketDir(t *testing.T) {
	p := newTestPgfk(t)
	if r := p.run("clone", cloneSource(t, p.pgBin), filepath.Join(testenv.Dir(t), "sock"), "--start"); r.code != 0 {
		t.Fatalf("clone --start: exit %d\n%s", r.code, r.stderr)
	}
	t.Cleanup(func() { p.run("branch", "rm", "sock") })
	e, err := cluster.Get(statedir.Layout{Root: p.home}, "branch.sock")
	if err != nil || e.SocketDir == "" {
		t.Fatalf("the branch's registry entry: %+v, %v", e, err)
	}
	// In use: the next run keeps it.
	p.run("ls")
	if _, err := os.Stat(e.SocketDir); err != nil {
		t.Fatalf("socket dir of a running branch removed: %v", err)
	}
	att, err := instance.Attach(e.DataDir)
	if err != nil {
		t.Fatal(err)
	}
	if att.User, err = instance.ResolveUser(""); err != nil {
		t.Fatal(err)
	}
	if err := att.Stop(context.Background(), instance.Fast); err != nil {
		t.Fatal(err)
	}
	p.run("ls")
	if _, err := os.Stat(e.SocketDir); !os.IsNotExist(err) {
		t.Errorf("socket dir %s left after the branch stopped and the next run: %v", e.SocketDir, err)
	}
}

// TestTemplateBuildKilledLeavesNoSocketDir: kill -9 of pgfork up while its
// template's setup runs leaves the template server's socket directory; the
// next run removes it (it used to stay in /tmp forever).
func TestTemplateBuildKilledLeavesNoSocketDir(t *testing.T) {
	p := newTestPgfk(t)
	bin, pgBin, home := p.bin, p.pgBin, p.home
	work := testenv.Dir(t)
	shPid, goFile := filepath.Join(work, "pid"), filepath.Join(work, "go")
	setup := "echo $$ > " + shPid + "; while [ ! -f " + goFile + " ]; do sleep 0.1; done"
	cmd := exec.Command(bin, "--state-dir", home, "--pg-bin", pgBin, "-q", "up", "--spares", "0", "--setup-cmd", setup)
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if b, err := os.ReadFile(shPid); err == nil {
			if pid, err := strconv.Atoi(strings.TrimSpace(string(b))); err == nil && pid > 1 {
				_ = syscall.Kill(-pid, syscall.SIGKILL) // the setup command's own process group
			}
		}
	})
	// Wait until the setup command runs, then find the server's socket dir.
	var sock string
	for i := 0; i < 1200 && sock == ""; i++ {
		time.Sleep(50 * time.Millisecond)
		if _, err := os.Stat(shPid); err != nil {
			continue
		}
		m, _ := filepath.Glob(filepath.Join(home, "templates", ".staging-*", "data"))
		for _, d := range m {
			if pf, err := instance.ReadPidFile(d); err == nil && pf.SocketDir != "" {
				sock = pf.SocketDir
			}
		}
	}
	if sock == "" {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		t.Fatal("the template server did not start")
	}
	_ = cmd.Process.Signal(syscall.SIGKILL)
	_ = cmd.Wait()
	if _, err := os.Stat(sock); err != nil {
		t.Fatalf("socket dir %s gone right after the kill: %v", sock, err)
	}
	writeFile(t, goFile, "")
	res := p.up("--spares", "0", "--setup-cmd", setup)
	if !res.Built {
		t.Errorf("the next up did not build the template")
	}
	if _, err := os.Stat(sock); !os.IsNotExist(err) {
		t.Errorf("socket dir %s of the killed build left after the next run: %v", sock, err)
	}
}
