package rpc_test

import (
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"testing"

	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/internal/etcdtest"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/server/domain"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/server/metrics"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/storage"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/storage/locations"
)

func randomBytes(t testing.TB, n int) []byte {
	b := make([]byte, n)
	if _, err := rand.Read(b); err != nil {
		t.Fatal(err)
	}
	return b
}

// trailed returns random bytes of about n (rounded up to whole 512-byte
// pages) that end in their SHA-256, as etcd ends a snapshot: the server
// stores a plain upload only if it passes that check.
func trailed(t testing.TB, n int) []byte {
	return etcdtest.TrailedBytes(t, etcdtest.TrailedSize(n))
}

func sha(b []byte) string {
	s := sha256.Sum256(b)
	return hex.EncodeToString(s[:])
}

// oneLocation is the location set of a server with l as its one
// location, "default", its failures counted in m (nil: not counted).
func oneLocation(t testing.TB, l storage.Location, m *metrics.Metrics) *domain.Locations {
	t.Helper()
	locs, err := domain.NewLocations([]locations.Named{{Name: "default", Location: l}}, m)
	if err != nil {
		t.Fatal(err)
	}
	return locs
}
