package snapshot_test

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"io"
	"os"
	"path/filepath"
	"sync"
	"testing"

	"github.com/klauspost/compress/zstd"
	clientv3snapshot "go.etcd.io/etcd/client/v3/snapshot"
	"go.uber.org/zap"

	ebv1 "github.com/kubectl-etcdbackup/kubectl-etcdbackup/api/etcdbackup/v1"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/internal/etcdtest"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/snapshot"
)

var (
	realOnce sync.Once
	realSnap []byte
)

// realSnapshot is a snapshot of a real etcd with a few keys, made once
// per test binary: the seed every fuzz target here starts from.
func realSnapshot(f *testing.F) []byte {
	f.Helper()
	realOnce.Do(func() {
		te := etcdtest.Start(f, false)
		etcdtest.Fill(f, te.Client(f), 8, 64)
		path := filepath.Join(f.TempDir(), "snap.db")
		if _, err := clientv3snapshot.SaveWithVersion(context.Background(), zap.NewNop(), te.Config(f), path); err != nil {
			f.Fatal(err)
		}
		b, err := os.ReadFile(path)
		if err != nil {
			f.Fatal(err)
		}
		realSnap = b
	})
	if realSnap == nil {
		f.Fatal("no real snapshot (an earlier attempt failed)")
	}
	return realSnap
}

func zstdOf(f *testing.F, b []byte) []byte {
	f.Helper()
	enc, err := zstd.NewWriter(nil, zstd.WithEncoderConcurrency(1))
	if err != nil {
		f.Fatal(err)
	}
	defer enc.Close()
	return enc.EncodeAll(b, nil)
}

// withTrailer is db followed by etcd's trailer, its SHA-256.
func withTrailer(db []byte) []byte {
	sum := sha256.Sum256(db)
	return append(append([]byte(nil), db...), sum[:]...)
}

// trailerOK is the verdict the Verifier must reach, computed the slow way.
func trailerOK(data []byte) bool {
	if !snapshot.ValidSize(int64(len(data))) {
		return false
	}
	sum := sha256.Sum256(data[:len(data)-sha256.Size])
	return bytes.Equal(sum[:], data[len(data)-sha256.Size:])
}

// chunked returns at most n bytes per Read, so the Verifier's tail
// handling is exercised at every split.
type chunked struct {
	r io.Reader
	n int
}

func (c chunked) Read(p []byte) (int, error) { return c.r.Read(p[:min(len(p), c.n)]) }

// FuzzVerifier: the Verifier passes every byte through unchanged, never
// panics, and accepts a stream exactly when it is whole pages followed by
// their SHA-256 — random data never passes unless it really carries the
// right trailer. CheckTrailer, over a file, agrees.
func FuzzVerifier(f *testing.F) {
	real := realSnapshot(f)
	damaged := append([]byte(nil), real...)
	damaged[len(damaged)/2] ^= 1
	db := real[:len(real)-sha256.Size]
	f.Add(real, false, uint16(4096))
	f.Add(damaged, false, uint16(1))
	f.Add(real[:len(real)-1], false, uint16(512))
	f.Add(db, true, uint16(31))        // the fuzzer's own databases get a right trailer
	f.Add(db[:1000], true, uint16(33)) // not whole pages
	f.Add([]byte{}, true, uint16(0))   // SHA-256 of nothing: 32 bytes, valid
	f.Add(make([]byte, 32), false, uint16(7))
	f.Add([]byte{}, false, uint16(1))
	path := filepath.Join(f.TempDir(), "fuzz.db")
	f.Fuzz(func(t *testing.T, data []byte, addTrailer bool, chunk uint16) {
		if addTrailer {
			data = withTrailer(data)
		}
		want := trailerOK(data)
		v := snapshot.NewVerifier(chunked{bytes.NewReader(data), int(chunk%8192) + 1}, snapshot.VerifierOptions{HashWhole: true})
		got, err := io.ReadAll(v)
		if !bytes.Equal(got, data) || v.Size() != int64(len(data)) {
			t.Fatalf("the Verifier passed %d bytes (size %d) of %d, or changed them", len(got), v.Size(), len(data))
		}
		if want != (err == nil) {
			t.Fatalf("trailer valid: %v, but the Verifier said %v", want, err)
		}
		if err != nil && !errors.Is(err, snapshot.ErrCorrupt) {
			t.Fatalf("a bad stream's error does not wrap ErrCorrupt: %v", err)
		}
		if want {
			whole := sha256.Sum256(data)
			if v.SHA256() != hex.EncodeToString(whole[:]) {
				t.Fatalf("SHA256 %q, want the whole stream's", v.SHA256())
			}
		}
		if err := os.WriteFile(path, data, 0o600); err != nil {
			t.Fatal(err)
		}
		if err := snapshot.CheckTrailer(path); want != (err == nil) {
			t.Fatalf("trailer valid: %v, but CheckTrailer said %v", want, err)
		}
	})
}

// fuzzLimit bounds what one input may expand to: 1 MiB keeps each run
// fast and is far below what an unbounded decoder would write.
const fuzzLimit = 1 << 20

// counter counts what reaches it and keeps at most the limit's worth.
type counter struct {
	n   int64
	buf bytes.Buffer
}

func (c *counter) Write(p []byte) (int, error) {
	c.n += int64(len(p))
	if c.buf.Len() < fuzzLimit+1 {
		c.buf.Write(p[:min(len(p), fuzzLimit+1-c.buf.Len())])
	}
	return len(p), nil
}

// FuzzDecompress: for every compression, DecompressLimit and WritePlain on
// arbitrary stored bytes never panic, never write past the limit (the
// recorded raw size), and fail only with ErrCorrupt (a TooLargeError
// exactly at the limit); what WritePlain accepts is a verified snapshot.
func FuzzDecompress(f *testing.F) {
	real := realSnapshot(f)
	z := zstdOf(f, real)
	damaged := append([]byte(nil), z...)
	damaged[len(damaged)/2] ^= 0xff
	bomb := zstdOf(f, make([]byte, 8<<20)) // 8 MiB of zeros in a few hundred bytes
	f.Add(z, uint32(len(real)))
	f.Add(z, uint32(len(real)-1))
	f.Add(real, uint32(len(real)))
	f.Add(damaged, uint32(len(real)))
	f.Add(bomb, uint32(1<<20))
	f.Add(bomb, uint32(0))
	f.Add(z[:len(z)/2], uint32(len(real)))
	f.Add([]byte{}, uint32(1))
	f.Fuzz(func(t *testing.T, stored []byte, rawSize uint32) {
		max := int64(rawSize % fuzzLimit)
		if max == 0 {
			max = fuzzLimit
		}
		for _, c := range ebv1.Compressions {
			var out counter
			n, err := snapshot.DecompressLimit(context.Background(), &out, bytes.NewReader(stored), c, max)
			if out.n > max || n != out.n {
				t.Fatalf("%q: %d bytes written (reported %d), limit %d", c, out.n, n, max)
			}
			if err != nil && !errors.Is(err, snapshot.ErrCorrupt) {
				t.Fatalf("%q: error not ErrCorrupt: %v", c, err)
			}
			if errors.Is(err, snapshot.ErrTooLarge) && out.n != max {
				t.Fatalf("%q: refused as too large after %d bytes, limit %d", c, out.n, max)
			}
			if c == ebv1.CompressionNone && (err == nil) != (int64(len(stored)) <= max) {
				t.Fatalf("none: %d bytes, limit %d: %v", len(stored), max, err)
			}

			out = counter{}
			p, err := snapshot.WritePlain(context.Background(), &out, bytes.NewReader(stored), snapshot.Form{Compression: c, RawSize: max}, nil, nil)
			if out.n > max {
				t.Fatalf("%q: WritePlain wrote %d bytes, limit %d", c, out.n, max)
			}
			if err != nil && !errors.Is(err, snapshot.ErrCorrupt) {
				t.Fatalf("%q: WritePlain error not ErrCorrupt: %v", c, err)
			}
			if err == nil && (p.Size != max || !trailerOK(out.buf.Bytes())) {
				t.Fatalf("%q: WritePlain accepted %d bytes that are not a verified snapshot of %d", c, p.Size, max)
			}
		}
	})
}
