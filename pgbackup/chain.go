package pgbackup

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/pgfork/pgfork/internal/errs"
	"github.com/pgfork/pgfork/internal/safefs"
	"github.com/pgfork/pgfork/pgdata"
)

// Backup is one plain-format base backup directory.
type Backup struct {
	Dir      string // absolute
	Major    int    // from PG_VERSION
	SystemID uint64 // from global/pg_control
	Label    *pgdata.BackupLabel
	Manifest *Manifest
}

// Name is the backup directory's base name.
func (b *Backup) Name() string { return filepath.Base(b.Dir) }

// Kind is "full" or "incremental".
func (b *Backup) Kind() string {
	if b.Label.Incremental() {
		return "incremental"
	}
	return "full"
}

var tarNames = []string{"base.tar", "base.tar.gz", "base.tar.lz4", "base.tar.zst", "base.tgz"}

// OpenBackup reads a backup directory's PG_VERSION, pg_control,
// backup_label and backup_manifest, refusing what pgfork cannot restore
// (tar format, no manifest, not a backup).
func OpenBackup(dir string) (*Backup, error) {
	abs, err := filepath.Abs(dir)
	if err != nil {
		return nil, errs.Wrap(errs.Usage, err, "bad backup path").WithPath(dir)
	}
	fi, err := os.Stat(abs)
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return nil, errs.New(errs.NotFound, "no such backup directory").WithPath(abs).WithHint("check the path")
		}
		return nil, errs.FromOS(err, abs, "cannot read the backup")
	}
	if !fi.IsDir() {
		if strings.Contains(filepath.Base(abs), ".tar") {
			return nil, tarErr(abs)
		}
		return nil, errs.New(errs.Usage, "not a backup directory").WithPath(abs).
			WithHint("give the directories pg_basebackup -Fp wrote, full backup first")
	}
	for _, t := range tarNames {
		if _, err := os.Stat(filepath.Join(abs, t)); err == nil {
			return nil, tarErr(abs)
		}
	}
	b := &Backup{Dir: abs}
	d, err := safefs.OpenDir(abs)
	if err != nil {
		return nil, errs.FromOS(err, abs, "cannot read the backup")
	}
	defer d.Close()
	raw, err := d.ReadFile("backup_label", maxLabelSize)
	if os.IsNotExist(err) {
		return nil, errs.New(errs.Usage, "not a base backup (no backup_label)").WithPath(abs).
			WithHint("give directories written by pg_basebackup -Fp (plain format), full backup first, then incrementals oldest first")
	}
	if err != nil {
		return nil, metaErr(err, filepath.Join(abs, "backup_label"), "cannot read backup_label")
	}
	if b.Label, err = pgdata.ParseBackupLabel(filepath.Join(abs, "backup_label"), raw); err != nil {
		return nil, err
	}
	vb, err := d.ReadFile("PG_VERSION", maxVersionSize)
	if os.IsNotExist(err) {
		return nil, errs.New(errs.Usage, "not a base backup (no PG_VERSION)").WithPath(abs).
			WithHint("give directories written by pg_basebackup -Fp (plain format)")
	}
	if err != nil {
		return nil, metaErr(err, filepath.Join(abs, "PG_VERSION"), "cannot read PG_VERSION")
	}
	if b.Major, err = strconv.Atoi(strings.TrimSpace(string(vb))); err != nil {
		return nil, errs.New(errs.Unsupported, "PG_VERSION %q is not a supported major version", strings.TrimSpace(string(vb))).WithPath(abs)
	}
	ctl, err := d.ReadFile("global/pg_control", controlFileSize)
	if err != nil {
		return nil, metaErr(err, filepath.Join(abs, "global", "pg_control"), "cannot read the system identifier")
	}
	if b.SystemID, err = systemID(ctl, b.Major); err != nil {
		return nil, errs.Wrap(errs.Usage, err, "cannot read the system identifier").WithPath(filepath.Join(abs, "global", "pg_control")).
			WithHint("the backup is damaged; check it with pg_verifybackup")
	}
	if b.Manifest, err = readManifest(d, filepath.Join(abs, "backup_manifest")); err != nil {
		return nil, err
	}
	if b.Manifest.SystemID != 0 && b.Manifest.SystemID != b.SystemID {
		return nil, errs.New(errs.Usage, "backup_manifest says system identifier %d but pg_control has %d", b.Manifest.SystemID, b.SystemID).
			WithPath(abs).WithHint("the manifest belongs to another backup; take a new backup")
	}
	if len(b.Manifest.WAL) == 0 {
		return nil, errs.New(errs.Usage, "backup_manifest has no WAL ranges").WithPath(abs).
			WithHint("the backup is damaged; check it with pg_verifybackup")
	}
	return b, nil
}

func tarErr(p string) error {
	return errs.New(errs.Unsupported, "tar-format backup: pgfork restore needs plain-format backups").WithPath(p).
		WithHint("take backups with pg_basebackup -Fp (or `pgfork backup`), or extract base.tar into a directory (and pg_wal.tar into its pg_wal/) and give that directory")
}

// Size limits of the metadata files a backup holds, read whole.
const (
	maxLabelSize    = 64 << 10
	maxVersionSize  = 64
	controlFileSize = 8192 // PG_CONTROL_FILE_SIZE
)

// controlCRCOffset is offsetof(ControlFileData, crc) by major: the CRC32C
// of the bytes before it is stored there.
var controlCRCOffset = map[int]int{10: 288, 11: 288, 12: 288, 13: 288, 14: 288, 15: 288, 16: 288, 17: 288, 18: 292}

// systemID returns the system identifier of pg_control's contents (its
// first 8 bytes, little-endian here) after checking the file's CRC, as
// pg_combinebackup does ("pg_control: CRC is incorrect"). For a major whose
// layout pgfork does not know, a CRC found at any 4-byte offset counts.
func systemID(ctl []byte, major int) (uint64, error) {
	if len(ctl) < 16 {
		return 0, fmt.Errorf("pg_control is only %d bytes", len(ctl))
	}
	table := crc32.MakeTable(crc32.Castagnoli)
	ok := func(off int) bool {
		return off+4 <= len(ctl) && crc32.Checksum(ctl[:off], table) == binary.LittleEndian.Uint32(ctl[off:off+4])
	}
	if off, known := controlCRCOffset[major]; known {
		if !ok(off) {
			return 0, fmt.Errorf("pg_control: CRC is incorrect")
		}
	} else {
		found := false
		for off := 16; off+4 <= len(ctl) && off < 1024 && !found; off += 4 {
			found = ok(off)
		}
		if !found {
			return 0, fmt.Errorf("pg_control: CRC is incorrect")
		}
	}
	return binary.LittleEndian.Uint64(ctl[:8]), nil
}

// metaErr classifies an error reading a backup's metadata file: a link or
// special file where pg_basebackup writes a plain file, or one too large to
// be what it claims, is refused naming it; OS errors by their kind.
func metaErr(err error, p, what string) error {
	switch {
	case errors.Is(err, safefs.ErrSymlink), errors.Is(err, safefs.ErrNotRegular), errors.Is(err, safefs.ErrTooLarge):
		return errs.Wrap(errs.Usage, err, "%s: not the plain file pg_basebackup writes", what).WithPath(p).
			WithHint("the backup is damaged or was tampered with; check it with pg_verifybackup, or take a new backup")
	}
	return errs.FromOS(err, p, "%s", what)
}

// Chain is a checked list of backups: one full backup, then incrementals,
// each taken from the one before it.
type Chain []*Backup

// Newest is the last backup of the chain.
func (c Chain) Newest() *Backup { return c[len(c)-1] }

// OpenChain opens the backups and checks that they form a chain, with
// pg_combinebackup's rules and clearer words: the first is full and no
// other is; all have the same system identifier and major version; each
// incremental starts from where the one before it started (INCREMENTAL
// FROM LSN/TLI equal the previous backup's START WAL LOCATION/TIMELINE).
// Nothing is written.
func OpenChain(dirs []string) (Chain, error) {
	if len(dirs) == 0 {
		return nil, errs.New(errs.Usage, "no backups given").WithHint("give the full backup first, then the incrementals oldest first")
	}
	var c Chain
	for _, d := range dirs {
		b, err := OpenBackup(d)
		if err != nil {
			return nil, err
		}
		c = append(c, b)
	}
	orderHint := "give the full backup first, then each incremental after the backup it was taken from"
	for i, b := range c {
		if i == 0 && b.Label.Incremental() {
			return nil, errs.New(errs.Usage, "the first backup is an incremental backup; a chain starts with a full backup").WithPath(b.Dir).
				WithHint("%s%s", orderHint, findBase(c, b))
		}
		if i > 0 && !b.Label.Incremental() {
			return nil, errs.New(errs.Usage, "full backup in the middle of the chain: only the first backup may be full").WithPath(b.Dir).
				WithHint("restore from this full backup onwards, or leave it out; %s", orderHint)
		}
		if b.SystemID != c[0].SystemID {
			return nil, errs.New(errs.Usage, "backup of another cluster: system identifier %d, but %s has %d", b.SystemID, c[0].Name(), c[0].SystemID).
				WithPath(b.Dir).WithHint("every backup of a chain must come from the same cluster; check the directories")
		}
		if b.Major != c[0].Major {
			return nil, errs.New(errs.Usage, "backup of PostgreSQL %d, but %s is of PostgreSQL %d", b.Major, c[0].Name(), c[0].Major).
				WithPath(b.Dir).WithHint("a chain cannot span a major upgrade; restore each side separately")
		}
		if i == 0 {
			continue
		}
		p := c[i-1]
		if b.Label.PrevLSN != p.Label.StartLSN || b.Label.PrevTLI != p.Label.StartTLI {
			return nil, errs.New(errs.Usage, "%s does not continue %s: it was taken from the backup that started at %s (timeline %d), but %s started at %s (timeline %d)",
				b.Name(), p.Name(), b.Label.PrevLSN, b.Label.PrevTLI, p.Name(), p.Label.StartLSN, p.Label.StartTLI).
				WithPath(b.Dir).WithHint("%s%s", orderHint, findBase(c, b))
		}
	}
	return c, nil
}

// findBase names the backup among c that b was taken from, for hints.
func findBase(c Chain, b *Backup) string {
	if !b.Label.Incremental() {
		return ""
	}
	for _, o := range c {
		if o != b && o.Label.StartLSN == b.Label.PrevLSN && o.Label.StartTLI == b.Label.PrevTLI {
			return fmt.Sprintf(" (%s was taken from %s: put %s right before it)", b.Name(), o.Name(), o.Name())
		}
	}
	return fmt.Sprintf(" (%s was taken from a backup that started at %s, which is not among those given: a backup is missing)", b.Name(), b.Label.PrevLSN)
}
