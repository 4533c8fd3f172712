package restore

import (
	"context"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	"github.com/pgfork/pgfork/clone"
	"github.com/pgfork/pgfork/internal/errs"
	"github.com/pgfork/pgfork/internal/fsutil"
)

// output is one directory a restore builds, in staging beside its final
// name: the data directory, or a tablespace's new directory.
type output struct {
	prefix string // data-directory-relative prefix of its paths: "" or "pg_tblspc/OID/"
	st     *clone.Staging
	root   *os.Root // the staging directory: every write goes through it
	mode   fs.FileMode
}

// outputs are a restore's outputs; [0] is the data directory.
type outputs []*output

// stage creates the staging directories: the data directory's at dst
// (mode: the newest backup's), each tablespace's beside its new directory
// (0700, as PostgreSQL makes them). An empty tablespace directory given
// as the target is removed first, to be replaced by the finished one.
func stage(dst string, dataMode fs.FileMode, ts []*tablespace) (outputs, error) {
	var outs outputs
	add := func(dir, prefix string, mode fs.FileMode) error {
		st, err := clone.Stage(dir)
		if err != nil {
			return err
		}
		r, err := os.OpenRoot(st.Dir)
		if err != nil {
			st.Abort()
			return errs.FromOS(err, st.Dir, "cannot open the staging directory")
		}
		outs = append(outs, &output{prefix: prefix, st: st, root: r, mode: mode})
		return nil
	}
	if err := add(dst, "", dataMode); err != nil {
		return nil, err
	}
	for _, t := range ts {
		if err := os.Remove(t.new); err != nil && !os.IsNotExist(err) {
			outs.abort()
			return nil, errs.FromOS(err, t.new, "cannot replace the empty tablespace directory")
		}
		if err := add(t.new, t.prefix(), 0o700); err != nil {
			outs.abort()
			return nil, err
		}
	}
	return outs, nil
}

// at returns the output holding the data-directory-relative path rel
// and rel inside it (OS-separated; "." for the output's top).
func (o outputs) at(rel string) (*output, string) {
	for _, out := range o[1:] {
		if strings.HasPrefix(rel+"/", out.prefix) {
			inner := strings.TrimPrefix(rel+"/", out.prefix)
			if inner = strings.TrimSuffix(inner, "/"); inner == "" {
				inner = "."
			}
			return out, filepath.FromSlash(inner)
		}
	}
	return o[0], filepath.FromSlash(rel)
}

// path is rel's path in staging, for messages.
func (o outputs) path(rel string) string {
	out, inner := o.at(rel)
	return filepath.Join(out.st.Dir, inner)
}

// abort removes every staging directory not committed.
func (o outputs) abort() {
	for _, out := range o {
		out.root.Close()
		out.st.Abort()
	}
}

// sync makes every output durable (SyncTree of its files and dirs).
func (o outputs) sync(ctx context.Context, files, dirs []string, mode clone.SyncMode) error {
	byOut := map[*output][2][]string{}
	for _, f := range files {
		out, inner := o.at(f)
		l := byOut[out]
		l[0] = append(l[0], filepath.ToSlash(inner))
		byOut[out] = l
	}
	for _, d := range dirs {
		out, inner := o.at(d)
		if inner == "." {
			continue
		}
		l := byOut[out]
		l[1] = append(l[1], filepath.ToSlash(inner))
		byOut[out] = l
	}
	for _, out := range o {
		if err := clone.SyncTree(ctx, out.root, out.st.Dir, byOut[out][0], byOut[out][1], mode); err != nil {
			return err
		}
	}
	return nil
}

// commit hands every output over (mode, owner, the name checked) and
// renames it into place: the tablespaces first, the data directory last,
// so that a data directory that appears has its tablespaces. If one
// fails, the tablespaces already in place are removed again.
func (o outputs) commit(owner *clone.Owner, durable bool) error {
	order := append(append(outputs{}, o[1:]...), o[0])
	for i, out := range order {
		err := handOver(out.root, out.st.Dir, out.mode, owner)
		if err == nil {
			err = out.st.Commit(durable)
		}
		if err != nil {
			for _, done := range order[:i] {
				_ = fsutil.RemoveAll(done.st.Destination())
			}
			return err
		}
	}
	return nil
}
