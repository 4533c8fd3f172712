package upgrade

import (
	"github.com/pgfork/pgfork/internal/errs"
	"github.com/pgfork/pgfork/pgbin"
	"github.com/pgfork/pgfork/pgdata"
)

// FindInstalls finds the PostgreSQL builds an upgrade of oldDir to major
// `to` needs: the old one by the data directory's PG_VERSION, the new one
// by `to`. oldBin and newBin, when set, name bin directories explicitly.
// A missing major is errs.NotFound with the command that installs it.
func FindInstalls(opts pgbin.Options, oldDir string, to int, oldBin, newBin string) (old, new Install, err error) {
	if to <= 0 {
		return old, new, errs.New(errs.Usage, "the target major version is missing").WithHint("pass --to MAJOR, e.g. --to 18")
	}
	oldMajor, err := pgdata.Version(oldDir)
	if err != nil {
		return old, new, err
	}
	find := func(explicit string, major int) (Install, error) {
		o := opts
		o.Explicit = explicit
		in, err := pgbin.Find(o, major)
		if err != nil {
			if errs.KindOf(err) == errs.NotFound {
				return Install{}, errs.Wrap(errs.NotFound, err, "PostgreSQL %d is not installed", major).
					WithHint("install it with `pgfork pg install %d`, or name its bin directory", major)
			}
			return Install{}, err
		}
		return Install{BinDir: in.BinDir, Version: in.Version, Major: in.Major, Env: in.Env()}, nil
	}
	if old, err = find(oldBin, oldMajor); err != nil {
		return old, new, err
	}
	if new, err = find(newBin, to); err != nil {
		return old, new, err
	}
	return old, new, nil
}
