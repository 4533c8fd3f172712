package archtest

import (
	"os/exec"
	"strings"
	"testing"
)

// layers mirrors the table in docs/ARCHITECTURE.md.
var layers = map[string]int{
	"internal/errs": -1, "volume": 3, "internal/units": -1, "internal/statedir": -1, "internal/flock": -1, "internal/testenv": -1, "internal/proc": -1, "internal/shell": -1, "internal/fsutil": -1, "internal/pgversion": -1, "internal/safefs": -1, "internal/pgtest": 2,
	"clone": 0, "internal/secret": 0, "internal/servelock": 0,
	"dbclone": 1, "pgdata": 1, "instance": 1, "pgbin": 1,
	"pool": 2, "pgclone": 2, "template": 2, "cluster": 2, "pgbackup": 2,
	"pool/dbstore": 3, "pool/clusterstore": 3, "pool/storetest": 3, "server": 3, "server/managed": 3, "upgrade": 3, "up": 3, "restore": 3, "branches": 4, "upgrade/logical": 4,
	"serve":      5,
	"cmd/pgfork": 6, "bench": 6, "internal/archtest": 6,
}

// packageImports lists the module's packages, each line the import path
// and then its imports (go.mod ignores the Go code npm installs under
// clients/js/node_modules).
func packageImports(t *testing.T) []string {
	t.Helper()
	out, err := exec.Command("go", "list", "-f", `{{.ImportPath}} {{join .Imports " "}}`, "github.com/pgfork/pgfork/...").Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	return strings.Split(strings.TrimSpace(string(out)), "\n")
}

func TestImportsPointDown(t *testing.T) {
	const mod = "github.com/pgfork/pgfork/"
	for _, line := range packageImports(t) {
		f := strings.Fields(line)
		pkg := strings.TrimPrefix(f[0], mod)
		lp, ok := layers[pkg]
		if !ok {
			t.Errorf("package %s has no layer: add it to docs/ARCHITECTURE.md and to this test", pkg)
			continue
		}
		for _, imp := range f[1:] {
			if !strings.HasPrefix(imp, mod) {
				continue
			}
			dep := strings.TrimPrefix(imp, mod)
			if ld, ok := layers[dep]; ok && ld >= lp && !(lp == 6 && ld == 6) {
				t.Errorf("%s (layer %d) imports %s (layer %d): dependencies must point to lower layers", pkg, lp, dep, ld)
			}
		}
	}
}

// forbidden lists what a package must not import, directly or not: pool is
// the state machine and its interfaces (the backends hold the SQL), server
// is HTTP only (storage is the backends' and the caller's).
var forbidden = map[string][]string{
	"pool": {"github.com/jackc/pgx/v5", "dbclone", "instance"},
	"server": {"github.com/jackc/pgx/v5", "dbclone", "instance", "clone", "cluster", "template", "pgdata", "pgbin",
		"pool/dbstore", "pool/clusterstore", "server/managed"},
}

func TestConcernsStayHome(t *testing.T) {
	const mod = "github.com/pgfork/pgfork/"
	for pkg, bad := range forbidden {
		out, err := exec.Command("go", "list", "-f", `{{join .Deps "\n"}}`, mod+pkg).Output()
		if err != nil {
			t.Fatalf("go list %s: %v", pkg, err)
		}
		deps := map[string]bool{}
		for _, d := range strings.Fields(string(out)) {
			deps[strings.TrimPrefix(d, mod)] = true
		}
		for _, b := range bad {
			if deps[b] {
				t.Errorf("%s depends on %s; it must not (see docs/ARCHITECTURE.md)", pkg, b)
			}
		}
	}
}
