//go:build unix

package filesystem

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"syscall"
)

// openNoFollow opens path read-only, refusing a symbolic link as its
// last element (O_NOFOLLOW, in the same call: no window for a swap), and
// without waiting for a writer if it is a FIFO (O_NONBLOCK, which
// changes nothing for a regular file).
func openNoFollow(path string) (*os.File, error) {
	f, err := os.OpenFile(path, os.O_RDONLY|syscall.O_NOFOLLOW|syscall.O_NONBLOCK, 0)
	if err == nil || errors.Is(err, fs.ErrNotExist) {
		return f, err
	}
	// O_NOFOLLOW's refusal is ELOOP on Linux and macOS, EMLINK on
	// FreeBSD: whether path is a link says which it was.
	if info, lerr := os.Lstat(path); lerr == nil && info.Mode()&fs.ModeSymlink != 0 {
		return nil, fmt.Errorf("%s is %w", filepath.Base(path), errNotRegular)
	}
	return nil, err
}

// fileID is what tells a file from the one that was at its path before:
// its device and inode. Every manifest this location writes is a new
// file linked or renamed into place, never one rewritten in place.
func fileID(info fs.FileInfo) (dev, ino uint64, ok bool) {
	st, ok := info.Sys().(*syscall.Stat_t)
	if !ok {
		return 0, 0, false
	}
	return uint64(st.Dev), uint64(st.Ino), true //nolint:unconvert // Dev is not uint64 everywhere
}
