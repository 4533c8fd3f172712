package instance_test

import (
	"context"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/pgfork/pgfork/instance"
	"github.com/pgfork/pgfork/internal/errs"
	"github.com/pgfork/pgfork/internal/pgtest"
	"github.com/pgfork/pgfork/internal/testenv"
)

func newCluster(t *testing.T, bin string) (string, *instance.OSUser) {
	t.Helper()
	u, err := instance.ResolveUser("")
	if err != nil {
		t.Fatal(err)
	}
	data := filepath.Join(testenv.Dir(t), "data")
	if err := instance.InitDB(context.Background(), instance.InitOptions{BinDir: bin, DataDir: data, User: u, NoSync: true}); err != nil {
		t.Fatal(err)
	}
	return data, u
}

func TestStartQueryStop(t *testing.T) {
	for _, bin := range testenv.PGBinDirs(t) {
		t.Run(filepath.Base(filepath.Dir(bin)), func(t *testing.T) {
			data, u := newCluster(t, bin)
			ctx := context.Background()
			inst, err := instance.Start(ctx, instance.Config{BinDir: bin, DataDir: data, User: u, Profile: instance.Test})
			if err != nil {
				t.Fatal(err)
			}
			if got := pgtest.Query(t, inst.ConnString("", ""), "show fsync"); got != "off" {
				t.Errorf("test profile: fsync = %q, want off", got)
			}
			if !strings.HasPrefix(inst.ConnString("", "x"), "postgresql://postgres@/x?host=") {
				t.Errorf("socket URL: %s", inst.ConnString("", "x"))
			}
			// A second start on the same data directory is refused.
			if _, err := instance.Start(ctx, instance.Config{BinDir: bin, DataDir: data, User: u}); errs.KindOf(err) != errs.Busy {
				t.Errorf("second start: got %v, want Busy", err)
			}
			att, err := instance.Attach(data)
			if err != nil || att.Pid != inst.Pid {
				t.Fatalf("attach: %v %+v", err, att)
			}
			if err := inst.Stop(ctx, instance.Fast); err != nil {
				t.Fatal(err)
			}
			if _, err := os.Stat(filepath.Join(data, "postmaster.pid")); !os.IsNotExist(err) {
				t.Errorf("postmaster.pid still there after stop: %v", err)
			}
			if _, err := os.Stat(inst.SocketDir); !os.IsNotExist(err) {
				t.Errorf("private socket dir not removed: %v", err)
			}
			if _, err := instance.Attach(data); errs.KindOf(err) != errs.NotFound {
				t.Errorf("attach after stop: %v", err)
			}
		})
	}
}

func TestParallelTCPNoClash(t *testing.T) {
	bin := testenv.PGBinDirs(t)[0]
	const n = 4
	var wg sync.WaitGroup
	insts := make([]*instance.Instance, n)
	errc := make(chan error, n)
	datas := make([]string, n)
	var u *instance.OSUser
	for i := range n {
		datas[i], u = newCluster(t, bin)
	}
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			inst, err := instance.Start(context.Background(), instance.Config{BinDir: bin, DataDir: datas[i], User: u, Profile: instance.Test, TCP: true})
			insts[i] = inst
			errc <- err
		}()
	}
	wg.Wait()
	close(errc)
	for err := range errc {
		if err != nil {
			t.Fatal(err)
		}
	}
	ports := map[int]bool{}
	for _, inst := range insts {
		if ports[inst.Port] {
			t.Errorf("port %d used twice", inst.Port)
		}
		ports[inst.Port] = true
		if got := pgtest.Query(t, inst.ConnString("", ""), "select current_setting('port')"); got == "" {
			t.Error("no port")
		}
		if !strings.Contains(inst.ConnString("", ""), "127.0.0.1:") {
			t.Errorf("TCP URL: %s", inst.ConnString("", ""))
		}
		if err := inst.Stop(context.Background(), instance.Immediate); err != nil {
			t.Error(err)
		}
	}
}

func TestStartFailureShowsLog(t *testing.T) {
	bin := testenv.PGBinDirs(t)[0]
	data, u := newCluster(t, bin)
	_, err := instance.Start(context.Background(), instance.Config{BinDir: bin, DataDir: data, User: u,
		Settings: map[string]string{"shared_buffers": "not-a-size"}})
	if err == nil {
		t.Fatal("start with a bad setting succeeded")
	}
	if !strings.Contains(err.Error(), "shared_buffers") {
		t.Errorf("error does not show the server log: %v", err)
	}
	if _, err := instance.Start(context.Background(), instance.Config{BinDir: bin, DataDir: t.TempDir(), User: u}); errs.KindOf(err) != errs.Usage {
		t.Errorf("start on a non-data dir: %v", err)
	}
}

func TestInitDBRefusesNonEmpty(t *testing.T) {
	bin := testenv.PGBinDirs(t)[0]
	d := testenv.Dir(t)
	if err := os.WriteFile(filepath.Join(d, "x"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	err := instance.InitDB(context.Background(), instance.InitOptions{BinDir: bin, DataDir: d})
	if errs.KindOf(err) != errs.Exists {
		t.Fatalf("got %v, want Exists", err)
	}
	if _, err := os.Stat(filepath.Join(d, "x")); err != nil {
		t.Error("InitDB damaged an existing directory")
	}
}

func TestInitDBChecksumsEveryMajor(t *testing.T) {
	for _, bin := range testenv.PGBinDirs(t) {
		t.Run(filepath.Base(filepath.Dir(bin)), func(t *testing.T) {
			u, _ := instance.ResolveUser("")
			for _, on := range []bool{true, false} {
				data := filepath.Join(testenv.Dir(t), "data")
				if err := instance.InitDB(context.Background(), instance.InitOptions{BinDir: bin, DataDir: data, User: u, NoSync: true, Checksums: &on}); err != nil {
					t.Fatalf("checksums=%v: %v", on, err)
				}
				out, err := u.Command(context.Background(), nil, filepath.Join(bin, "pg_controldata"), data).Output()
				if err != nil {
					t.Fatal(err)
				}
				want := "Data page checksum version:           0"
				if on {
					want = "Data page checksum version:           1"
				}
				if !strings.Contains(string(out), want) {
					t.Errorf("checksums=%v: pg_controldata lacks %q", on, want)
				}
			}
		})
	}
}

// TestServerEnvironmentMinimal: pgfork's environment (which may hold a
// token) does not reach the server, whose environment its OS user and its
// superusers can read.
func TestServerEnvironmentMinimal(t *testing.T) {
	bin := testenv.PGBinDirs(t)[0]
	t.Setenv("PGFORK_TOKEN", "secret-token-4711")
	t.Setenv("PGFORK_TEST_SECRET", "secret-4712")
	data, u := newCluster(t, bin)
	inst, err := instance.Start(context.Background(), instance.Config{BinDir: bin, DataDir: data, User: u, Profile: instance.Test})
	if err != nil {
		t.Fatal(err)
	}
	defer inst.Stop(context.Background(), instance.Fast)
	b, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(inst.Pid), "environ"))
	if err != nil {
		t.Fatal(err)
	}
	env := strings.Split(string(b), "\x00")
	for _, kv := range env {
		if strings.Contains(kv, "secret-") {
			t.Errorf("pgfork's environment reached the server: %q", kv)
		}
	}
	if !strings.Contains(string(b), "PATH=") {
		t.Errorf("server has no PATH: %q", env)
	}
}
