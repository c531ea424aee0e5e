//go:build windows

package filesystem

import (
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
)

// openNoFollow opens path read-only, refusing a symbolic link or
// junction as its last element. Windows has no O_NOFOLLOW: the link is
// looked for first, and a file swapped in between that and the open is
// told by its identity.
func openNoFollow(path string) (*os.File, error) {
	before, err := os.Lstat(path)
	if err != nil {
		return nil, err
	}
	if before.Mode()&(fs.ModeSymlink|fs.ModeIrregular) != 0 {
		return nil, fmt.Errorf("%s is %w", filepath.Base(path), errNotRegular)
	}
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	opened, err := f.Stat()
	if err != nil {
		f.Close()
		return nil, err
	}
	if !os.SameFile(before, opened) {
		f.Close()
		return nil, fmt.Errorf("%s changed while it was opened: %w", filepath.Base(path), errNotRegular)
	}
	return f, nil
}

// fileID would tell a file from the one at its path before; Windows'
// FileInfo does not carry its file index, so List reads every manifest.
func fileID(fs.FileInfo) (dev, ino uint64, ok bool) { return 0, 0, false }
