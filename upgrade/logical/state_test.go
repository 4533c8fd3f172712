package logical

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/pgfork/pgfork/internal/errs"
)

// TestCleanKilledActsOnlyOnItsOwnState: the clean-up after a killed run
// stops servers and removes directories its state file names. As root
// beside a NEW_DATADIR whose parent another local user can write, that user
// plants a state file naming a directory of root's (or a symlink to root's
// own file with such content): the run refuses, naming the file, and the
// directory stays. A state file of root's own that names a clone outside
// the pattern a run uses is refused too.
func TestCleanKilledActsOnlyOnItsOwnState(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("the attack is on root's clean-up: run as root (make check does)")
	}
	base := t.TempDir()
	if err := os.Chmod(base, 0o1777); err != nil { // a parent every local user can write
		t.Fatal(err)
	}
	oldDir, newDir := filepath.Join(base, "old"), filepath.Join(base, "new")
	victim := filepath.Join(base, "victim")
	for _, d := range []string{oldDir, victim} {
		if err := os.Mkdir(d, 0o700); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(filepath.Join(victim, "keep"), []byte("root's"), 0o600); err != nil {
		t.Fatal(err)
	}
	b, err := json.Marshal(state{Pid: 1 << 22, OldDir: oldDir, CloneDir: victim, NewMade: false})
	if err != nil {
		t.Fatal(err)
	}
	p := statePath(newDir)
	rootsOwn := filepath.Join(base, "roots-own.json")
	if err := os.WriteFile(rootsOwn, b, 0o600); err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		name  string
		plant func() error
	}{
		{"planted by another user", func() error {
			if err := os.WriteFile(p, b, 0o600); err != nil {
				return err
			}
			return os.Chown(p, 65534, 65534) // nobody
		}},
		{"a symlink to root's own file", func() error { return os.Symlink(rootsOwn, p) }},
		{"root's own, naming a directory that is no clone", func() error { return os.WriteFile(p, b, 0o600) }},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_ = os.Remove(p)
			if err := c.plant(); err != nil {
				t.Fatal(err)
			}
			r := &run{o: Options{OldDir: oldDir, NewDir: newDir}}
			did, err := r.cleanKilled(t.Context())
			if err == nil {
				t.Fatalf("the clean-up acted on %s: %v", p, did)
			}
			// Refused for what the file is, before anything connects or stops.
			if !errs.Is(err, errs.Permission) || !strings.Contains(err.Error(), "state file") {
				t.Errorf("error %v (%v), want a permission refusal naming the state file", err, errs.KindOf(err))
			}
			if _, err := os.Stat(filepath.Join(victim, "keep")); err != nil {
				t.Fatalf("the directory the state file named was touched: %v", err)
			}
		})
	}
	_ = os.Remove(p)
	if !isClonePath(oldDir, filepath.Join(base, ".old.pgfork-logical-123")) || isClonePath(oldDir, filepath.Join(base, ".old.pgfork-logical-")) ||
		isClonePath(oldDir, filepath.Join(base, "sub", ".old.pgfork-logical-1")) {
		t.Error("isClonePath accepts or refuses the wrong paths")
	}
}
