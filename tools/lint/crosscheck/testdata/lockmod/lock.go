// Package lockmod builds where syscall.Flock exists and nowhere else, as
// storage/filesystem did before it had a Windows lock.
package lockmod

import (
	"os"
	"syscall"
)

func Lock(f *os.File) error { return syscall.Flock(int(f.Fd()), syscall.LOCK_EX) }
