//go:build unix

package filesystem

import (
	"errors"
	"os"
	"syscall"
)

// lockFile blocks until it holds an exclusive flock(2) of f, which every
// process opening the same file (replicas on a shared volume among them)
// respects. Closing f releases it too; release does so at once.
func lockFile(f *os.File) (release func(), err error) {
	for {
		err = syscall.Flock(int(f.Fd()), syscall.LOCK_EX)
		if !errors.Is(err, syscall.EINTR) {
			break
		}
	}
	if err != nil {
		return nil, err
	}
	return func() { _ = syscall.Flock(int(f.Fd()), syscall.LOCK_UN) }, nil
}
