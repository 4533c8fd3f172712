package restore

import (
	"os"

	"golang.org/x/sys/unix"
)

var errNoSpace = unix.ENOSPC

func syncFS(dir string) error {
	f, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer f.Close()
	return os.NewSyscallError("syncfs", unix.Syncfs(int(f.Fd())))
}
