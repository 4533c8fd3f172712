package main

import (
	"context"
	"os"
	"os/exec"

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
