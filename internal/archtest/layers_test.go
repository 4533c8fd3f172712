package archtest

import (
	"os/exec"
	"strings"
	"testing"
)

// layers mirrors the table in docs/ARCHITECTURE.md.
var layers = map[string]int{
	"internal/errs": -1, "internal/units": -1, "internal/statedir": -1, "internal/flock": -1, "internal/testenv": -1, "internal/proc": -1, "internal/fsutil": -1, "internal/pgtest": 2,
	"clone":   0,
	"dbclone": 1, "pgdata": 1, "instance": 1, "pgbin": 1,
	"pool": 2, "pgclone": 2, "template": 2, "cluster": 2, "pgbackup": 2,
	"server": 3, "upgrade": 3, "restore": 3,
	"cmd/pgfork": 4, "bench": 4, "internal/archtest": 4,
}

func TestImportsPointDown(t *testing.T) {
	const mod = "github.com/pgfork/pgfork/"
	out, err := exec.Command("go", "list", "-f", `{{.ImportPath}} {{join .Imports " "}}`, mod+"...").Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
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
			if ld, ok := layers[dep]; ok && ld >= lp && !(lp == 4 && ld == 4) {
				t.Errorf("%s (layer %d) imports %s (layer %d): dependencies must point to lower layers", pkg, lp, dep, ld)
			}
		}
	}
}
