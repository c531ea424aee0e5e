package crypt

import (
	"bytes"
	"context"
	"crypto/rand"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"filippo.io/age"
)

func newKey(t testing.TB) (*age.X25519Identity, string) {
	t.Helper()
	id, err := age.GenerateX25519Identity()
	if err != nil {
		t.Fatal(err)
	}
	return id, id.Recipient().String()
}

func seal(t testing.TB, plain []byte, recipients ...string) []byte {
	t.Helper()
	recs, err := ParseRecipients(recipients)
	if err != nil {
		t.Fatal(err)
	}
	r, err := Encrypt(context.Background(), bytes.NewReader(plain), recs)
	if err != nil {
		t.Fatal(err)
	}
	b, err := io.ReadAll(r)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func TestRoundTripToSeveralRecipients(t *testing.T) {
	plain := make([]byte, 300<<10)
	rand.Read(plain)
	a, ra := newKey(t)
	b, rb := newKey(t)
	sealed := seal(t, plain, ra, rb)
	if !bytes.HasPrefix(sealed, Magic) || bytes.Contains(sealed, plain[:64]) {
		t.Fatal("not an age file, or plaintext visible")
	}
	for _, id := range []age.Identity{a, b} {
		r, err := Decrypt(bytes.NewReader(sealed), []age.Identity{id})
		if err != nil {
			t.Fatal(err)
		}
		got, err := io.ReadAll(r)
		if err != nil || !bytes.Equal(got, plain) {
			t.Fatalf("%d bytes, %v", len(got), err)
		}
	}
	h, err := ReadHeader(bytes.NewReader(sealed))
	if err != nil || len(h.StanzaTypes) != 2 || h.StanzaTypes[0] != "X25519" {
		t.Fatalf("header %+v %v", h, err)
	}
}

func TestDecryptRefusals(t *testing.T) {
	plain := bytes.Repeat([]byte("marker "), 40000)
	_, rcp := newKey(t)
	other, _ := newKey(t)
	sealed := seal(t, plain, rcp)

	if _, err := Decrypt(bytes.NewReader(sealed), nil); !errors.Is(err, ErrIdentityRequired) {
		t.Errorf("no identity: %v", err)
	}
	if _, err := Decrypt(bytes.NewReader(sealed), []age.Identity{other}); !errors.Is(err, ErrNoMatchingIdentity) {
		t.Errorf("wrong identity: %v", err)
	}
	if _, err := Decrypt(bytes.NewReader(plain), []age.Identity{other}); !errors.Is(err, ErrNotAge) {
		t.Errorf("not age: %v", err)
	}
	if _, err := ReadHeader(bytes.NewReader(plain)); !errors.Is(err, ErrNotAge) {
		t.Errorf("header of plain: %v", err)
	}
}

// Every byte of the header after age's first line, flipped, is tampering
// (never "not age", never accepted): which byte a damaged backup has is
// chance.
func TestDamagedHeaderIsTampered(t *testing.T) {
	id, rcp := newKey(t)
	sealed := seal(t, []byte("marker"), rcp)
	end := bytes.Index(sealed, []byte("\n---"))
	if end < 0 {
		t.Fatal("no header end in the sealed file")
	}
	end = end + 1 + bytes.IndexByte(sealed[end+1:], '\n')
	for i := len(ageIntro); i <= end; i++ {
		flipped := bytes.Clone(sealed)
		flipped[i] ^= 1
		r, err := Decrypt(bytes.NewReader(flipped), []age.Identity{id})
		if err == nil {
			_, err = io.ReadAll(r)
		}
		if !errors.Is(err, ErrTampered) && !errors.Is(err, ErrNoMatchingIdentity) {
			t.Fatalf("byte %d of the header flipped: %v, want ErrTampered", i, err)
		}
	}
}

func TestTamperedOrTruncatedCiphertextIsRefused(t *testing.T) {
	id, rcp := newKey(t)
	plain := bytes.Repeat([]byte{7}, 200<<10)
	sealed := seal(t, plain, rcp)
	flipped := bytes.Clone(sealed)
	flipped[len(flipped)-1000] ^= 1
	for name, in := range map[string][]byte{"flipped": flipped, "truncated": sealed[:len(sealed)-70000]} {
		r, err := Decrypt(bytes.NewReader(in), []age.Identity{id})
		if err == nil {
			_, err = io.Copy(io.Discard, r)
		}
		if !errors.Is(err, ErrTampered) {
			t.Errorf("%s: got %v, want ErrTampered", name, err)
		}
	}
}

func TestSourceErrorsPassThrough(t *testing.T) {
	id, rcp := newKey(t)
	sealed := seal(t, bytes.Repeat([]byte{1}, 200<<10), rcp)
	boom := errors.New("connection reset")
	r, err := Decrypt(io.MultiReader(bytes.NewReader(sealed[:100000]), errReader{boom}), []age.Identity{id})
	if err == nil {
		_, err = io.Copy(io.Discard, r)
	}
	if !errors.Is(err, boom) || errors.Is(err, ErrTampered) {
		t.Fatalf("got %v", err)
	}
}

type errReader struct{ err error }

func (e errReader) Read([]byte) (int, error) { return 0, e.err }

func TestRecipientParsingNeverEchoesSecrets(t *testing.T) {
	id, rcp := newKey(t)
	_, err := ParseRecipients([]string{rcp, id.String()})
	if err == nil || strings.Contains(err.Error(), id.String()) || !strings.Contains(err.Error(), "age-keygen -y") {
		t.Fatalf("got %v", err)
	}
	if _, err := ParseRecipients([]string{"age1notakey"}); err == nil {
		t.Fatal("bad key accepted")
	}
	if _, err := ParseRecipients(nil); err == nil {
		t.Fatal("no recipients accepted")
	}
	pq, err := age.GenerateHybridIdentity()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := ParseRecipients([]string{rcp, pq.Recipient().String()}); err == nil || !strings.Contains(err.Error(), "post-quantum") {
		t.Fatalf("mixed pq and classic: %v", err)
	}
}

func TestKeyFiles(t *testing.T) {
	dir := t.TempDir()
	id, rcp := newKey(t)
	os.WriteFile(filepath.Join(dir, "key.txt"), []byte("# created: now\n# public key: "+rcp+"\n"+id.String()+"\n"), 0o600)
	os.WriteFile(filepath.Join(dir, "..data"), []byte("ignored"), 0o600)
	ids, err := ReadIdentityDir(dir)
	if err != nil || len(ids) != 1 {
		t.Fatalf("%d %v", len(ids), err)
	}
	bad := filepath.Join(t.TempDir(), "bad.txt")
	os.WriteFile(bad, []byte("AGE-SECRET-KEY-1NOTVALIDBUTSECRETLOOKING\n"), 0o600)
	if _, err := ReadIdentityFiles(bad); err == nil || strings.Contains(err.Error(), "NOTVALID") || !strings.Contains(err.Error(), bad) {
		t.Fatalf("got %v", err)
	}
	rf := filepath.Join(t.TempDir(), "recipients.txt")
	os.WriteFile(rf, []byte("# ops\n"+rcp+"\n\n"), 0o600)
	if keys, err := ReadRecipientsFile(rf); err != nil || len(keys) != 1 || keys[0] != rcp {
		t.Fatalf("%v %v", keys, err)
	}
}
