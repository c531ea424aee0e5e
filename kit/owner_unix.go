//go:build unix

package kit

import (
	"errors"
	"io/fs"
	"os"
	"syscall"
)

// owner is who owns the file info describes.
func owner(info fs.FileInfo) (uid, gid int) {
	if st, ok := info.Sys().(*syscall.Stat_t); ok {
		return int(st.Uid), int(st.Gid)
	}
	return 0, 0
}

// setOwner gives path to uid and gid as collected; where this process may
// not (not root), the file stays its own.
func setOwner(path string, uid, gid int) error {
	if err := os.Lchown(path, uid, gid); err != nil && !errors.Is(err, fs.ErrPermission) {
		return err
	}
	return nil
}
