// Package snapshot fetches, checks and restores etcd snapshots: it turns a
// stored backup (possibly zstd-compressed) back into the file etcd wrote,
// checks etcd's own SHA-256 trailer and the database's consistency, and
// rebuilds a member's data directory with etcd's own restore code
// (go.etcd.io/etcd/etcdutl/v3/snapshot). The plugin's local restore, the
// restore agent and the server's verify all use it.
package snapshot

import (
	"bytes"
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/klauspost/compress/zstd"
	etcdutl "go.etcd.io/etcd/etcdutl/v3/snapshot"
	"go.uber.org/zap"

	ebv1 "github.com/kubectl-etcdbackup/kubectl-etcdbackup/api/etcdbackup/v1"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/client"
)

// ErrCorrupt reports a backup that is not what it claims to be: its stored
// SHA-256, etcd's trailer or the database's own structure is wrong.
var ErrCorrupt = errors.New("the backup is corrupt")

// Status is what etcd says about a snapshot.
type Status = etcdutl.Status

// Decompress copies r to w, undoing the backup's compression.
func Decompress(w io.Writer, r io.Reader, compression string) (int64, error) {
	switch compression {
	case "":
		return io.Copy(w, r)
	case "zstd":
		dec, err := zstd.NewReader(r, zstd.WithDecoderConcurrency(1), zstd.WithDecoderLowmem(true))
		if err != nil {
			return 0, err
		}
		defer dec.Close()
		n, err := io.Copy(w, dec)
		if err != nil {
			return n, fmt.Errorf("%w: zstd: %v", ErrCorrupt, err)
		}
		return n, nil
	}
	return 0, fmt.Errorf("unknown compression %q", compression)
}

// Check verifies an etcd snapshot file: etcd's 32-byte SHA-256 trailer,
// then (through etcdutl) bolt's consistency check of every page, and
// returns the snapshot's status.
func Check(path string) (Status, error) {
	if err := checkTrailer(path); err != nil {
		return Status{}, err
	}
	st, err := etcdutl.NewV3(zap.NewNop()).Status(path)
	if err != nil {
		return Status{}, fmt.Errorf("%w: etcd cannot read the database: %v", ErrCorrupt, err)
	}
	return st, nil
}

func checkTrailer(path string) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return err
	}
	size := st.Size()
	if size < sha256.Size || (size-sha256.Size)%512 != 0 {
		return fmt.Errorf("%w: %d bytes is not an etcd database followed by its 32-byte SHA-256", ErrCorrupt, size)
	}
	h := sha256.New()
	if _, err := io.CopyN(h, f, size-sha256.Size); err != nil {
		return err
	}
	trailer := make([]byte, sha256.Size)
	if _, err := io.ReadFull(f, trailer); err != nil {
		return err
	}
	if !bytes.Equal(h.Sum(nil), trailer) {
		return fmt.Errorf("%w: etcd's SHA-256 trailer does not match the database", ErrCorrupt)
	}
	return nil
}

// Fetch downloads backup (name, location) through c into dir, verifying the
// stored SHA-256, undoing compression and checking the result with Check.
// It returns the path of the etcd snapshot file and its status. The
// download resumes from a .part file left by an interrupted Fetch.
func Fetch(ctx context.Context, c *client.Client, name, location, dir string, progress func(done, total int64)) (string, *ebv1.Backup, Status, error) {
	stored := filepath.Join(dir, name+".backup")
	var total int64
	b, err := c.DownloadFile(ctx, client.FileDownload{
		Path:    stored,
		Replace: true,
		DownloadRequest: client.DownloadRequest{
			Name: name, Location: location,
			OnHeader: func(b *ebv1.Backup) error { total = b.GetSize(); return nil },
			Progress: func(n int64) {
				if progress != nil {
					progress(n, total)
				}
			},
		},
	})
	if errors.Is(err, client.ErrCorrupt) {
		return "", b, Status{}, fmt.Errorf("%w: %v", ErrCorrupt, err)
	}
	if err != nil {
		return "", b, Status{}, err
	}
	path := stored
	if b.GetCompression() != "" {
		path = filepath.Join(dir, name+".db")
		if err := decompressFile(stored, path, b.GetCompression()); err != nil {
			return "", b, Status{}, err
		}
		os.Remove(stored)
	}
	st, err := Check(path)
	if err != nil {
		return "", b, Status{}, err
	}
	return path, b, st, nil
}

// zstdMagic starts every zstd frame.
var zstdMagic = []byte{0x28, 0xb5, 0x2f, 0xfd}

// Unpack returns the path of the etcd snapshot in file: file itself, or,
// when it is zstd-compressed (a stored backup downloaded as is), a
// decompressed copy in dir.
func Unpack(file, dir string) (string, error) {
	f, err := os.Open(file)
	if err != nil {
		return "", err
	}
	head := make([]byte, len(zstdMagic))
	_, err = io.ReadFull(f, head)
	f.Close()
	if err != nil || !bytes.Equal(head, zstdMagic) {
		return file, nil
	}
	out := filepath.Join(dir, filepath.Base(file)+".db")
	return out, decompressFile(file, out, "zstd")
}

func decompressFile(src, dst, compression string) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o600)
	if err != nil {
		return err
	}
	if _, err := Decompress(out, in, compression); err != nil {
		out.Close()
		os.Remove(dst)
		return err
	}
	if err := out.Sync(); err != nil {
		out.Close()
		return err
	}
	return out.Close()
}

// Member is the layout of the member a data directory is rebuilt for.
type Member struct {
	Name                     string
	InitialCluster           string
	InitialAdvertisePeerURLs []string
	InitialClusterToken      string
	// DataDir is the member's --data-dir.
	DataDir string
	// MoveAside lets Restore rename a non-empty DataDir to
	// DataDir.before-restore-TIMESTAMP instead of refusing.
	MoveAside bool
}

// Validate checks the layout before anything is touched.
func (m Member) Validate() error {
	var missing []string
	if m.Name == "" {
		missing = append(missing, "member name")
	}
	if m.InitialCluster == "" {
		missing = append(missing, "initial cluster")
	}
	if len(m.InitialAdvertisePeerURLs) == 0 {
		missing = append(missing, "initial advertise peer URLs")
	}
	if m.DataDir == "" {
		missing = append(missing, "data dir")
	}
	if len(missing) > 0 {
		return fmt.Errorf("restore needs the %s", strings.Join(missing, ", "))
	}
	if !strings.Contains(m.InitialCluster, m.Name+"=") {
		return fmt.Errorf("initial cluster %q does not name member %q", m.InitialCluster, m.Name)
	}
	return nil
}

// ErrDataDirNotEmpty is returned when the data directory holds data and
// MoveAside was not asked for.
var ErrDataDirNotEmpty = errors.New("the data directory is not empty")

// CheckDataDir fails early, before any download, when Restore would
// refuse m.DataDir.
func CheckDataDir(m Member) error {
	if err := m.Validate(); err != nil {
		return err
	}
	entries, err := os.ReadDir(m.DataDir)
	if err == nil && len(entries) > 0 && !m.MoveAside {
		return fmt.Errorf("%w: %s holds %d entries; stop the member and pass the move-aside option to keep them next to it, or choose an empty directory",
			ErrDataDirNotEmpty, m.DataDir, len(entries))
	}
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	return nil
}

// Restore rebuilds m's data directory from the snapshot at path with etcd's
// own restore code (which checks the SHA-256 trailer again). A non-empty
// data directory is refused, or with MoveAside renamed — never deleted. It
// returns where the old data went, if anywhere.
func Restore(path string, m Member) (movedTo string, err error) {
	if err := CheckDataDir(m); err != nil {
		return "", err
	}
	entries, err := os.ReadDir(m.DataDir)
	switch {
	case errors.Is(err, os.ErrNotExist):
	case err != nil:
		return "", err
	case len(entries) > 0:
		movedTo = fmt.Sprintf("%s.before-restore-%s", strings.TrimRight(m.DataDir, "/"), time.Now().UTC().Format("20060102-150405"))
		if err := os.Rename(m.DataDir, movedTo); err != nil {
			return "", fmt.Errorf("move %s aside: %w", m.DataDir, err)
		}
	default:
		// An empty directory (a fresh volume's mount point, which cannot
		// be removed) is used as is: etcdutl refuses only non-empty ones.
	}
	token := m.InitialClusterToken
	if token == "" {
		token = "etcd-cluster" // etcd's own default
	}
	err = etcdutl.NewV3(zap.NewNop()).Restore(etcdutl.RestoreConfig{
		SnapshotPath:        path,
		Name:                m.Name,
		OutputDataDir:       m.DataDir,
		PeerURLs:            m.InitialAdvertisePeerURLs,
		InitialCluster:      m.InitialCluster,
		InitialClusterToken: token,
	})
	if err != nil {
		return movedTo, fmt.Errorf("etcd restore into %s: %w", m.DataDir, err)
	}
	return movedTo, nil
}
