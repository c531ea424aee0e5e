//go:build !unix

package kit

import "io/fs"

// owner is unknown where files have no Unix owner.
func owner(fs.FileInfo) (uid, gid int) { return 0, 0 }

// setOwner does nothing where files have no Unix owner: a kit is
// installed on a control-plane node, which is Unix; elsewhere only looked at.
func setOwner(string, int, int) error { return nil }
