package snapshot

import (
	"bytes"
	"context"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/klauspost/compress/zstd"

	ebv1 "github.com/kubectl-etcdbackup/kubectl-etcdbackup/api/etcdbackup/v1"
)

func TestCompressDecompressRoundTrip(t *testing.T) {
	snap := snapshotBytes(64)
	for _, c := range ebv1.Compressions {
		r, err := Compress(context.Background(), bytes.NewReader(snap), c)
		if err != nil {
			t.Fatal(err)
		}
		stored, err := io.ReadAll(r)
		r.Close()
		if err != nil {
			t.Fatal(err)
		}
		if c == ebv1.CompressionZstd && (len(stored) >= len(snap) || !bytes.HasPrefix(stored, zstdMagic)) {
			t.Errorf("zstd: %d bytes from %d, not compressed", len(stored), len(snap))
		}
		var out bytes.Buffer
		n, err := DecompressLimit(context.Background(), &out, bytes.NewReader(stored), c, 0)
		if err != nil || n != int64(len(snap)) || !bytes.Equal(out.Bytes(), snap) {
			t.Fatalf("%q: %d bytes, %v", c, n, err)
		}
	}
}

func TestUnknownCompressionIsRefused(t *testing.T) {
	_, err := DecompressLimit(context.Background(), io.Discard, strings.NewReader("x"), "gzip", 0)
	if err == nil || !strings.Contains(err.Error(), `"gzip" is not supported`) || !strings.Contains(err.Error(), "zstd") {
		t.Fatalf("got %v", err)
	}
	if _, err := Compress(context.Background(), strings.NewReader("x"), "lz4"); err == nil {
		t.Fatal("lz4 accepted")
	}
}

func TestDamagedZstdIsCorrupt(t *testing.T) {
	var buf bytes.Buffer
	enc, _ := zstd.NewWriter(&buf)
	enc.Write(snapshotBytes(64))
	enc.Close()
	b := buf.Bytes()
	b[len(b)/2] ^= 0xff
	_, err := DecompressLimit(context.Background(), io.Discard, bytes.NewReader(b), ebv1.CompressionZstd, 0)
	if !errors.Is(err, ErrCorrupt) {
		t.Fatalf("got %v, want ErrCorrupt", err)
	}
}

func TestDecompressStopsWithItsContext(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	_, err := DecompressLimit(ctx, io.Discard, bytes.NewReader(snapshotBytes(4)), ebv1.CompressionNone, 0)
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("got %v", err)
	}
}

func TestUnpackOnlyTouchesCompressedFiles(t *testing.T) {
	dir := t.TempDir()
	snap := snapshotBytes(8)
	plain := filepath.Join(dir, "plain.db")
	os.WriteFile(plain, snap, 0o600)
	if got, err := Unpack(context.Background(), plain, dir); err != nil || got != plain {
		t.Fatalf("plain: %s %v", got, err)
	}
	r, _ := Compress(context.Background(), bytes.NewReader(snap), ebv1.CompressionZstd)
	z, _ := io.ReadAll(r)
	packed := filepath.Join(dir, "packed.zst")
	os.WriteFile(packed, z, 0o600)
	got, err := Unpack(context.Background(), packed, dir)
	if err != nil || got == packed {
		t.Fatalf("zstd: %s %v", got, err)
	}
	if b, _ := os.ReadFile(got); !bytes.Equal(b, snap) {
		t.Fatal("unpacked bytes differ")
	}
}
