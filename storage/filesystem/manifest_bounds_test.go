package filesystem_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/storage"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/storage/filesystem"
)

// storedBackup puts a backup "b" in a new location and returns the
// location, its backups directory, and the manifest's bytes.
func storedBackup(t *testing.T) (*filesystem.Location, string, []byte) {
	t.Helper()
	dir := t.TempDir()
	loc, err := filesystem.New(dir)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	up, err := loc.Create(ctx, "b")
	if err != nil {
		t.Fatal(err)
	}
	data := []byte("the backup's data")
	if _, err := up.Write(data); err != nil {
		t.Fatal(err)
	}
	if err := up.Commit(ctx, &storage.Manifest{Name: "b", Size: int64(len(data)), SHA256: strings.Repeat("0", 64), CreateTime: time.Now()}); err != nil {
		t.Fatal(err)
	}
	backups := filepath.Join(dir, "backups")
	m, err := os.ReadFile(filepath.Join(backups, "b.json"))
	if err != nil {
		t.Fatal(err)
	}
	return loc, backups, m
}

// wantRefused checks that Stat, Open and List of "b" fail saying what,
// and not as a backup that is not there.
func wantRefused(t *testing.T, loc *filesystem.Location, what string) {
	t.Helper()
	ctx := context.Background()
	_, err := loc.Stat(ctx, "b")
	if err == nil || errors.Is(err, storage.ErrNotFound) || !strings.Contains(err.Error(), what) {
		t.Errorf("Stat: %v, want an error saying %q", err, what)
	}
	if r, _, err := loc.Open(ctx, "b", 0, 0); err == nil {
		r.Close()
		t.Errorf("Open accepted it")
	} else if !strings.Contains(err.Error(), what) {
		t.Errorf("Open: %v, want an error saying %q", err, what)
	}
	if _, err := loc.List(ctx); err == nil || !strings.Contains(err.Error(), what) {
		t.Errorf("List: %v, want an error saying %q", err, what)
	}
}

// A manifest over 1 MiB — valid JSON, padded — is refused, with a clear
// error, after reading no more than the bound; one at the bound reads.
func TestManifestOverTheBoundIsRefused(t *testing.T) {
	loc, backups, m := storedBackup(t)
	path := filepath.Join(backups, "b.json")
	pad := func(n int) []byte { return append(bytes.Repeat([]byte(" "), n-len(m)), m...) }
	if err := os.WriteFile(path, pad(1<<20), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := loc.Stat(context.Background(), "b"); err != nil {
		t.Fatalf("a manifest of exactly 1 MiB: %v", err)
	}
	if err := os.WriteFile(path, pad(1<<20+1), 0o600); err != nil {
		t.Fatal(err)
	}
	wantRefused(t, loc, "b.json is more than 1048576 bytes")
	// A far larger one costs no more.
	if err := os.WriteFile(path, pad(64<<20), 0o600); err != nil {
		t.Fatal(err)
	}
	var m0, m1 runtime.MemStats
	runtime.ReadMemStats(&m0)
	_, err := loc.Stat(context.Background(), "b")
	runtime.ReadMemStats(&m1)
	if err == nil {
		t.Fatal("a 64 MiB manifest was read")
	}
	if alloc := m1.TotalAlloc - m0.TotalAlloc; alloc > 4<<20 {
		t.Errorf("refusing a 64 MiB manifest allocated %d bytes", alloc)
	}
}

// A manifest or data file that is a symbolic link is not followed, even
// to a valid manifest or to data of the right size: a writer of the
// volume must not make the server serve another of its files (a token,
// a key) as a backup.
func TestSymlinksAreNotFollowed(t *testing.T) {
	link := func(t *testing.T, target, name string) {
		t.Helper()
		if err := os.Remove(name); err != nil {
			t.Fatal(err)
		}
		if err := os.Symlink(target, name); err != nil {
			if runtime.GOOS == "windows" {
				t.Skipf("no symbolic links here: %v", err)
			}
			t.Fatal(err)
		}
	}
	t.Run("manifest", func(t *testing.T) {
		loc, backups, m := storedBackup(t)
		elsewhere := filepath.Join(t.TempDir(), "manifest.json")
		if err := os.WriteFile(elsewhere, m, 0o600); err != nil {
			t.Fatal(err)
		}
		link(t, elsewhere, filepath.Join(backups, "b.json"))
		wantRefused(t, loc, "b.json is not a regular file")
	})
	t.Run("dangling manifest", func(t *testing.T) {
		loc, backups, _ := storedBackup(t)
		link(t, filepath.Join(t.TempDir(), "nothing"), filepath.Join(backups, "b.json"))
		wantRefused(t, loc, "b.json is not a regular file")
	})
	t.Run("data", func(t *testing.T) {
		loc, backups, _ := storedBackup(t)
		secret := filepath.Join(t.TempDir(), "token")
		if err := os.WriteFile(secret, []byte("a secret of 17 b."), 0o600); err != nil {
			t.Fatal(err)
		}
		link(t, secret, filepath.Join(backups, "b.db"))
		r, _, err := loc.Open(context.Background(), "b", 0, 0)
		if err == nil {
			b, _ := io.ReadAll(r)
			r.Close()
			t.Fatalf("Open followed the link and read %q", b)
		}
		if !strings.Contains(err.Error(), "b.db is not a regular file") {
			t.Fatalf("Open: %v", err)
		}
	})
	t.Run("directory", func(t *testing.T) {
		loc, backups, _ := storedBackup(t)
		path := filepath.Join(backups, "b.json")
		if err := os.Remove(path); err != nil {
			t.Fatal(err)
		}
		if err := os.Mkdir(path, 0o700); err != nil {
			t.Fatal(err)
		}
		// List skips directories; Stat and Open refuse one.
		if _, err := loc.Stat(context.Background(), "b"); err == nil || errors.Is(err, storage.ErrNotFound) {
			t.Fatalf("Stat of a directory manifest: %v", err)
		}
		if ms, err := loc.List(context.Background()); err != nil || len(ms) != 0 {
			b, _ := json.Marshal(ms)
			t.Fatalf("List: %s, %v", b, err)
		}
	})
}
