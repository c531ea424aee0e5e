package snapshot

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"io"
	"os"
	"path/filepath"
	"testing"

	"filippo.io/age"

	ebv1 "github.com/kubectl-etcdbackup/kubectl-etcdbackup/api/etcdbackup/v1"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/crypt"
)

// store makes the stored form of snap as the backup agent does:
// compress, then encrypt.
func store(t *testing.T, snap []byte, f Form, rcp age.Recipient) []byte {
	t.Helper()
	r, err := Compress(context.Background(), bytes.NewReader(snap), f.Compression)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	var body io.Reader = r
	if f.Encryption == ebv1.EncryptionAge {
		if body, err = crypt.Encrypt(context.Background(), r, []age.Recipient{rcp}); err != nil {
			t.Fatal(err)
		}
	}
	b, err := io.ReadAll(body)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func TestWritePlainUndoesEveryForm(t *testing.T) {
	snap := snapshotBytes(300)
	sum := sha256.Sum256(snap)
	id, _ := age.GenerateX25519Identity()
	other, _ := age.GenerateX25519Identity()
	dir := t.TempDir()
	for _, c := range ebv1.Compressions {
		for _, e := range []string{ebv1.EncryptionNone, ebv1.EncryptionAge} {
			f := Form{Compression: c, Encryption: e, RawSize: int64(len(snap)), RawSHA256: hex.EncodeToString(sum[:])}
			stored := store(t, snap, f, id.Recipient())
			var out bytes.Buffer
			p, err := WritePlain(context.Background(), &out, bytes.NewReader(stored), f, []age.Identity{other, id}, nil)
			if err != nil || !bytes.Equal(out.Bytes(), snap) || p.SHA256 != f.RawSHA256 {
				t.Fatalf("%q/%q: %v", c, e, err)
			}
			// A recorded SHA-256 that does not match is corruption.
			bad := f
			bad.RawSHA256 = hex.EncodeToString(make([]byte, 32))
			if _, err := WritePlain(context.Background(), io.Discard, bytes.NewReader(stored), bad, []age.Identity{id}, nil); !errors.Is(err, ErrCorrupt) {
				t.Errorf("%q/%q wrong raw sha: %v", c, e, err)
			}
			// Unpack recognises the form of a raw download by itself.
			file := filepath.Join(dir, "stored-"+c+e)
			os.WriteFile(file, stored, 0o600)
			got, err := UnpackWith(context.Background(), file, dir, []age.Identity{id})
			if err != nil {
				t.Fatalf("unpack %q/%q: %v", c, e, err)
			}
			if b, _ := os.ReadFile(got); !bytes.Equal(b, snap) {
				t.Fatalf("unpack %q/%q: wrong bytes", c, e)
			}
			if e == ebv1.EncryptionAge {
				if _, err := Unpack(context.Background(), file, dir); !errors.Is(err, crypt.ErrIdentityRequired) {
					t.Errorf("unpack without identity: %v", err)
				}
			}
		}
	}
}

func TestWritePlainRefusesBeforeWriting(t *testing.T) {
	snap := snapshotBytes(300)
	id, _ := age.GenerateX25519Identity()
	other, _ := age.GenerateX25519Identity()
	f := Form{Compression: ebv1.CompressionZstd, Encryption: ebv1.EncryptionAge}
	stored := store(t, snap, f, id.Recipient())
	for name, ids := range map[string][]age.Identity{"none": nil, "wrong": {other}} {
		var out bytes.Buffer
		_, err := WritePlain(context.Background(), &out, bytes.NewReader(stored), f, ids, nil)
		if err == nil || out.Len() != 0 || errors.Is(err, ErrCorrupt) {
			t.Errorf("%s: %v, %d bytes written", name, err, out.Len())
		}
	}
	flipped := bytes.Clone(stored)
	flipped[len(flipped)/2] ^= 1
	dst := filepath.Join(t.TempDir(), "out.db")
	if _, err := WritePlainFile(context.Background(), dst, bytes.NewReader(flipped), f, []age.Identity{id}, nil); !errors.Is(err, ErrCorrupt) || !errors.Is(err, crypt.ErrTampered) {
		t.Fatalf("flipped: %v", err)
	}
	if _, err := os.Stat(dst); !errors.Is(err, os.ErrNotExist) {
		t.Fatal("output left behind")
	}
}
