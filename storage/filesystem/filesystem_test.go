package filesystem_test

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/storage"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/storage/filesystem"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/storage/storagetest"
)

func TestConformance(t *testing.T) {
	storagetest.Run(t, storagetest.Suite{
		New: func(t *testing.T) storage.Location {
			l, err := filesystem.New(t.TempDir())
			if err != nil {
				t.Fatal(err)
			}
			return l
		},
		BigSize: 16<<20 + 5,
		CheckClean: func(t *testing.T, loc storage.Location) {
			tmp := filepath.Join(loc.Describe(), ".tmp")
			entries, err := os.ReadDir(tmp)
			if err != nil {
				t.Fatal(err)
			}
			if len(entries) > 0 {
				t.Errorf("%s holds %d files after aborted uploads", tmp, len(entries))
			}
		},
	})
}

// TestFull fills a real 1 MiB tmpfs: the upload that does not fit fails
// with storage.ErrNoSpace, leaves nothing behind, and the backup stored
// before it is intact. Mounting needs root.
func TestFull(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("mounting a tmpfs needs root")
	}
	dir := t.TempDir()
	if out, err := exec.Command("mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", dir).CombinedOutput(); err != nil {
		t.Skipf("mount tmpfs: %v: %s", err, out)
	}
	t.Cleanup(func() {
		if out, err := exec.Command("umount", dir).CombinedOutput(); err != nil {
			t.Errorf("umount %s: %v: %s", dir, err, out)
		}
	})
	ctx := context.Background()
	loc, err := filesystem.New(dir)
	if err != nil {
		t.Fatal(err)
	}
	small := bytes.Repeat([]byte("a"), 100<<10)
	put := func(name string, data []byte) error {
		up, err := loc.Create(ctx, name)
		if err != nil {
			return err
		}
		if _, err := up.Write(data); err != nil {
			_ = up.Abort()
			return err
		}
		sum := sha256.Sum256(data)
		if err := up.Commit(ctx, &storage.Manifest{Name: name, Size: int64(len(data)), SHA256: hex.EncodeToString(sum[:])}); err != nil {
			_ = up.Abort()
			return err
		}
		return nil
	}
	if err := put("before", small); err != nil {
		t.Fatal(err)
	}
	err = put("big", bytes.Repeat([]byte("b"), 2<<20))
	if !errors.Is(err, storage.ErrNoSpace) || !strings.Contains(err.Error(), "no space left on device") {
		t.Fatalf("upload larger than the file system: %v, want storage.ErrNoSpace", err)
	}
	ms, err := loc.List(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(ms) != 1 || ms[0].Name != "before" {
		t.Fatalf("listed after the refused upload: %v", ms)
	}
	if entries, _ := os.ReadDir(filepath.Join(dir, ".tmp")); len(entries) > 0 {
		t.Errorf(".tmp holds %d files after the refused upload", len(entries))
	}
	r, _, err := loc.Open(ctx, "before", 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	got, err := io.ReadAll(r)
	r.Close()
	if err != nil || !bytes.Equal(got, small) {
		t.Fatalf("earlier backup after the refused upload: %d bytes, %v", len(got), err)
	}
	// The space is back: the next upload that fits succeeds.
	if err := put("after", small); err != nil {
		t.Fatalf("upload after the refused one: %v", err)
	}
}
