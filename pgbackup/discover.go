package pgbackup

import (
	"os"
	"path/filepath"
	"sort"

	"github.com/pgfork/pgfork/internal/errs"
)

// IsBackupDir reports whether dir holds a base backup (a backup_label).
func IsBackupDir(dir string) bool {
	_, err := os.Stat(filepath.Join(dir, "backup_label"))
	return err == nil
}

// List opens every backup directly under dir (subdirectories with a
// backup_label; hidden ones, such as a backup being taken, are skipped),
// oldest first by start LSN.
func List(dir string) ([]*Backup, error) {
	ents, err := os.ReadDir(dir)
	if err != nil {
		if os.IsNotExist(err) {
			return nil, errs.New(errs.NotFound, "no such backup directory").WithPath(dir).WithHint("check the path")
		}
		return nil, errs.FromOS(err, dir, "cannot read the backup directory")
	}
	var out []*Backup
	for _, e := range ents {
		if !e.IsDir() || e.Name()[0] == '.' || !IsBackupDir(filepath.Join(dir, e.Name())) {
			continue
		}
		b, err := OpenBackup(filepath.Join(dir, e.Name()))
		if err != nil {
			return nil, err
		}
		out = append(out, b)
	}
	sort.SliceStable(out, func(i, j int) bool {
		if out[i].Label.StartLSN != out[j].Label.StartLSN {
			return out[i].Label.StartLSN < out[j].Label.StartLSN
		}
		return out[i].Name() < out[j].Name()
	})
	return out, nil
}

// Discover returns the chain in dir that ends with the backup named upto
// (default: the newest), following each incremental back to the backup
// it was taken from, down to a full backup.
func Discover(dir, upto string) ([]string, error) {
	all, err := List(dir)
	if err != nil {
		return nil, err
	}
	if len(all) == 0 {
		return nil, errs.New(errs.NotFound, "no backups in this directory").WithPath(dir).
			WithHint("take a backup into it, or give the backup directories themselves").WithCLI("take one with `pgfork backup %s --url URL`", dir)
	}
	last := all[len(all)-1]
	if upto != "" {
		last = nil
		for _, b := range all {
			if b.Name() == upto {
				last = b
			}
		}
		if last == nil {
			return nil, errs.New(errs.NotFound, "no backup named %q in this directory", upto).WithPath(dir).
				WithHint("see `pgfork backup ls %s`", dir)
		}
	}
	chain := []*Backup{last}
	for cur := last; cur.Label.Incremental(); {
		var prev *Backup
		for _, b := range all {
			if b.Label.StartLSN == cur.Label.PrevLSN && b.Label.StartTLI == cur.Label.PrevTLI && b.SystemID == cur.SystemID {
				prev = b
			}
		}
		if prev == nil {
			return nil, errs.New(errs.NotFound, "the chain of %s is broken: the backup it was taken from (started at %s) is not in this directory", last.Name(), cur.Label.PrevLSN).
				WithPath(cur.Dir).WithHint("restore up to an earlier backup, or give the backup directories yourself").WithCLI("--upto NAME")
		}
		chain = append(chain, prev)
		cur = prev
	}
	dirs := make([]string, len(chain))
	for i, b := range chain {
		dirs[len(chain)-1-i] = b.Dir
	}
	return dirs, nil
}
