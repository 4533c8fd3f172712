package main

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/pgfork/pgfork/instance"
	"github.com/pgfork/pgfork/pgbin"
)

// goBuild builds the pgfork binary the benchmarks run, as `make build` does:
// statically linked (CGO_ENABLED=0), which saves the dynamic loader's few
// milliseconds on every start — measurable when a copy itself takes 50 ms.
func goBuild(ctx context.Context, out string) ([]byte, error) {
	cmd := exec.CommandContext(ctx, "go", "build", "-o", out, "./cmd/pgfork")
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	return cmd.CombinedOutput()
}

// benchPostgres returns the PostgreSQL build a scenario runs (from the
// environment variable env, default Debian's 15) and the OS user servers run
// as.
func benchPostgres(env string) (pgbin.Installation, *instance.OSUser, error) {
	bin := os.Getenv(env)
	if bin == "" {
		bin = "/usr/lib/postgresql/15/bin"
	}
	pg, err := pgbin.Find(pgbin.Options{Explicit: bin}, 0)
	if err != nil {
		return pgbin.Installation{}, nil, err
	}
	user, err := instance.ResolveUser("")
	return pg, user, err
}

// clientWorkspace makes the temporary directory a client scenario (js, rust,
// django) works in, readable by the postgres user, and builds pgfork into it.
// The caller removes the directory.
func clientWorkspace(prefix string) (dir, bin string, err error) {
	dir, err = os.MkdirTemp("", prefix)
	if err != nil {
		return "", "", err
	}
	_ = os.Chmod(dir, 0o755)
	bin = filepath.Join(dir, "pgfork")
	if out, err := goBuild(context.Background(), bin); err != nil {
		os.RemoveAll(dir)
		return "", "", fmt.Errorf("go build: %v: %s", err, out)
	}
	return dir, bin, nil
}

// runSuite runs a test suite's command and returns its wall time and output;
// it fails when the command does, or when its output lacks ok (the runner's
// success line), and then quotes the output's last 3,000 bytes.
func runSuite(cmd *exec.Cmd, ok string) (time.Duration, string, error) {
	t0 := time.Now()
	b, err := cmd.CombinedOutput()
	took := time.Since(t0)
	out := string(b)
	if err != nil || !strings.Contains(out, ok) {
		tail := out[max(0, len(out)-3000):]
		if err == nil {
			err = fmt.Errorf("no %q in the output", ok)
		}
		return took, out, fmt.Errorf("%s: %v:\n%s", strings.Join(cmd.Args, " "), err, tail)
	}
	return took, out, nil
}

// readTimings reads the file a client suite writes its per-test timings to,
// one line per test: milliseconds to acquire a database and milliseconds of
// that the server took to hand it out. A missing file gives empty samples.
func readTimings(path string) (acquire, handOut Sample) {
	f, err := os.Open(path)
	if err != nil {
		return nil, nil
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fl := strings.Fields(sc.Text())
		if len(fl) != 2 {
			continue
		}
		ms, err1 := strconv.ParseFloat(fl[0], 64)
		ho, err2 := strconv.ParseFloat(fl[1], 64)
		if err1 == nil && err2 == nil {
			acquire = append(acquire, time.Duration(ms*float64(time.Millisecond)))
			handOut = append(handOut, time.Duration(ho*float64(time.Millisecond)))
		}
	}
	return acquire, handOut
}
