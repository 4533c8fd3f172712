package main

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"
)

// integresqlVersion is the IntegreSQL release the serve scenario compares
// pgfork serve with (the one /api/v1 follows).
const integresqlVersion = "v1.1.0"

// buildIntegreSQL builds IntegreSQL's server at integresqlVersion from the
// Go module proxy, in a throwaway module that requires exactly that
// version, and returns the binary's path. (`go install …@v1.1.0` does not
// work: the proxy answers 403 to the module's version list, which install
// reads for deprecation notices; the version itself is served.)
func buildIntegreSQL(ctx context.Context, dir string) (string, error) {
	mod := filepath.Join(dir, "integresql-build")
	if err := os.MkdirAll(mod, 0o755); err != nil {
		return "", err
	}
	gomod := "module integresqlbench\n\ngo 1.22\n\nrequire github.com/allaboutapps/integresql " + integresqlVersion + "\n"
	tools := "//go:build tools\n\npackage tools\n\nimport _ \"github.com/allaboutapps/integresql/cmd/server\"\n"
	if err := os.WriteFile(filepath.Join(mod, "go.mod"), []byte(gomod), 0o644); err != nil {
		return "", err
	}
	if err := os.WriteFile(filepath.Join(mod, "tools.go"), []byte(tools), 0o644); err != nil {
		return "", err
	}
	bin := filepath.Join(dir, "integresql")
	cmd := exec.CommandContext(ctx, "go", "build", "-o", bin, "github.com/allaboutapps/integresql/cmd/server")
	cmd.Dir = mod
	cmd.Env = append(os.Environ(), "GOFLAGS=-mod=mod", "CGO_ENABLED=0")
	if out, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("building IntegreSQL %s: %v: %s", integresqlVersion, err, strings.TrimSpace(string(out)))
	}
	return bin, nil
}

// poolSizes are the pool settings both servers get.
type poolSizes struct{ init, max, parallel int }

// pgServer is the PostgreSQL server both contenders use.
type pgServer struct {
	host     string
	port     int
	user     string
	password string
	url      string // superuser URL to database postgres
	version  string // its PostgreSQL version (benchPG18's; empty for others)
}

// db is database name on the server, as its superuser.
func (p pgServer) db(name string) benchDB {
	var d benchDB
	c := &d.Database.Config
	c.Host, c.Port, c.Username, c.Password, c.Database = p.host, p.port, p.user, p.password, name
	return d
}

// startIntegreSQL runs IntegreSQL on 127.0.0.1:port against pg with the
// given pool sizes, configured by its environment variables only (a
// minimal environment, nothing inherited). Its per-request logger is off,
// as pgfork serve logs no requests without -v.
func startIntegreSQL(bin, logDir string, port int, pg pgServer, ps poolSizes) (*serveProc, error) {
	cmd := exec.Command(bin)
	cmd.Env = []string{
		"PATH=/usr/bin:/bin",
		"INTEGRESQL_ADDRESS=127.0.0.1",
		"INTEGRESQL_PORT=" + strconv.Itoa(port),
		"INTEGRESQL_PGHOST=" + pg.host,
		"INTEGRESQL_PGPORT=" + strconv.Itoa(pg.port),
		"INTEGRESQL_PGUSER=" + pg.user,
		"INTEGRESQL_PGPASSWORD=" + pg.password,
		"INTEGRESQL_TEST_INITIAL_POOL_SIZE=" + strconv.Itoa(ps.init),
		"INTEGRESQL_TEST_MAX_POOL_SIZE=" + strconv.Itoa(ps.max),
		"INTEGRESQL_POOL_MAX_PARALLEL_TASKS=" + strconv.Itoa(ps.parallel),
		"INTEGRESQL_ECHO_ENABLE_LOGGER_MIDDLEWARE=false",
	}
	logf, err := os.Create(filepath.Join(logDir, fmt.Sprintf("integresql-%d.log", port)))
	if err != nil {
		return nil, err
	}
	defer logf.Close()
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	p := &serveProc{cmd: cmd, base: fmt.Sprintf("http://127.0.0.1:%d", port), pid: cmd.Process.Pid, name: "IntegreSQL " + integresqlVersion, prefix: "integresql", log: logf.Name()}
	// IntegreSQL has no health endpoint: any HTTP answer means it is up.
	deadline := time.Now().Add(time.Minute)
	for time.Now().Before(deadline) {
		if res, err := http.Get(p.base + "/api/v1/templates/none/tests"); err == nil {
			res.Body.Close()
			return p, nil
		}
		time.Sleep(50 * time.Millisecond)
	}
	_ = p.stop()
	b, _ := os.ReadFile(logf.Name())
	return nil, fmt.Errorf("IntegreSQL did not come up: %s", b)
}
