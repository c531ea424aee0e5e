package sandbox

import (
	"context"
	"errors"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// A second sandbox is refused, naming the first, or waits for it.
func TestMachineLock(t *testing.T) {
	// A lock of the test's own: a real sandbox of another package may hold
	// the machine's.
	old := lockPath
	lockPath = filepath.Join(t.TempDir(), "sandbox.lock")
	t.Cleanup(func() { lockPath = old })
	ctx := context.Background()
	logf := func(string, ...any) {}

	first, err := lockMachine(ctx, "/first/dir", false, logf)
	if err != nil {
		t.Fatal(err)
	}
	_, err = lockMachine(ctx, "/second/dir", false, logf)
	if !errors.Is(err, ErrBusy) || !strings.Contains(err.Error(), "/first/dir") {
		t.Fatalf("second lock without waiting: %v; want ErrBusy naming /first/dir", err)
	}
	released := make(chan struct{})
	go func() {
		time.Sleep(300 * time.Millisecond)
		first.release()
		close(released)
	}()
	var waited []string
	second, err := lockMachine(ctx, "/second/dir", true, func(f string, args ...any) { waited = append(waited, f) })
	if err != nil {
		t.Fatal(err)
	}
	<-released
	defer second.release()
	if len(waited) != 1 {
		t.Fatalf("the waiting sandbox said %d times that it waits, want once", len(waited))
	}
	if holder := readHolder(lockPath); !strings.Contains(holder, "/second/dir") {
		t.Fatalf("lock file names %q, want the second sandbox", holder)
	}
}
