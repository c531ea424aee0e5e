//go:build unix

package filesystem_test

import (
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"
)

// A manifest that is a FIFO is refused at once: reading it would wait
// for a writer that never comes, and hold List with it.
func TestFIFOManifestIsRefused(t *testing.T) {
	loc, backups, _ := storedBackup(t)
	path := filepath.Join(backups, "b.json")
	if err := os.Remove(path); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Mkfifo(path, 0o600); err != nil {
		t.Skipf("mkfifo: %v", err)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		wantRefused(t, loc, "b.json is not a regular file")
	}()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		// Unblock the open so the test can end.
		if f, err := os.OpenFile(path, os.O_WRONLY|syscall.O_NONBLOCK, 0); err == nil {
			f.Close()
		}
		<-done
		t.Fatal("reading a FIFO manifest blocked")
	}
}
