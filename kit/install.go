package kit

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"strings"
	"time"
)

// Step is one entry Install writes.
type Step struct {
	File
	// Target is where it is written: the host path under the root.
	Target string
	// Aside is where the entry already at Target is moved first ("":
	// nothing is there, or a directory the kit's entries go into).
	Aside string
}

// Plan says what Install would do to put c's entries under root (the
// node's "/" for a rebuild in place): each entry's target, and where
// what is already there goes. An entry outside the kit's own paths, or
// one whose way passes through a symbolic link, is refused: a kit is
// only as trustworthy as whoever could write to the store, and anyone
// can encrypt to a public key.
func (c *Contents) Plan(root string, now time.Time) ([]Step, error) {
	if err := CheckPaths(c.Index.Paths); err != nil {
		return nil, fmt.Errorf("%w: %v", ErrDamaged, err)
	}
	links := map[string]bool{}
	stamp := now.UTC().Format("20060102T150405Z")
	var steps []Step
	for _, f := range c.Index.Files {
		if err := c.checkEntry(f, links); err != nil {
			return nil, err
		}
		if f.Mode&fs.ModeSymlink != 0 {
			links[f.Path] = true
		}
		s := Step{File: f, Target: filepath.Join(root, filepath.FromSlash(f.Path))}
		if err := checkNoLinkOnTheWay(root, f.Path); err != nil {
			return nil, err
		}
		if fi, err := os.Lstat(s.Target); err == nil && !(fi.IsDir() && f.Mode.IsDir()) {
			s.Aside = filepath.Join(filepath.Dir(s.Target), "."+filepath.Base(s.Target)+".before-rebuild-"+stamp)
		} else if err != nil && !errors.Is(err, fs.ErrNotExist) {
			return nil, err
		}
		steps = append(steps, s)
	}
	return steps, nil
}

// checkEntry refuses an entry that is not a clean absolute path under
// one of the kit's paths, or that lies under one of its own links.
func (c *Contents) checkEntry(f File, links map[string]bool) error {
	if !path.IsAbs(f.Path) || path.Clean(f.Path) != f.Path {
		return fmt.Errorf("%w: entry %q is not a clean absolute path", ErrDamaged, f.Path)
	}
	under := false
	for _, p := range c.Index.Paths {
		under = under || f.Path == p || strings.HasPrefix(f.Path, p+"/")
	}
	if !under {
		return fmt.Errorf("entry %q is %w %s", f.Path, ErrOutside, strings.Join(c.Index.Paths, ", "))
	}
	for d := path.Dir(f.Path); d != "/"; d = path.Dir(d) {
		if links[d] {
			return fmt.Errorf("%w: entry %q lies under the kit's own symbolic link %s", ErrDamaged, f.Path, d)
		}
	}
	return nil
}

// checkNoLinkOnTheWay refuses a host path whose parent directories under
// root include a symbolic link: writing through it would land elsewhere.
func checkNoLinkOnTheWay(root, p string) error {
	for d := path.Dir(p); d != "/"; d = path.Dir(d) {
		fi, err := os.Lstat(filepath.Join(root, filepath.FromSlash(d)))
		if errors.Is(err, fs.ErrNotExist) {
			continue
		}
		if err != nil {
			return err
		}
		if fi.Mode()&fs.ModeSymlink != 0 {
			return fmt.Errorf("%s is a symbolic link on this node: the kit's %s would be written through it; move it away and run again", filepath.Join(root, d), p)
		}
	}
	return nil
}

// Install carries out steps with c's bytes, in order: what is at an
// entry's target is renamed aside (hidden, so that a kubelet reading a
// manifest directory skips it), never deleted; files are written to a
// temporary name, synced and renamed into place with their mode and
// owner.
func (c *Contents) Install(steps []Step) error {
	for _, s := range steps {
		if s.Aside != "" {
			if err := os.Rename(s.Target, s.Aside); err != nil {
				return fmt.Errorf("move %s aside: %w", s.Target, err)
			}
		}
		if err := os.MkdirAll(filepath.Dir(s.Target), 0o755); err != nil {
			return err
		}
		switch {
		case s.Mode.IsDir():
			if err := os.Mkdir(s.Target, s.Mode.Perm()); err != nil && !errors.Is(err, fs.ErrExist) {
				return err
			}
			if err := os.Chmod(s.Target, s.Mode.Perm()); err != nil {
				return err
			}
		case s.Mode&fs.ModeSymlink != 0:
			if err := os.Symlink(s.Link, s.Target); err != nil {
				return err
			}
			continue
		default:
			if err := writeFile(s.Target, c.Data[s.Path], s.Mode.Perm()); err != nil {
				return err
			}
		}
		if err := setOwner(s.Target, s.UID, s.GID); err != nil {
			return err
		}
	}
	return nil
}

func writeFile(target string, data []byte, perm fs.FileMode) error {
	tmp, err := os.CreateTemp(filepath.Dir(target), "."+filepath.Base(target)+".tmp-*")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name())
	if _, err := tmp.Write(data); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Chmod(perm); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Sync(); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	return os.Rename(tmp.Name(), target)
}
