package snapshot

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"io"
	"os"
	"path/filepath"
	"testing"
)

func snapshotBytes(dbPages int) []byte {
	db := bytes.Repeat([]byte{0xab}, 512*dbPages)
	sum := sha256.Sum256(db)
	return append(db, sum[:]...)
}

func TestVerifierAcceptsAWholeSnapshot(t *testing.T) {
	snap := snapshotBytes(9)
	var progress int64
	v := NewVerifier(bytes.NewReader(snap), VerifierOptions{HashWhole: true, Progress: func(n int64) { progress = n }})
	got, err := io.ReadAll(v) // ReadAll treats io.EOF as success
	if err != nil || !bytes.Equal(got, snap) {
		t.Fatalf("err %v, %d bytes of %d", err, len(got), len(snap))
	}
	want := sha256.Sum256(snap)
	if v.Size() != int64(len(snap)) || v.SHA256() != hex.EncodeToString(want[:]) || progress != int64(len(snap)) {
		t.Fatalf("size %d digest %q progress %d", v.Size(), v.SHA256(), progress)
	}
}

// Read after the end says io.EOF again, as a reader must: io.ReadFull
// reads once more after a short last read (the fold's upload of a plain
// snapshot did, and the second check failed a good snapshot, found on the
// sandbox).
func TestVerifierReadAfterTheEnd(t *testing.T) {
	snap := snapshotBytes(9)
	v := NewVerifier(bytes.NewReader(snap), VerifierOptions{HashWhole: true})
	buf := make([]byte, 1000)
	var got []byte
	for range 2 * len(snap) / len(buf) {
		n, err := io.ReadFull(v, buf)
		got = append(got, buf[:n]...)
		if err != nil && !errors.Is(err, io.ErrUnexpectedEOF) && !errors.Is(err, io.EOF) {
			t.Fatalf("after %d bytes: %v", len(got), err)
		}
	}
	if !bytes.Equal(got, snap) || v.Err() != nil {
		t.Fatalf("read %d bytes of %d, verifier error %v", len(got), len(snap), v.Err())
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
		v := NewVerifier(bytes.NewReader(in), VerifierOptions{HashWhole: true})
		_, err := io.ReadAll(v)
		if !errors.Is(err, ErrCorrupt) || !errors.Is(v.Err(), ErrCorrupt) || v.SHA256() != "" {
			t.Errorf("%s: got %v (digest %q), want ErrCorrupt", name, err, v.SHA256())
		}
		path := filepath.Join(t.TempDir(), name)
		if err := os.WriteFile(path, in, 0o600); err != nil {
			t.Fatal(err)
		}
		if err := CheckTrailer(path); !errors.Is(err, ErrCorrupt) {
			t.Errorf("CheckTrailer %s: got %v, want ErrCorrupt", name, err)
		}
	}
}

// TrailerCheck.Hash is a SHA-256 of everything written, trailer
// included, whatever the writes' sizes, that leaves the check's verdict to
// Finish: the plugin's plain download hashes and checks in one pass.
func TestTrailerCheckHashIsTheWholeSHA256(t *testing.T) {
	snap := snapshotBytes(9)
	damaged := append([]byte(nil), snap...)
	damaged[1000] ^= 1
	for name, tc := range map[string]struct {
		in    []byte
		whole bool
	}{
		"whole": {snap, true}, "damaged": {damaged, false}, "no-trailer": {snap[:512*9], false},
	} {
		for _, step := range []int{1, 31, 32, 33, 4096, len(tc.in) + 1} {
			c := NewTrailerCheck()
			h := c.Hash()
			for i := 0; i < len(tc.in); i += step {
				h.Write(tc.in[i:min(i+step, len(tc.in))])
				if want := sha256.Sum256(tc.in[:min(i+step, len(tc.in))]); !bytes.Equal(h.Sum(nil), want[:]) {
					t.Fatalf("%s in writes of %d: Sum after %d bytes is not their SHA-256", name, step, min(i+step, len(tc.in)))
				}
			}
			want := sha256.Sum256(tc.in)
			digest, err := c.Finish()
			switch {
			case tc.whole && (err != nil || digest != hex.EncodeToString(want[:])):
				t.Errorf("%s in writes of %d: Finish = %q, %v; want the whole SHA-256", name, step, digest, err)
			case !tc.whole && !errors.Is(err, ErrCorrupt):
				t.Errorf("%s in writes of %d: Finish = %v, want ErrCorrupt", name, step, err)
			}
		}
	}
	c := NewTrailerCheck()
	h := c.Hash()
	h.Write([]byte("something else"))
	h.Reset()
	h.Write(snap)
	if _, err := c.Finish(); err != nil || h.Size() != sha256.Size || h.BlockSize() != sha256.BlockSize {
		t.Fatalf("after Reset: %v", err)
	}
}

func TestVerifierPassesReadErrorsOn(t *testing.T) {
	boom := errors.New("connection reset")
	v := NewVerifier(io.MultiReader(bytes.NewReader(snapshotBytes(1)[:100]), errReader{boom}), VerifierOptions{})
	if _, err := io.ReadAll(v); !errors.Is(err, boom) || errors.Is(err, ErrCorrupt) {
		t.Fatalf("got %v, want the read error and not ErrCorrupt", err)
	}
}

type errReader struct{ err error }

func (r errReader) Read([]byte) (int, error) { return 0, r.err }
