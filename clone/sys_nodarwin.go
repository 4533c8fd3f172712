//go:build !linux && !darwin

package clone

import "os"

func cloneFile(*os.File, *os.File) error { return errNotHere }

func cloneUnsupported(error) bool { return false }

func freeBytes(string) (int64, error) { return 0, errNotHere }
