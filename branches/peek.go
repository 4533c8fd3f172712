package branches

import (
	"encoding/json"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	"github.com/pgfork/pgfork/internal/errs"
	"github.com/pgfork/pgfork/internal/statedir"
)

// BranchOf says which branch a name of the cluster registry (pgfork ls,
// pgfork down) is the server of.
func BranchOf(registryName string) (string, bool) { return strings.CutPrefix(registryName, "branch.") }

// Peek reads the complete branches recorded under lay, with their URLs,
// without taking them: pgfork ls shows them while a serve or another
// command holds them. Whether each one's server runs is the registry's to
// say (State is "ready" here). No state yet: none.
func Peek(lay statedir.Layout) ([]Branch, error) {
	p := filepath.Join(Dir(lay), "state.json")
	raw, err := os.ReadFile(p)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, errs.FromOS(err, p, "cannot read the branches state")
	}
	var st state
	if err := json.Unmarshal(raw, &st); err != nil {
		return nil, errs.Wrap(errs.Internal, err, "bad branches state").WithPath(p)
	}
	var out []Branch
	for _, b := range st.Branches {
		if b.State != stateReady {
			continue
		}
		v := *b
		v.Conn = b.URL()
		out = append(out, v)
	}
	return out, nil
}
