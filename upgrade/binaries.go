package upgrade

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"

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
		return old, new, errs.New(errs.Usage, "the target major version is missing").WithHint("name the major to upgrade to, e.g. 18").WithCLI("pass --to MAJOR, e.g. --to 18")
	}
	oldMajor, err := oldVersion(oldDir)
	if err != nil {
		return old, new, err
	}
	find := func(explicit string, major int) (Install, error) {
		o := opts
		o.Explicit = explicit
		in, err := pgbin.Find(o, major)
		if err != nil {
			if errs.KindOf(err) == errs.NotFound && errs.HintOf(err) == "" {
				return Install{}, errs.Wrap(errs.NotFound, err, "cannot find PostgreSQL %d", major).
					WithHint("install it, or name its bin directory").WithCLI("install it with `pgfork pg install %d`, or name its bin directory", major)
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

// oldVersion returns the old cluster's major version, refusing the ones
// pgfork cannot upgrade with words that fit an upgrade.
func oldVersion(dataDir string) (int, error) {
	v, err := pgdata.Version(dataDir)
	var old *errs.Error
	if errs.Is(err, errs.Unsupported) && errors.As(err, &old) { // a pre-10 cluster
		return 0, errs.New(errs.Unsupported, "%s; pgfork upgrade supports clusters of PostgreSQL 10 and newer", old.Msg).WithPath(dataDir).
			WithHint("run pg_upgrade of the new major directly (it upgrades from 9.2 on), or move the data with pg_dump and pg_restore")
	}
	return v, err
}

// linkDisabled refuses an old cluster that pg_upgrade --link disabled
// (global/pg_control renamed pg_control.old, just before it links the
// files), as a link-mode run killed during its transfer leaves it, with
// how to get it back instead of "not a data directory".
func linkDisabled(dataDir string) error {
	ctl := filepath.Join(dataDir, "global", "pg_control")
	if _, err := os.Lstat(ctl); !errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if _, err := os.Lstat(ctl + ".old"); err != nil {
		return nil
	}
	return errs.New(errs.Busy, "the old cluster was disabled by a link-mode pg_upgrade (global/pg_control is renamed pg_control.old): an earlier link-mode upgrade was interrupted during its transfer").WithPath(dataDir).
		WithHint("if the new cluster never started (pg_upgrade starts it only at the very end, after linking), the old one is intact: rename %s back to pg_control and run again; if it did start, do not use the old cluster: restore it from backup", ctl+".old")
}
