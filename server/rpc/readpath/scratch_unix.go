//go:build unix

package readpath

import (
	"fmt"
	"syscall"
)

// scratchSpace is what statfs(2) says of the file system holding dir:
// the bytes an unprivileged writer may still use, and its size.
func scratchSpace(dir string) (available, total int64, err error) {
	var st syscall.Statfs_t
	if err := syscall.Statfs(dir, &st); err != nil {
		return 0, 0, fmt.Errorf("statfs %s: %w", dir, err)
	}
	bsize := int64(st.Bsize)
	return int64(st.Bavail) * bsize, int64(st.Blocks) * bsize, nil
}
