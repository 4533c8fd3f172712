// Package volume makes, records, reuses and removes the reflink volume pgfork
// puts its state on where the state directory's filesystem cannot clone: a
// sparse image file beside the state directory, formatted XFS with reflink
// (btrfs where mkfs.xfs is missing), attached to a loop device and mounted.
//
// Layout, in a base state directory B (statedir.Base):
//
//	B/volume.img    the image (0600, sparse)
//	B/volume/       the mount point (empty when not mounted)
//	B/volume/state  pgfork's state directory while mounted (statedir.Resolve)
//	B/volume.json   the record: image, its inode, mount point, filesystem, loop device
//
// The package touches only what it made: a loop device is used, detached or
// resized only when it is backed by the recorded image (device and inode
// checked), and the mount point is mounted over only when empty. As root,
// every path is opened relative to B, which must be reachable through
// directories only root can change.
package volume

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/pgfork/pgfork/internal/errs"
	"github.com/pgfork/pgfork/internal/fsutil"
	"github.com/pgfork/pgfork/internal/statedir"
)

// ErrCanClone is wrapped by Create's refusal where the base directory's
// filesystem clones already.
var ErrCanClone = errors.New("the state directory's filesystem can clone")

// Names inside the base state directory.
const (
	ImageName = "volume.img"
)

// MinSize is the smallest image: mkfs.xfs refuses filesystems under 300 MiB.
const MinSize int64 = 320 << 20

// DefaultMaxSize caps the default size; the default is also at most half the
// free space of the base directory's filesystem.
const DefaultMaxSize int64 = 32 << 30

// Record is what B/volume.json holds.
type Record struct {
	Base     string    `json:"base"`
	Image    string    `json:"image"`
	Mount    string    `json:"mount"`
	State    string    `json:"state"`
	FS       string    `json:"fs"`
	Size     int64     `json:"size_bytes"`
	ImageDev uint64    `json:"image_dev"`
	ImageIno uint64    `json:"image_ino"`
	Loop     string    `json:"loop,omitempty"`
	Created  time.Time `json:"created"`
}

// Status is a record with what is true now.
type Status struct {
	Record
	Attached bool  `json:"attached"`
	Used     int64 `json:"used_bytes"`
	Free     int64 `json:"free_bytes"`
}

// Options for Create.
type Options struct {
	Size int64 // 0: DefaultSize
	// FS forces "xfs" or "btrfs"; empty: xfs when mkfs.xfs is found, else btrfs.
	FS string
	// Progress, when set, is told what is carried over onto the volume.
	Progress func(msg string)
}

func (o Options) say(format string, args ...any) {
	if o.Progress != nil {
		o.Progress(fmt.Sprintf(format, args...))
	}
}

func recordPath(base string) string { return filepath.Join(base, statedir.VolumeRecord) }

// Load reads base's record; a missing record is a NotFound error.
func Load(base string) (*Record, error) {
	b, err := os.ReadFile(recordPath(base))
	if err != nil {
		if os.IsNotExist(err) {
			return nil, errs.New(errs.NotFound, "no volume recorded for %s", base).WithPath(base).
				WithCLI("create one, as root: pgfork volume create")
		}
		return nil, errs.FromOS(err, recordPath(base), "cannot read the volume record")
	}
	var r Record
	if err := json.Unmarshal(b, &r); err != nil {
		return nil, errs.Wrap(errs.Internal, err, "corrupt volume record").WithPath(recordPath(base))
	}
	if r.Image != filepath.Join(base, ImageName) || r.Mount != filepath.Join(base, statedir.VolumeMount) {
		return nil, errs.New(errs.Internal, "volume record names paths outside %s", base).WithPath(recordPath(base)).
			WithHint("the record was not written by this pgfork; remove it by hand after checking")
	}
	return &r, nil
}

func save(r *Record) error {
	b, err := json.MarshalIndent(r, "", "  ")
	if err != nil {
		return errs.Wrap(errs.Internal, err, "cannot encode the volume record")
	}
	if err := fsutil.WriteFileAtomic(recordPath(r.Base), append(b, '\n'), 0o644); err != nil {
		return errs.FromOS(err, recordPath(r.Base), "cannot write the volume record")
	}
	return nil
}

// FstabLine is the /etc/fstab line that mounts the volume at boot.
func (r *Record) FstabLine() string {
	return r.Image + " " + r.Mount + " " + r.FS + " loop,nosuid,nodev,nofail 0 0"
}

// GrowHint is the advice given when the volume is full.
func (r *Record) GrowHint() string {
	return "grow it, as root: pgfork volume grow --size " + sizeArg(r.Size*2)
}

func sizeArg(n int64) string {
	const g = 1 << 30
	if n%g == 0 {
		return itoa(n/g) + "G"
	}
	return itoa((n+(1<<20)-1)>>20) + "M"
}

func itoa(n int64) string {
	b, _ := json.Marshal(n)
	return string(b)
}

// Speedup is what Measure found: the time to copy one file set on the base
// directory's filesystem and on a temporary reflink volume made beside it.
type Speedup struct {
	Bytes int64         `json:"bytes"`
	Files int           `json:"files"`
	Copy  time.Duration `json:"copy_ns"`  // on base's filesystem, durable (fsync)
	Clone time.Duration `json:"clone_ns"` // on a temporary XFS reflink volume; 0: not measured
	// Why says why Clone was not measured (not root, no mkfs.xfs, no loop).
	Why string `json:"why,omitempty"`
}

// MeasureRounds is how many copies each side of Measure times (the
// fastest counts).
const MeasureRounds = 3

// Ratio is Copy / Clone, or 0 when Clone was not measured.
func (s *Speedup) Ratio() float64 {
	if s.Clone <= 0 {
		return 0
	}
	return float64(s.Copy) / float64(s.Clone)
}
