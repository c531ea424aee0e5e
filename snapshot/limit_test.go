package snapshot

import (
	"bytes"
	"context"
	"errors"
	"io"
	"strings"
	"testing"

	"filippo.io/age"
	"github.com/klauspost/compress/zstd"

	ebv1 "github.com/kubectl-etcdbackup/kubectl-etcdbackup/api/etcdbackup/v1"
)

// zeros reads as an endless run of zero bytes.
type zeros struct{}

func (zeros) Read(p []byte) (int, error) { clear(p); return len(p), nil }

// bomb is a zstd stream of n zero bytes: a few kilobytes that expand to n.
func bomb(t *testing.T, n int64) []byte {
	t.Helper()
	var buf bytes.Buffer
	enc, err := zstd.NewWriter(&buf, zstd.WithEncoderConcurrency(1))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := io.Copy(enc, io.LimitReader(zeros{}, n)); err != nil {
		t.Fatal(err)
	}
	if err := enc.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

// counter counts what reaches it.
type counter struct{ n int64 }

func (c *counter) Write(p []byte) (int, error) { c.n += int64(len(p)); return len(p), nil }

func checkTooLarge(t *testing.T, what string, err error, written, recorded int64) {
	t.Helper()
	var tl *TooLargeError
	if !errors.Is(err, ErrTooLarge) || !errors.Is(err, ErrCorrupt) || !errors.As(err, &tl) || tl.Limit != recorded {
		t.Fatalf("%s: got %v, want a TooLargeError of %d bytes", what, err, recorded)
	}
	if want := "expands past its recorded size of 1048576 bytes and is refused"; !strings.Contains(err.Error(), want) {
		t.Errorf("%s: %q does not say %q", what, err, want)
	}
	if written > recorded {
		t.Errorf("%s: %d bytes written past the recorded %d", what, written, recorded)
	}
}

// A crafted zstd backup — 64 MiB of zeros in a few kilobytes — recorded as
// 1 MiB is refused after at most 1 MiB is written, by DecompressLimit (the
// server's verify) and by WritePlain (restores).
func TestZstdBombIsRefusedAtItsRecordedSize(t *testing.T) {
	const recorded = 1 << 20
	stored := bomb(t, 64<<20)
	if len(stored) > 64<<10 {
		t.Fatalf("the crafted stream is %d bytes, not a bomb", len(stored))
	}
	var out counter
	n, err := DecompressLimit(context.Background(), &out, bytes.NewReader(stored), ebv1.CompressionZstd, recorded)
	checkTooLarge(t, "DecompressLimit", err, out.n, recorded)
	if n != out.n {
		t.Errorf("DecompressLimit says %d bytes, %d were written", n, out.n)
	}

	out = counter{}
	_, err = WritePlain(context.Background(), &out, bytes.NewReader(stored), Form{Compression: ebv1.CompressionZstd, RawSize: recorded}, nil, nil)
	checkTooLarge(t, "WritePlain", err, out.n, recorded)

	// Under encryption too: the limit is on the plain snapshot.
	id, _ := age.GenerateX25519Identity()
	f := Form{Compression: ebv1.CompressionZstd, Encryption: ebv1.EncryptionAge, RawSize: recorded}
	enc := store(t, make([]byte, 4<<20), f, id.Recipient())
	out = counter{}
	_, err = WritePlain(context.Background(), &out, bytes.NewReader(enc), f, []age.Identity{id}, nil)
	checkTooLarge(t, "WritePlain age", err, out.n, recorded)
}

func TestUncompressedPastItsRecordedSizeIsRefused(t *testing.T) {
	const recorded = 1 << 20
	var out counter
	_, err := DecompressLimit(context.Background(), &out, io.LimitReader(zeros{}, 2<<20), ebv1.CompressionNone, recorded)
	checkTooLarge(t, "DecompressLimit", err, out.n, recorded)
	out = counter{}
	_, err = WritePlain(context.Background(), &out, io.LimitReader(zeros{}, 2<<20), Form{RawSize: recorded}, nil, nil)
	checkTooLarge(t, "WritePlain", err, out.n, recorded)
}

// Exactly the recorded size passes, and no limit means none.
func TestDecompressLimitAllowsTheRecordedSize(t *testing.T) {
	snap := snapshotBytes(64)
	for _, c := range ebv1.Compressions {
		r, err := Compress(context.Background(), bytes.NewReader(snap), c)
		if err != nil {
			t.Fatal(err)
		}
		stored, _ := io.ReadAll(r)
		r.Close()
		for _, max := range []int64{int64(len(snap)), 0} {
			var out bytes.Buffer
			n, err := DecompressLimit(context.Background(), &out, bytes.NewReader(stored), c, max)
			if err != nil || n != int64(len(snap)) || !bytes.Equal(out.Bytes(), snap) {
				t.Fatalf("%q, limit %d: %d bytes, %v", c, max, n, err)
			}
		}
		if _, err := DecompressLimit(context.Background(), io.Discard, bytes.NewReader(stored), c, int64(len(snap))-1); !errors.Is(err, ErrTooLarge) {
			t.Errorf("%q one byte over: %v", c, err)
		}
	}
}

// A failing writer or source is not the data's fault: not ErrCorrupt.
func TestDecompressLimitTellsIOErrorsFromCorruption(t *testing.T) {
	boom := errors.New("boom")
	r, _ := Compress(context.Background(), bytes.NewReader(snapshotBytes(64)), ebv1.CompressionZstd)
	stored, _ := io.ReadAll(r)
	r.Close()
	if _, err := DecompressLimit(context.Background(), failWriter{boom}, bytes.NewReader(stored), ebv1.CompressionZstd, 0); !errors.Is(err, boom) || errors.Is(err, ErrCorrupt) {
		t.Errorf("writer: %v", err)
	}
	src := io.MultiReader(bytes.NewReader(stored[:len(stored)/2]), failReader{boom})
	if _, err := DecompressLimit(context.Background(), io.Discard, src, ebv1.CompressionZstd, 0); !errors.Is(err, boom) || errors.Is(err, ErrCorrupt) {
		t.Errorf("source: %v", err)
	}
}

type failWriter struct{ err error }

func (f failWriter) Write([]byte) (int, error) { return 0, f.err }

type failReader struct{ err error }

func (f failReader) Read([]byte) (int, error) { return 0, f.err }
