package backup

import (
	"bytes"
	"context"
	"crypto/sha256"
	"errors"
	"io"
	"math/rand/v2"
	"testing"
	"testing/iotest"
)

// What comes out of the read-ahead is what went in, in order, and the
// hash it kept on its own goroutine is that of those bytes.
func TestReadAheadPassesBytesAndHashes(t *testing.T) {
	data := make([]byte, 10<<20+12345)
	_, _ = rand.NewChaCha8([32]byte{1}).Read(data)
	sum := sha256.New()
	a := newReadAhead(context.Background(), iotest.HalfReader(bytes.NewReader(data)), sum, 3, 1<<20)
	defer a.Close()
	got, err := io.ReadAll(iotest.OneByteReader(io.LimitReader(a, 100)))
	if err != nil {
		t.Fatal(err)
	}
	rest, err := io.ReadAll(a)
	if err != nil {
		t.Fatal(err)
	}
	got = append(got, rest...)
	if !bytes.Equal(got, data) {
		t.Fatalf("read %d bytes, not the %d written", len(got), len(data))
	}
	if want := sha256.Sum256(data); !bytes.Equal(sum.Sum(nil), want[:]) {
		t.Fatal("the read-ahead's hash is not that of the data")
	}
	if err := a.sourceErr(); err != nil {
		t.Fatalf("sourceErr after a clean end: %v", err)
	}
}

// A failing source fails the reader after the bytes before the failure,
// and sourceErr names it.
func TestReadAheadPassesTheSourceErrorOn(t *testing.T) {
	boom := errors.New("etcd went away")
	a := newReadAhead(context.Background(), io.MultiReader(bytes.NewReader(make([]byte, 3000)), iotest.ErrReader(boom)), nil, 2, 1024)
	defer a.Close()
	got, err := io.ReadAll(a)
	if !errors.Is(err, boom) || len(got) != 3000 {
		t.Fatalf("read %d bytes, err %v; want 3000 then %v", len(got), err, boom)
	}
	if !errors.Is(a.sourceErr(), boom) {
		t.Fatalf("sourceErr %v", a.sourceErr())
	}
}

// Close returns when nobody reads any more, and the source is not read
// further than the buffers allow.
func TestReadAheadCloseStopsReading(t *testing.T) {
	src := &countingReader{}
	a := newReadAhead(context.Background(), src, nil, 2, 1024)
	if _, err := a.Read(make([]byte, 10)); err != nil {
		t.Fatal(err)
	}
	a.Close()
	if src.n > 3*1024 {
		t.Fatalf("read %d bytes ahead with two 1 KiB buffers", src.n)
	}
}

type countingReader struct{ n int }

func (r *countingReader) Read(p []byte) (int, error) {
	r.n += len(p)
	return len(p), nil
}
