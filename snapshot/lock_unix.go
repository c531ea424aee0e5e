//go:build unix

package snapshot

import (
	"errors"
	"fmt"
	"os"
	"syscall"

	"go.etcd.io/etcd/client/pkg/v3/fileutil"
)

// lockFollowsPath: the flock is on the directory itself, so a directory
// created at the same path after moving the old one aside needs its own.
const lockFollowsPath = false

// lockDir takes an exclusive, non-blocking flock on directory dir: held by
// another restore (of this or another process, on this node or through a
// filesystem that shares flocks) it fails with ErrRestoreInProgress.
func lockDir(dir string) (unlock func(), err error) {
	f, err := os.Open(dir)
	if err != nil {
		return nil, fmt.Errorf("lock data directory: %w", err)
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		f.Close()
		if errors.Is(err, syscall.EWOULDBLOCK) {
			return nil, fmt.Errorf("%w: %s is locked by another restore; let it finish, or stop it, before trying again", ErrRestoreInProgress, dir)
		}
		return nil, fmt.Errorf("lock data directory %s: %w", dir, err)
	}
	return func() { f.Close() }, nil
}

// flockHeld says whether another open file holds a flock on path, as
// bbolt does on etcd's member/snap/db while etcd runs.
func flockHeld(path string) (bool, error) {
	f, err := os.Open(path)
	if err != nil {
		return false, err
	}
	defer f.Close()
	err = syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB)
	if errors.Is(err, syscall.EWOULDBLOCK) {
		return true, nil
	}
	return false, err
}

// walLockHeld says whether a running etcd holds WAL file path, asking
// with etcd's own lock (fcntl's OFD locks on Linux, flock elsewhere).
func walLockHeld(path string) (bool, error) {
	f, err := fileutil.TryLockFile(path, os.O_WRONLY, fileutil.PrivateFileMode)
	if errors.Is(err, fileutil.ErrLocked) {
		return true, nil
	}
	if err != nil {
		return false, err
	}
	return false, f.Close()
}
