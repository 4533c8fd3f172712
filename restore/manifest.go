package restore

import (
	"os"
	"path/filepath"

	"github.com/pgfork/pgfork/pgbackup"
)

// The label and manifest writer: the result's backup_label and
// backup_manifest, once every file is written.

// writeLabelAndManifest writes backup_label (the newest backup's without
// its INCREMENTAL FROM lines) and backup_manifest (every file written,
// with its size, mtime and checksum; the newest backup's WAL ranges), and
// returns the size of the result's files.
func (w *writer) writeLabelAndManifest() (int64, error) {
	newest := w.in.chain.Newest()
	m := pgbackup.NewManifestWriter(newest.Manifest.Version, newest.SystemID)
	label := newest.Label.CombinedLabel()
	if err := w.writeSmall("backup_label", label); err != nil {
		return 0, err
	}
	fi, err := w.outs[0].root.Stat("backup_label")
	if err != nil {
		return 0, writeErr(err, w.outs.path("backup_label"))
	}
	var sum []byte
	algo := ""
	if h := w.newChecksum(); h != nil {
		h.Write(label)
		sum, algo = h.bytes(), w.opts.checksums()
	}
	m.Add("backup_label", int64(len(label)), fi.ModTime(), algo, sum)
	var total int64
	for i, f := range w.plan.Files {
		out, inner := w.outs.at(f.Rel)
		fi, err := out.root.Lstat(inner)
		if err != nil {
			return 0, writeErr(err, filepath.Join(out.st.Dir, inner))
		}
		total += fi.Size()
		m.Add(f.Rel, fi.Size(), fi.ModTime(), w.out[i].algo, w.out[i].checksum)
	}
	if w.opts.NoManifest {
		return total, nil
	}
	return total, w.writeSmall("backup_manifest", m.Finish(newest.Manifest.WAL))
}

// writeSmall writes a new file rel (in staging) holding b.
func (w *writer) writeSmall(rel string, b []byte) error {
	p := w.outs.path(rel)
	f, err := w.outs[0].root.OpenFile(rel, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return writeErr(err, p)
	}
	defer f.Close()
	if _, err := f.Write(b); err != nil {
		return writeErr(err, p)
	}
	if w.opts.Owner != nil {
		if err := f.Chown(w.opts.Owner.UID, w.opts.Owner.GID); err != nil {
			return writeErr(err, p)
		}
	}
	return f.Close()
}

// syncPaths lists what SyncTree makes durable: every file written, then
// the directories.
func (w *writer) syncPaths() (files, dirs []string) {
	files = []string{"backup_label"}
	if !w.opts.NoManifest {
		files = append(files, "backup_manifest")
	}
	for _, f := range w.plan.Files {
		files = append(files, f.Rel)
	}
	for _, d := range w.plan.Dirs {
		dirs = append(dirs, d.Rel)
	}
	return files, dirs
}
