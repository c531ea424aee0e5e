//go:build windows

package filesystem

import (
	"os"

	"golang.org/x/sys/windows"
)

// lockFile blocks until it holds an exclusive LockFileEx lock of f's first
// byte, the lock every Windows process (and SMB client) opening the file
// respects. Windows releases a closed handle's locks only "when resources
// allow", so release unlocks at once.
func lockFile(f *os.File) (release func(), err error) {
	h := windows.Handle(f.Fd())
	if err := windows.LockFileEx(h, windows.LOCKFILE_EXCLUSIVE_LOCK, 0, 1, 0, new(windows.Overlapped)); err != nil {
		return nil, err
	}
	return func() { _ = windows.UnlockFileEx(h, 0, 1, 0, new(windows.Overlapped)) }, nil
}
