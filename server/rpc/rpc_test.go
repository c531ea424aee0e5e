package rpc_test

import (
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"testing"

	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/internal/etcdtest"
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
