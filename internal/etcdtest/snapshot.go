package etcdtest

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"go.etcd.io/etcd/client/v3/snapshot"
	"go.uber.org/zap"
)

// snapshots holds the bytes of the snapshots made so far, by size asked:
// a test binary makes each size once.
var snapshots sync.Map // int → []byte

// SnapshotFile writes a real etcd snapshot of about size bytes (at least
// the ~25 KiB of an empty database) to path and returns its bytes: an
// etcd member filled with values under /fill/, saved with etcd's own
// client, so that etcd's trailer holds and bolt opens it. Each size is
// made once per test binary; later calls copy it.
func SnapshotFile(t testing.TB, path string, size int) []byte {
	t.Helper()
	if b, ok := snapshots.Load(size); ok {
		data := b.([]byte)
		if err := os.WriteFile(path, data, 0o600); err != nil {
			t.Fatal(err)
		}
		return data
	}
	// Large values for large snapshots: a few thousand puts fill a GiB.
	valueSize := 8 << 10
	if size >= 16<<20 {
		valueSize = 1 << 20
	}
	te := Start(t, false)
	c := te.Client(t)
	Fill(t, c, max(0, size-(24<<10))/(valueSize+256), valueSize)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	tmp := filepath.Join(t.TempDir(), "snapshot.db")
	if _, err := snapshot.SaveWithVersion(ctx, zap.NewNop(), te.Config(t), tmp); err != nil {
		t.Fatalf("save a snapshot of the test member: %v", err)
	}
	te.Stop()
	data, err := os.ReadFile(tmp)
	if err != nil {
		t.Fatal(err)
	}
	snapshots.Store(size, data)
	if err := os.WriteFile(path, data, 0o600); err != nil {
		t.Fatal(err)
	}
	return data
}

// TrailedBytes returns random bytes followed by their SHA-256, n bytes in
// all, as etcd ends a snapshot: they pass etcd's trailer check (n must be
// 32 more than a multiple of 512) but are no database. They serve tests of
// what checks only the trailer, such as the server's check of a plain
// upload; what opens the database needs SnapshotFile.
func TrailedBytes(t testing.TB, n int) []byte {
	t.Helper()
	if n < 32 || (n-32)%512 != 0 {
		t.Fatalf("TrailedBytes(%d): etcd's snapshots are 32 bytes more than a multiple of 512", n)
	}
	b := make([]byte, n)
	rand.Read(b[:n-32])
	sum := sha256.Sum256(b[:n-32])
	copy(b[n-32:], sum[:])
	return b
}

// TrailedSize is the size of TrailedBytes nearest above n.
func TrailedSize(n int) int {
	body := max(0, n-32)
	return (body+511)/512*512 + 32
}
