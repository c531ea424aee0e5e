// Package kit is a control plane's recovery kit: the files etcd's data
// alone cannot bring back — the cluster's CA and every key under
// /etc/kubernetes/pki, the API server's encryption-at-rest
// configuration, the static-pod manifests, the kubeconfigs — with the
// component versions they were taken with, packed as one tar and
// encrypted to age recipients.
//
// The backup agent collects a kit on the control-plane node (Collect),
// seals it before any byte leaves the node (Seal), and the server stores
// the ciphertext it cannot read. The operator's machine opens it with an
// identity (Open), which checks every file against the index sealed with
// it, and a rebuild puts the files back under a root (Install), moving
// what is there aside, never deleting it.
package kit

import (
	"archive/tar"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"filippo.io/age"

	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/crypt"
)

// Limits on what one kit holds: a control plane's files are a few
// hundred kilobytes; a root that holds gigabytes was named by mistake.
const (
	MaxFiles = 1024
	MaxBytes = 64 << 20
)

// indexName is the tar's first entry: the Index, inside the encryption.
const indexName = ".etcdbackup-kit.json"

// DefaultPaths are what a kubeadm control-plane node keeps outside etcd:
// /etc/kubernetes holds pki/ (with etcd/), the static-pod manifests,
// the kubeconfigs, and the encryption configuration where kubeadm
// installs mount it from.
var DefaultPaths = []string{"/etc/kubernetes"}

// Index is what a kit holds, sealed inside it: the files with their
// SHA-256, and the facts a rebuild checks before it writes anything.
type Index struct {
	Format   int       `json:"format"`
	Backup   string    `json:"backup"`
	Node     string    `json:"node,omitempty"`
	Time     time.Time `json:"time"`
	Paths    []string  `json:"paths"`
	Versions Versions  `json:"versions"`
	Files    []File    `json:"files"`
	// Skipped are entries that are neither files, directories nor
	// symbolic links (sockets, devices): named, not collected.
	Skipped []string `json:"skipped,omitempty"`
}

// Versions are the component versions the kit was taken with.
type Versions struct {
	Etcd       string `json:"etcd,omitempty"`
	Kubernetes string `json:"kubernetes,omitempty"`
}

// File is one entry: a regular file, a directory or a symbolic link.
type File struct {
	Path string      `json:"path"`
	Mode fs.FileMode `json:"mode"`
	Size int64       `json:"size,omitempty"`
	// SHA256 is a regular file's (lower-case hex).
	SHA256 string `json:"sha256,omitempty"`
	// Link is a symbolic link's target, recorded, never followed.
	Link string `json:"link,omitempty"`
	UID  int    `json:"uid,omitempty"`
	GID  int    `json:"gid,omitempty"`
}

// Contents is an opened kit: its index and every regular file's bytes.
type Contents struct {
	Index Index
	Data  map[string][]byte
}

// Errors Collect and Open name.
var (
	// ErrOutside is a path not under the directories the kit may read.
	ErrOutside = errors.New("outside the kit's paths")
	// ErrTooLarge is a kit beyond MaxFiles or MaxBytes.
	ErrTooLarge = errors.New("too large for a recovery kit")
	// ErrDamaged is a kit whose files do not match its index.
	ErrDamaged = errors.New("the recovery kit does not match its index")
)

// CheckPaths refuses directories a kit cannot be collected from: not
// absolute, not clean, or the host's root.
func CheckPaths(paths []string) error {
	if len(paths) == 0 {
		return errors.New("a recovery kit needs at least one path")
	}
	for _, p := range paths {
		switch {
		case !path.IsAbs(p):
			return fmt.Errorf("kit path %q is not absolute", p)
		case path.Clean(p) != p:
			return fmt.Errorf("kit path %q is not clean (write %q)", p, path.Clean(p))
		case p == "/":
			return errors.New("kit path \"/\" is the whole host: name the directories the control plane keeps (/etc/kubernetes)")
		}
	}
	return nil
}

// Collect reads every entry under paths, as the host names them, from
// hostRoot (where the agent sees the host's paths: "/" on the node, the
// mount prefix in a pod). Symbolic links are recorded, never followed;
// nothing outside paths is read.
func Collect(ctx context.Context, hostRoot string, paths []string, meta Index) (*Contents, error) {
	if err := CheckPaths(paths); err != nil {
		return nil, err
	}
	c := &Contents{Index: meta, Data: map[string][]byte{}}
	c.Index.Format, c.Index.Paths, c.Index.Files = 1, slices.Clone(paths), nil
	var total int64
	for _, root := range paths {
		base := filepath.Join(hostRoot, filepath.FromSlash(root))
		err := filepath.WalkDir(base, func(p string, d fs.DirEntry, err error) error {
			if err != nil {
				return err
			}
			if err := ctx.Err(); err != nil {
				return err
			}
			rel, err := filepath.Rel(base, p)
			if err != nil {
				return err
			}
			name := path.Join(root, filepath.ToSlash(rel))
			info, err := d.Info()
			if err != nil {
				return err
			}
			f := File{Path: name, Mode: info.Mode()}
			f.UID, f.GID = owner(info)
			switch {
			case info.Mode().IsRegular():
				b, err := readBounded(p, MaxBytes-total)
				if err != nil {
					return err
				}
				total += int64(len(b))
				sum := sha256.Sum256(b)
				f.Size, f.SHA256 = int64(len(b)), hex.EncodeToString(sum[:])
				c.Data[name] = b
			case info.IsDir():
			case info.Mode()&fs.ModeSymlink != 0:
				if f.Link, err = os.Readlink(p); err != nil {
					return err
				}
			default:
				c.Index.Skipped = append(c.Index.Skipped, name)
				return nil
			}
			if len(c.Index.Files) >= MaxFiles {
				return fmt.Errorf("more than %d entries: %w", MaxFiles, ErrTooLarge)
			}
			c.Index.Files = append(c.Index.Files, f)
			return nil
		})
		if err != nil {
			return nil, fmt.Errorf("collect %s: %w", root, err)
		}
	}
	return c, nil
}

func readBounded(p string, left int64) ([]byte, error) {
	f, err := os.Open(p)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, left+1))
	if err != nil {
		return nil, err
	}
	if int64(len(b)) > left {
		return nil, fmt.Errorf("%s: more than %d bytes in all: %w", p, MaxBytes, ErrTooLarge)
	}
	return b, nil
}

// Sealed is a kit encrypted: the age file, and the size and SHA-256 of
// the tar inside it.
type Sealed struct {
	Data        []byte
	PlainSize   int64
	PlainSHA256 string
}

// Seal writes c as a tar, its index first, encrypted to recipients.
func (c *Contents) Seal(ctx context.Context, recipients []age.Recipient) (*Sealed, error) {
	var plain bytes.Buffer
	tw := tar.NewWriter(&plain)
	idx, err := json.Marshal(c.Index)
	if err != nil {
		return nil, err
	}
	if err := writeEntry(tw, &tar.Header{Name: indexName, Mode: 0o600, Typeflag: tar.TypeReg}, idx); err != nil {
		return nil, err
	}
	for _, f := range c.Index.Files {
		h := &tar.Header{Name: strings.TrimPrefix(f.Path, "/"), Mode: int64(f.Mode.Perm()), Uid: f.UID, Gid: f.GID, Format: tar.FormatPAX}
		switch {
		case f.Mode.IsDir():
			h.Typeflag, h.Name = tar.TypeDir, h.Name+"/"
		case f.Mode&fs.ModeSymlink != 0:
			h.Typeflag, h.Linkname = tar.TypeSymlink, f.Link
		default:
			h.Typeflag = tar.TypeReg
		}
		if err := writeEntry(tw, h, c.Data[f.Path]); err != nil {
			return nil, err
		}
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	sum := sha256.Sum256(plain.Bytes())
	out := &Sealed{PlainSize: int64(plain.Len()), PlainSHA256: hex.EncodeToString(sum[:])}
	r, err := crypt.Encrypt(ctx, &plain, recipients)
	if err != nil {
		return nil, err
	}
	if out.Data, err = io.ReadAll(r); err != nil {
		return nil, err
	}
	return out, nil
}

func writeEntry(tw *tar.Writer, h *tar.Header, data []byte) error {
	h.Size = int64(len(data))
	if err := tw.WriteHeader(h); err != nil {
		return err
	}
	_, err := tw.Write(data)
	return err
}

// Open decrypts a sealed kit with ids and checks every entry against its
// index: the same entries, each file with its size and SHA-256. It fails
// with crypt's errors (crypt.ErrNoMatchingIdentity, crypt.ErrTampered…)
// when the kit does not open, and with ErrDamaged when it opens to
// something its index does not describe.
func Open(r io.Reader, ids []age.Identity) (*Contents, error) {
	pr, err := crypt.Decrypt(r, ids)
	if err != nil {
		return nil, err
	}
	tr := tar.NewReader(io.LimitReader(pr, 2*MaxBytes))
	h, err := tr.Next()
	if err != nil {
		return nil, fmt.Errorf("read kit: %w", err)
	}
	if h.Name != indexName {
		return nil, fmt.Errorf("%w: its first entry is not the index", ErrDamaged)
	}
	c := &Contents{Data: map[string][]byte{}}
	idx, err := io.ReadAll(io.LimitReader(tr, MaxBytes))
	if err != nil {
		return nil, fmt.Errorf("read kit: %w", err)
	}
	if err := json.Unmarshal(idx, &c.Index); err != nil {
		return nil, fmt.Errorf("%w: index: %v", ErrDamaged, err)
	}
	want := map[string]File{}
	for _, f := range c.Index.Files {
		want[f.Path] = f
	}
	seen := 0
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return nil, fmt.Errorf("read kit: %w", err)
		}
		name := "/" + strings.TrimSuffix(h.Name, "/")
		f, ok := want[name]
		if !ok {
			return nil, fmt.Errorf("%w: %s is not in its index", ErrDamaged, name)
		}
		seen++
		if h.Typeflag != tar.TypeReg {
			continue
		}
		b, err := io.ReadAll(io.LimitReader(tr, MaxBytes+1))
		if err != nil {
			return nil, fmt.Errorf("read kit: %w", err)
		}
		sum := sha256.Sum256(b)
		if int64(len(b)) != f.Size || hex.EncodeToString(sum[:]) != f.SHA256 {
			return nil, fmt.Errorf("%w: %s has other bytes than those it was collected with", ErrDamaged, name)
		}
		c.Data[name] = b
	}
	if seen != len(want) {
		return nil, fmt.Errorf("%w: %d of its %d entries are missing", ErrDamaged, len(want)-seen, len(want))
	}
	return c, nil
}

// SHA256 is the SHA-256 (lower-case hex) of the sealed kit, as stored.
func (s *Sealed) SHA256() string {
	sum := sha256.Sum256(s.Data)
	return hex.EncodeToString(sum[:])
}
