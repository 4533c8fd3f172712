package volume

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/pgfork/pgfork/clone"
	"github.com/pgfork/pgfork/internal/errs"
	"github.com/pgfork/pgfork/internal/statedir"
	"github.com/pgfork/pgfork/internal/units"
)

// NeedRoot is the error for a caller that is not root; cmd is the command
// line to run as root instead.
func NeedRoot(cmd string) error {
	return errs.New(errs.Permission, "a reflink volume needs root (loop devices and mount)").
		WithHint("run as root: %s", cmd)
}

// SafeBase checks that base (created 0755 if missing) is reached only
// through directories that root owns and nobody else can write (a sticky
// directory counts for its ancestors), and returns it with symlinks resolved.
func SafeBase(base string) (string, error) {
	abs, err := filepath.Abs(base)
	if err != nil {
		return "", errs.FromOS(err, base, "cannot resolve the state directory")
	}
	if err := os.MkdirAll(abs, 0o755); err != nil {
		return "", errs.FromOS(err, abs, "cannot create the state directory")
	}
	real, err := filepath.EvalSymlinks(abs)
	if err != nil {
		return "", errs.FromOS(err, abs, "cannot resolve the state directory")
	}
	for p, first := real, true; ; p, first = filepath.Dir(p), false {
		var st unix.Stat_t
		if err := unix.Lstat(p, &st); err != nil {
			return "", errs.FromOS(err, p, "cannot check the state directory's parents")
		}
		writable := st.Mode&0o022 != 0 && (first || st.Mode&unix.S_ISVTX == 0)
		if st.Uid != 0 || writable {
			return "", errs.New(errs.Permission, "%s can be changed by a user other than root", p).WithPath(real).
				WithHint("a volume is made by root only under directories only root controls; use the default state directory (/var/lib/pgfork) or one owned by root, mode 0755")
		}
		if p == "/" {
			return real, nil
		}
	}
}

// Create makes, attaches and records a volume for base, or re-attaches the
// one recorded there. It refuses when the base directory's filesystem can
// already clone (nothing to gain) unless force.
//
// The volume moves pgfork's state: Create refuses (errs.Busy, naming them)
// while anything pgfork runs from base — clusters, a pgfork serve, its
// branches, a `pgfork pg install` — and carries the managed PostgreSQL
// builds and the cached templates over onto the volume (copied before the
// volume is recorded, removed from base after), so nothing is left behind.
func Create(ctx context.Context, base string, o Options, force bool) (*Record, error) {
	if os.Geteuid() != 0 {
		return nil, NeedRoot("sudo pgfork volume create")
	}
	base, err := SafeBase(base)
	if err != nil {
		return nil, err
	}
	if _, err := os.Lstat(recordPath(base)); err == nil {
		r, err := Attach(ctx, base)
		if err == nil {
			dropCarried(ctx, base, r.State, o.say) // a crash after the record, before the removal
		}
		return r, err
	}
	if !force {
		p, err := clone.Probe(ctx, base, base)
		if err != nil {
			return nil, err
		}
		if p.Clone {
			return nil, errs.Wrap(errs.Exists, ErrCanClone, "%s can already clone (reflink): a volume would gain nothing", base).WithPath(base).
				WithCLI("pass --force to make one anyway")
		}
	}
	release, err := checkIdle(base)
	if err != nil {
		return nil, err
	}
	defer release()
	fsType := o.FS
	if fsType == "" {
		fsType = "xfs"
		if _, err := exec.LookPath("mkfs.xfs"); err != nil {
			fsType = "btrfs"
		}
	}
	mkfs, err := mkfsCommand(fsType)
	if err != nil {
		return nil, err
	}
	var sfs unix.Statfs_t
	if err := unix.Statfs(base, &sfs); err != nil {
		return nil, errs.FromOS(err, base, "cannot read free space")
	}
	free := int64(sfs.Bavail) * sfs.Bsize
	size := o.Size
	if size == 0 {
		size = min(DefaultMaxSize, free/2)
	}
	size = (size + (1<<20 - 1)) &^ (1<<20 - 1)
	if size < MinSize {
		return nil, errs.New(errs.Usage, "a volume of %s is too small", units.Bytes(size)).
			WithHint("give at least %s", units.Bytes(MinSize))
	}
	if size > free {
		return nil, errs.New(errs.NoSpace, "a volume of %s would not fit in the %s free on %s", units.Bytes(size), units.Bytes(free), base).
			WithPath(base).WithHint("free space there, or ask for a smaller volume").WithCLI("--size SIZE")
	}

	bd, err := openDir(base)
	if err != nil {
		return nil, err
	}
	defer unix.Close(bd)
	if err := unix.Mkdirat(bd, statedir.VolumeMount, 0o755); err != nil && err != unix.EEXIST {
		return nil, errs.FromOS(err, filepath.Join(base, statedir.VolumeMount), "cannot create the mount point")
	}
	mountPath := filepath.Join(base, statedir.VolumeMount)
	md, err := openMountPoint(bd, base)
	if err != nil {
		return nil, err
	}
	defer unix.Close(md)

	// The image: built under a temporary name, renamed when formatted.
	tmp := ImageName + ".tmp"
	_ = unix.Unlinkat(bd, tmp, 0) // a crashed create's leftover: ours by name, in a root-only dir
	fd, err := unix.Openat(bd, tmp, unix.O_RDWR|unix.O_CREAT|unix.O_EXCL|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o600)
	if err != nil {
		return nil, errs.FromOS(err, filepath.Join(base, tmp), "cannot create the image")
	}
	img := os.NewFile(uintptr(fd), filepath.Join(base, tmp))
	defer img.Close()
	fail := func(e error) (*Record, error) {
		_ = unix.Unlinkat(bd, tmp, 0)
		return nil, e
	}
	if err := img.Truncate(size); err != nil {
		return fail(errs.FromOS(err, img.Name(), "cannot size the image"))
	}
	if out, err := exec.CommandContext(ctx, mkfs[0], append(mkfs[1:], img.Name())...).CombinedOutput(); err != nil {
		return fail(errs.New(errs.Internal, "%s failed: %v: %s", mkfs[0], err, strings.TrimSpace(string(out))).WithPath(img.Name()))
	}
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return fail(errs.FromOS(err, img.Name(), "cannot stat the image"))
	}
	if err := unix.Renameat2(bd, tmp, bd, ImageName, unix.RENAME_NOREPLACE); err != nil {
		return fail(errs.FromOS(err, filepath.Join(base, ImageName), "cannot name the image"))
	}
	r := &Record{
		Base: base, Image: filepath.Join(base, ImageName), Mount: mountPath,
		State: filepath.Join(mountPath, statedir.VolumeState), FS: fsType, Size: size,
		ImageDev: st.Dev, ImageIno: st.Ino, Created: time.Now().UTC(),
	}
	if err := r.attach(ctx, md); err != nil {
		_ = unix.Unlinkat(bd, ImageName, 0)
		return nil, err
	}
	if err := mkState(bd, r); err != nil {
		_ = r.detach()
		_ = unix.Unlinkat(bd, ImageName, 0)
		return nil, err
	}
	if err := carry(ctx, base, r.State, o.say); err != nil {
		_ = r.detach()
		_ = unix.Unlinkat(bd, ImageName, 0)
		return nil, err
	}
	if err := save(r); err != nil {
		_ = r.detach()
		_ = unix.Unlinkat(bd, ImageName, 0)
		return nil, err
	}
	dropCarried(ctx, base, r.State, o.say)
	return r, nil
}

// mkState creates the state directory on the mounted volume: through a
// descriptor of the mount point opened after the mount, so it lands on the
// volume, not on the directory underneath.
func mkState(bd int, r *Record) error {
	md, err := unix.Openat(bd, statedir.VolumeMount, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return errs.FromOS(err, r.Mount, "cannot open the mounted volume")
	}
	defer unix.Close(md)
	if err := unix.Mkdirat(md, statedir.VolumeState, 0o755); err != nil && err != unix.EEXIST {
		return errs.FromOS(err, r.State, "cannot create the state directory on the volume")
	}
	return nil
}

func mkfsCommand(fsType string) ([]string, error) {
	switch fsType {
	case "xfs":
		return []string{"mkfs.xfs", "-q", "-m", "reflink=1"}, nil
	case "btrfs":
		if _, err := exec.LookPath("mkfs.btrfs"); err != nil {
			return nil, errs.New(errs.Unsupported, "neither mkfs.xfs nor mkfs.btrfs is installed").
				WithHint("install xfsprogs (apt-get install xfsprogs)")
		}
		return []string{"mkfs.btrfs", "-q"}, nil
	}
	return nil, errs.New(errs.Usage, "unknown volume filesystem %q", fsType).WithHint("use xfs or btrfs")
}

func openDir(dir string) (int, error) {
	fd, err := unix.Open(dir, unix.O_PATH|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return -1, errs.FromOS(err, dir, "cannot open the directory")
	}
	return fd, nil
}

// openMountPoint opens base/volume without following a symlink and checks
// it is an empty directory that nothing is mounted on.
func openMountPoint(bd int, base string) (int, error) {
	p := filepath.Join(base, statedir.VolumeMount)
	md, err := unix.Openat(bd, statedir.VolumeMount, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return -1, errs.FromOS(err, p, "cannot open the mount point")
	}
	var ms, bs unix.Stat_t
	if err := unix.Fstat(md, &ms); err == nil && unix.Fstat(bd, &bs) == nil && ms.Dev != bs.Dev {
		unix.Close(md)
		return -1, errs.New(errs.Busy, "something is already mounted on %s", p).WithPath(p).
			WithHint("unmount it first; pgfork mounts only on its own empty directory")
	}
	nd, err := unix.Dup(md)
	if err != nil {
		unix.Close(md)
		return -1, errs.FromOS(err, p, "cannot open the mount point")
	}
	f := os.NewFile(uintptr(nd), p)
	names, err := f.Readdirnames(1)
	f.Close()
	if len(names) > 0 {
		unix.Close(md)
		return -1, errs.New(errs.Exists, "the mount point %s is not empty: pgfork mounts only over an empty directory", p).WithPath(p).
			WithHint("move what is in it elsewhere, then try again")
	}
	if err != nil && err != io.EOF {
		unix.Close(md)
		return -1, errs.FromOS(err, p, "cannot read the mount point")
	}
	return md, nil
}

// checkImage opens the recorded image without following symlinks and
// checks it is the file the record names (device and inode).
func (r *Record) checkImage() (*os.File, error) {
	fd, err := unix.Open(r.Image, unix.O_RDWR|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, errs.FromOS(err, r.Image, "cannot open the volume image")
	}
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		unix.Close(fd)
		return nil, errs.FromOS(err, r.Image, "cannot stat the volume image")
	}
	if st.Dev != r.ImageDev || st.Ino != r.ImageIno || st.Mode&unix.S_IFMT != unix.S_IFREG {
		unix.Close(fd)
		return nil, errs.New(errs.Permission, "%s is not the image pgfork created (device/inode differ): not touching it", r.Image).
			WithPath(r.Image).WithHint("remove %s by hand if the volume is gone", recordPath(r.Base))
	}
	return os.NewFile(uintptr(fd), r.Image), nil
}

// ours reports whether loop device dev is backed by the recorded image.
func (r *Record) ours(dev string) bool {
	fd, err := unix.Open(dev, unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return false
	}
	defer unix.Close(fd)
	info, err := unix.IoctlLoopGetStatus64(fd)
	if err != nil {
		return false
	}
	return info.Device == r.ImageDev && info.Inode == r.ImageIno
}

// findLoop returns a loop device already backed by the image, if any.
func (r *Record) findLoop() string {
	if r.Loop != "" && r.ours(r.Loop) {
		return r.Loop
	}
	ds, _ := filepath.Glob("/sys/block/loop*/loop/backing_file")
	for _, bf := range ds {
		b, err := os.ReadFile(bf)
		if err != nil || strings.TrimSuffix(strings.TrimSpace(string(b)), " (deleted)") != r.Image {
			continue
		}
		dev := "/dev/" + filepath.Base(filepath.Dir(filepath.Dir(bf)))
		if r.ours(dev) {
			return dev
		}
	}
	return ""
}

// mountedFrom returns the source of the filesystem mounted at r.Mount, or "".
func (r *Record) mountedFrom() string {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return ""
	}
	defer f.Close()
	src := ""
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fs := strings.Fields(sc.Text())
		if len(fs) < 10 || unescapeMount(fs[4]) != r.Mount {
			continue
		}
		for i, x := range fs {
			if x == "-" && i+2 < len(fs) {
				src = fs[i+2] // the last mount on the point wins
			}
		}
	}
	return src
}

func unescapeMount(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+3 < len(s) {
			if n, err := strconv.ParseUint(s[i+1:i+4], 8, 8); err == nil {
				b.WriteByte(byte(n))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

// Attached reports whether the recorded volume is mounted at its mount point
// from a loop device backed by its image.
func (r *Record) Attached() bool {
	src := r.mountedFrom()
	return src != "" && strings.HasPrefix(src, "/dev/loop") && r.ours(src)
}

// Attach mounts the volume recorded for base again (after an unmount or a
// reboot); a volume already attached is left as it is.
func Attach(ctx context.Context, base string) (*Record, error) {
	if os.Geteuid() != 0 {
		return nil, NeedRoot("sudo pgfork volume attach")
	}
	base, err := SafeBase(base)
	if err != nil {
		return nil, err
	}
	r, err := Load(base)
	if err != nil {
		return nil, err
	}
	if r.Attached() {
		return r, nil
	}
	bd, err := openDir(base)
	if err != nil {
		return nil, err
	}
	defer unix.Close(bd)
	md, err := openMountPoint(bd, base)
	if err != nil {
		return nil, err
	}
	defer unix.Close(md)
	if err := r.attach(ctx, md); err != nil {
		return nil, err
	}
	return r, save(r)
}

// attach attaches the image to a loop device (reusing one already backed by
// it) and mounts it on the mount point open as md.
func (r *Record) attach(ctx context.Context, md int) error {
	img, err := r.checkImage()
	if err != nil {
		return err
	}
	defer img.Close()
	dev := r.findLoop()
	if dev == "" {
		out, err := exec.CommandContext(ctx, "losetup", "--find", "--show", "--nooverlap", r.Image).CombinedOutput()
		if err != nil {
			return errs.New(errs.Internal, "losetup failed: %v: %s", err, strings.TrimSpace(string(out))).WithPath(r.Image).
				WithHint("the kernel needs loop devices (modprobe loop; in a container: --privileged or --device /dev/loop-control)")
		}
		dev = strings.TrimSpace(string(out))
		if !r.ours(dev) {
			return errs.New(errs.Internal, "losetup attached %s but it is not backed by %s", dev, r.Image)
		}
	}
	r.Loop = dev
	target := "/proc/self/fd/" + strconv.Itoa(md)
	if err := unix.Mount(dev, target, r.FS, unix.MS_NOSUID|unix.MS_NODEV, ""); err != nil {
		_ = r.detachLoop()
		return errs.FromOS(&os.PathError{Op: "mount", Path: r.Mount, Err: err}, r.Mount, "cannot mount the volume")
	}
	return nil
}

// Unmount unmounts the volume and detaches its loop device, keeping the
// image and the record (Attach mounts it again).
func (r *Record) Unmount() error {
	if r.Attached() {
		if err := unix.Unmount(r.Mount, unix.UMOUNT_NOFOLLOW); err != nil {
			e := errs.FromOS(&os.PathError{Op: "umount", Path: r.Mount, Err: err}, r.Mount, "cannot unmount the volume")
			if err == unix.EBUSY {
				return errs.Wrap(errs.Busy, e, "the volume at %s is in use", r.Mount).
					WithHint("stop what runs on it first (the pool server, clusters started on it)").WithCLI("stop pgfork serve; pgfork down --all")
			}
			return e
		}
	}
	return r.detachLoop()
}

func (r *Record) detach() error { return r.Unmount() }

func (r *Record) detachLoop() error {
	dev := r.findLoop()
	if dev == "" {
		return nil
	}
	fd, err := unix.Open(dev, unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return errs.FromOS(err, dev, "cannot open the loop device")
	}
	defer unix.Close(fd)
	if err := unix.IoctlSetInt(fd, unix.LOOP_CLR_FD, 0); err != nil && err != unix.ENXIO {
		return errs.FromOS(&os.PathError{Op: "LOOP_CLR_FD", Path: dev, Err: err}, dev, "cannot detach the loop device")
	}
	return nil
}

// Remove unmounts the volume recorded for base, detaches its loop device,
// removes its image, its empty mount point and its record, and nothing else.
func Remove(ctx context.Context, base string) error {
	if os.Geteuid() != 0 {
		return NeedRoot("sudo pgfork volume rm")
	}
	base, err := SafeBase(base)
	if err != nil {
		return err
	}
	r, err := Load(base)
	if err != nil {
		return err
	}
	if err := r.Unmount(); err != nil {
		return err
	}
	bd, err := openDir(base)
	if err != nil {
		return err
	}
	defer unix.Close(bd)
	if img, err := r.checkImage(); err == nil {
		img.Close()
		if err := unix.Unlinkat(bd, ImageName, 0); err != nil {
			return errs.FromOS(err, r.Image, "cannot remove the volume image")
		}
	} else if !errors.Is(err, os.ErrNotExist) && errs.KindOf(err) != errs.NotFound {
		return err
	}
	_ = unix.Unlinkat(bd, statedir.VolumeMount, unix.AT_REMOVEDIR) // only when empty
	if err := unix.Unlinkat(bd, statedir.VolumeRecord, 0); err != nil {
		return errs.FromOS(err, recordPath(base), "cannot remove the volume record")
	}
	return nil
}

// Grow extends the volume recorded for base to size bytes while it stays
// mounted: the image, the loop device's capacity, the filesystem.
func Grow(ctx context.Context, base string, size int64) (*Record, error) {
	if os.Geteuid() != 0 {
		return nil, NeedRoot(fmt.Sprintf("sudo pgfork volume grow --size %s", sizeArg(size)))
	}
	base, err := SafeBase(base)
	if err != nil {
		return nil, err
	}
	r, err := Load(base)
	if err != nil {
		return nil, err
	}
	if !r.Attached() {
		return nil, errs.New(errs.NotFound, "the volume of %s is not attached", base).WithCLI("sudo pgfork volume attach")
	}
	size = (size + (1<<20 - 1)) &^ (1<<20 - 1)
	if size <= r.Size {
		return nil, errs.New(errs.Usage, "the volume is already %s", units.Bytes(r.Size)).WithHint("ask for a larger size").WithCLI("--size SIZE")
	}
	var sfs unix.Statfs_t
	if err := unix.Statfs(base, &sfs); err != nil {
		return nil, errs.FromOS(err, base, "cannot read free space")
	}
	if free := int64(sfs.Bavail) * sfs.Bsize; size-r.Size > free {
		return nil, errs.New(errs.NoSpace, "growing by %s would not fit in the %s free on %s", units.Bytes(size-r.Size), units.Bytes(free), base)
	}
	img, err := r.checkImage()
	if err != nil {
		return nil, err
	}
	defer img.Close()
	if err := img.Truncate(size); err != nil {
		return nil, errs.FromOS(err, r.Image, "cannot extend the image")
	}
	dev := r.findLoop()
	lfd, err := unix.Open(dev, unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, errs.FromOS(err, dev, "cannot open the loop device")
	}
	err = unix.IoctlSetInt(lfd, unix.LOOP_SET_CAPACITY, 0)
	unix.Close(lfd)
	if err != nil {
		return nil, errs.FromOS(&os.PathError{Op: "LOOP_SET_CAPACITY", Path: dev, Err: err}, dev, "cannot resize the loop device")
	}
	grow := []string{"xfs_growfs", r.Mount}
	if r.FS == "btrfs" {
		grow = []string{"btrfs", "filesystem", "resize", "max", r.Mount}
	}
	if out, err := exec.CommandContext(ctx, grow[0], grow[1:]...).CombinedOutput(); err != nil {
		return nil, errs.New(errs.Internal, "%s failed: %v: %s", grow[0], err, strings.TrimSpace(string(out))).WithPath(r.Mount)
	}
	r.Size = size
	return r, save(r)
}

// Stat returns base's record with its state now (attached, space).
func Stat(base string) (*Status, error) {
	if real, err := filepath.EvalSymlinks(base); err == nil {
		base = real
	}
	r, err := Load(base)
	if err != nil {
		return nil, err
	}
	s := &Status{Record: *r, Attached: r.Attached()}
	if s.Attached {
		var sfs unix.Statfs_t
		if unix.Statfs(r.Mount, &sfs) == nil {
			s.Free = int64(sfs.Bavail) * sfs.Bsize
			s.Used = int64(sfs.Blocks-sfs.Bfree) * sfs.Bsize
		}
	}
	return s, nil
}
