//go:build windows

package snapshot

import (
	"errors"
	"fmt"
	"os"
	"strings"

	"golang.org/x/sys/windows"
)

// lockFollowsPath: the lock is a file beside the data directory, named for
// its path, so it covers whatever directory stands at that path, one
// created after moving the old one aside included.
const lockFollowsPath = true

// lockDir takes an exclusive, non-blocking LockFileEx lock of DIR.restore.lock
// beside directory dir: held by another restore it fails with
// ErrRestoreInProgress. Windows cannot lock a directory, and a handle open on
// one would stop it being moved aside, hence the file beside it; it is
// removed on unlock unless another restore has it open meanwhile.
func lockDir(dir string) (unlock func(), err error) {
	path := strings.TrimRight(dir, `\/`) + ".restore.lock"
	f, err := os.OpenFile(path, os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		return nil, fmt.Errorf("lock data directory: %w", err)
	}
	h := windows.Handle(f.Fd())
	err = windows.LockFileEx(h, windows.LOCKFILE_EXCLUSIVE_LOCK|windows.LOCKFILE_FAIL_IMMEDIATELY, 0, 1, 0, new(windows.Overlapped))
	if err != nil {
		f.Close()
		if errors.Is(err, windows.ERROR_LOCK_VIOLATION) {
			return nil, fmt.Errorf("%w: %s is locked by another restore (%s); let it finish, or stop it, before trying again", ErrRestoreInProgress, dir, path)
		}
		return nil, fmt.Errorf("lock data directory %s: %w", dir, err)
	}
	return func() {
		_ = windows.UnlockFileEx(h, 0, 1, 0, new(windows.Overlapped))
		f.Close()
		// Fails, harmlessly, while another restore has the file open (Go
		// opens files without FILE_SHARE_DELETE): that one locks it next.
		_ = os.Remove(path)
	}, nil
}

// flockHeld says whether another open file holds bbolt's lock on path, as
// bbolt does on etcd's member/snap/db while etcd runs: on Windows bbolt
// locks the byte range at offset -1 with LockFileEx (bbolt's bolt_windows.go).
func flockHeld(path string) (bool, error) {
	h, err := openShared(path)
	if errors.Is(err, windows.ERROR_SHARING_VIOLATION) {
		return true, nil
	}
	if err != nil {
		return false, err
	}
	defer windows.CloseHandle(h)
	const m1 = ^uint32(0) // offset -1
	err = windows.LockFileEx(h, windows.LOCKFILE_EXCLUSIVE_LOCK|windows.LOCKFILE_FAIL_IMMEDIATELY, 0, 1, 0, &windows.Overlapped{Offset: m1, OffsetHigh: m1})
	if errors.Is(err, windows.ERROR_LOCK_VIOLATION) {
		return true, nil
	}
	if err != nil {
		return false, err
	}
	return false, windows.UnlockFileEx(h, 0, 1, 0, &windows.Overlapped{Offset: m1, OffsetHigh: m1})
}

// walLockHeld says whether a running etcd holds WAL file path: etcd
// locks its first byte with LockFileEx. (etcd's own TryLockFile tells a
// held lock by the English text of the error, so it answers "free" on a
// Windows in another language.)
func walLockHeld(path string) (bool, error) {
	h, err := openShared(path)
	if errors.Is(err, windows.ERROR_SHARING_VIOLATION) {
		return true, nil // open in a way that excludes even a reader: in use
	}
	if err != nil {
		return false, err
	}
	defer windows.CloseHandle(h)
	err = windows.LockFileEx(h, windows.LOCKFILE_EXCLUSIVE_LOCK|windows.LOCKFILE_FAIL_IMMEDIATELY, 0, 1, 0, new(windows.Overlapped))
	if errors.Is(err, windows.ERROR_LOCK_VIOLATION) {
		return true, nil
	}
	if err != nil {
		return false, err
	}
	return false, windows.UnlockFileEx(h, 0, 1, 0, new(windows.Overlapped))
}

// openShared opens path to read, sharing it as etcd and bbolt share their
// files (read, write and delete), so that asking about a lock never fails
// on how the holder opened the file.
func openShared(path string) (windows.Handle, error) {
	p, err := windows.UTF16PtrFromString(path)
	if err != nil {
		return windows.InvalidHandle, err
	}
	return windows.CreateFile(p, windows.GENERIC_READ,
		windows.FILE_SHARE_READ|windows.FILE_SHARE_WRITE|windows.FILE_SHARE_DELETE, nil, windows.OPEN_EXISTING, windows.FILE_ATTRIBUTE_NORMAL, 0)
}
