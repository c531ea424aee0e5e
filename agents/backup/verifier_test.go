package backup

import (
	"bytes"
	"crypto/sha256"
	"errors"
	"io"
	"testing"
)

func snapshotBytes(dbPages int) []byte {
	db := bytes.Repeat([]byte{0xab}, 512*dbPages)
	sum := sha256.Sum256(db)
	return append(db, sum[:]...)
}

func TestVerifierAcceptsAWholeSnapshot(t *testing.T) {
	snap := snapshotBytes(9)
	v := newVerifier(bytes.NewReader(snap), nil, true)
	got, err := io.ReadAll(v) // ReadAll treats io.EOF as success
	if err != nil || !bytes.Equal(got, snap) {
		t.Fatalf("err %v, %d bytes of %d", err, len(got), len(snap))
	}
	if v.size != int64(len(snap)) || v.digest == "" {
		t.Fatalf("size %d digest %q", v.size, v.digest)
	}
}

func TestVerifierRefusesShortOrDamagedStreams(t *testing.T) {
	snap := snapshotBytes(9)
	damaged := append([]byte(nil), snap...)
	damaged[1000] ^= 1
	for name, in := range map[string][]byte{
		"truncated":  snap[:len(snap)-512],
		"no-trailer": snap[:512*9],
		"damaged":    damaged,
		"empty":      nil,
	} {
		_, err := io.ReadAll(newVerifier(bytes.NewReader(in), nil, true))
		if !errors.Is(err, ErrCorruptSnapshot) {
			t.Errorf("%s: got %v, want ErrCorruptSnapshot", name, err)
		}
	}
}
