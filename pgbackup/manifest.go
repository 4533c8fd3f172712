package pgbackup

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"time"
	"unicode/utf8"

	"github.com/pgfork/pgfork/internal/errs"
	"github.com/pgfork/pgfork/internal/safefs"
	"github.com/pgfork/pgfork/pgdata"
)

// ManifestFile is one file of a backup_manifest.
type ManifestFile struct {
	Path      string
	Size      int64
	Algorithm string // "CRC32C", "SHA256", ... or "" for none
	Checksum  []byte
}

// WALRange is one WAL range of a backup_manifest.
type WALRange struct {
	Timeline uint32
	Start    pgdata.LSN
	End      pgdata.LSN
}

// Manifest is a parsed backup_manifest.
type Manifest struct {
	Version  int
	SystemID uint64 // 0 in version 1 manifests (before PostgreSQL 17)
	Files    map[string]*ManifestFile
	WAL      []WALRange
	// Checksum is the manifest's own SHA-256 (Manifest-Checksum, hex):
	// another backup, or the same one changed, has another.
	Checksum string
}

type manifestJSON struct {
	Version  int    `json:"PostgreSQL-Backup-Manifest-Version"`
	SystemID uint64 `json:"System-Identifier"`
	Files    []struct {
		Path        string `json:"Path"`
		EncodedPath string `json:"Encoded-Path"`
		Size        int64  `json:"Size"`
		Algorithm   string `json:"Checksum-Algorithm"`
		Checksum    string `json:"Checksum"`
	} `json:"Files"`
	WAL []struct {
		Timeline uint32 `json:"Timeline"`
		Start    string `json:"Start-LSN"`
		End      string `json:"End-LSN"`
	} `json:"WAL-Ranges"`
	Checksum string `json:"Manifest-Checksum"`
}

// MaxManifestSize bounds what ReadManifest reads: a manifest lists every
// file of a backup in about 200 bytes each, so 1 GiB is millions of files.
const MaxManifestSize = 1 << 30

// ReadManifest reads and checks a backup_manifest: its own SHA-256
// checksum must match, as pg_verifybackup requires. It reads only a regular
// file (no link, no FIFO, no device) of at most MaxManifestSize bytes.
func ReadManifest(path string) (*Manifest, error) {
	d, err := safefs.OpenDir(filepath.Dir(path))
	if err != nil {
		return nil, errs.FromOS(err, filepath.Dir(path), "cannot read the backup")
	}
	defer d.Close()
	return readManifest(d, path)
}

// readManifest reads backup_manifest from the backup directory d (path
// names it in messages).
func readManifest(d *safefs.Dir, path string) (*Manifest, error) {
	b, err := d.ReadFile("backup_manifest", MaxManifestSize)
	if err != nil {
		if os.IsNotExist(err) {
			return nil, errs.New(errs.NotFound, "the backup has no backup_manifest").WithPath(path).
				WithHint("pgfork restore needs manifests to check the chain and to verify the result: take the backups with pg_basebackup without --no-manifest")
		}
		return nil, metaErr(err, path, "cannot read the backup manifest")
	}
	damaged := func(format string, a ...any) error {
		return errs.New(errs.Usage, "backup_manifest is damaged: "+format, a...).WithPath(path).
			WithHint("check the backup with pg_verifybackup; take a new backup if it fails")
	}
	var m manifestJSON
	if err := json.Unmarshal(b, &m); err != nil {
		return nil, damaged("%v", err)
	}
	i := bytes.LastIndex(b, []byte(`"Manifest-Checksum"`))
	if i < 0 || m.Checksum == "" {
		return nil, damaged("no Manifest-Checksum")
	}
	sum := sha256.Sum256(b[:i])
	if hex.EncodeToString(sum[:]) != m.Checksum {
		return nil, damaged("its checksum does not match its contents")
	}
	if m.Version < 1 || m.Version > 2 {
		return nil, errs.New(errs.Unsupported, "backup manifest version %d is not supported", m.Version).WithPath(path).
			WithHint("pgfork reads versions 1 and 2 (PostgreSQL 13 to 18)")
	}
	out := &Manifest{Version: m.Version, SystemID: m.SystemID, Checksum: m.Checksum, Files: make(map[string]*ManifestFile, len(m.Files))}
	for _, f := range m.Files {
		p := f.Path
		if f.EncodedPath != "" {
			raw, err := hex.DecodeString(f.EncodedPath)
			if err != nil {
				return nil, damaged("bad Encoded-Path %q", f.EncodedPath)
			}
			p = string(raw)
		}
		mf := &ManifestFile{Path: p, Size: f.Size, Algorithm: f.Algorithm}
		if f.Checksum != "" {
			c, err := hex.DecodeString(f.Checksum)
			if err != nil {
				return nil, damaged("bad checksum of %s", p)
			}
			mf.Checksum = c
		}
		out.Files[p] = mf
	}
	for _, w := range m.WAL {
		s, err1 := pgdata.ParseLSN(w.Start)
		e, err2 := pgdata.ParseLSN(w.End)
		if err1 != nil || err2 != nil {
			return nil, damaged("bad WAL range %s-%s", w.Start, w.End)
		}
		out.WAL = append(out.WAL, WALRange{Timeline: w.Timeline, Start: s, End: e})
	}
	return out, nil
}

// ManifestWriter builds a backup_manifest in the format PostgreSQL writes.
type ManifestWriter struct {
	buf   bytes.Buffer
	first bool
}

// NewManifestWriter starts a manifest of the given version (2 carries the
// system identifier).
func NewManifestWriter(version int, systemID uint64) *ManifestWriter {
	w := &ManifestWriter{first: true}
	if version >= 2 {
		fmt.Fprintf(&w.buf, "{ \"PostgreSQL-Backup-Manifest-Version\": 2,\n\"System-Identifier\": %d,\n\"Files\": [", systemID)
	} else {
		w.buf.WriteString("{ \"PostgreSQL-Backup-Manifest-Version\": 1,\n\"Files\": [")
	}
	return w
}

// Add adds a file. algorithm "" (or a nil checksum) writes no checksum.
func (w *ManifestWriter) Add(path string, size int64, mtime time.Time, algorithm string, checksum []byte) {
	if w.first {
		w.buf.WriteByte('\n')
		w.first = false
	} else {
		w.buf.WriteString(",\n")
	}
	if utf8.ValidString(path) {
		w.buf.WriteString(`{ "Path": `)
		escapeJSON(&w.buf, path)
		w.buf.WriteString(", ")
	} else {
		fmt.Fprintf(&w.buf, `{ "Encoded-Path": "%s", `, hex.EncodeToString([]byte(path)))
	}
	fmt.Fprintf(&w.buf, `"Size": %d, "Last-Modified": "%s"`, size, mtime.UTC().Format("2006-01-02 15:04:05")+" GMT")
	if algorithm != "" && checksum != nil {
		fmt.Fprintf(&w.buf, `, "Checksum-Algorithm": "%s", "Checksum": "%s"`, algorithm, hex.EncodeToString(checksum))
	}
	w.buf.WriteString(" }")
}

// Finish ends the manifest with the WAL ranges and its own checksum and
// returns its bytes.
func (w *ManifestWriter) Finish(wal []WALRange) []byte {
	w.buf.WriteString("\n],\n\"WAL-Ranges\": [\n")
	for i, r := range wal {
		if i > 0 {
			w.buf.WriteString(",\n")
		}
		fmt.Fprintf(&w.buf, `{ "Timeline": %d, "Start-LSN": "%s", "End-LSN": "%s" }`, r.Timeline, r.Start, r.End)
	}
	w.buf.WriteString("\n],\n")
	sum := sha256.Sum256(w.buf.Bytes())
	fmt.Fprintf(&w.buf, "\"Manifest-Checksum\": \"%s\"}\n", hex.EncodeToString(sum[:]))
	return w.buf.Bytes()
}

func escapeJSON(b *bytes.Buffer, s string) {
	b.WriteByte('"')
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch c {
		case '\b':
			b.WriteString(`\b`)
		case '\f':
			b.WriteString(`\f`)
		case '\n':
			b.WriteString(`\n`)
		case '\r':
			b.WriteString(`\r`)
		case '\t':
			b.WriteString(`\t`)
		case '"':
			b.WriteString(`\"`)
		case '\\':
			b.WriteString(`\\`)
		default:
			if c < ' ' {
				fmt.Fprintf(b, `\u%04x`, c)
			} else {
				b.WriteByte(c)
			}
		}
	}
	b.WriteByte('"')
}
