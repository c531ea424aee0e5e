package snapshot

import (
	"bytes"
	"context"
	"errors"
	"strings"
	"testing"

	ebv1 "github.com/kubectl-etcdbackup/kubectl-etcdbackup/api/etcdbackup/v1"
)

// A zstd bomb that records no raw size (stored before uploads had to say
// it) is still bounded: by the server's limits.maxRawSize in verify
// (DecompressBounded), by Form.MaxRawSize or DefaultMaxRawSize on the
// stored-backup path (WritePlain: download, restore), and the error says
// the backup records no size.
func TestZstdBombWithoutARecordedSizeIsBounded(t *testing.T) {
	const bound = 1 << 20
	stored := bomb(t, 64<<20)
	check := func(what string, err error, written int64) {
		t.Helper()
		var tl *TooLargeError
		if !errors.As(err, &tl) || !tl.Unrecorded || tl.Limit != bound || !errors.Is(err, ErrCorrupt) {
			t.Fatalf("%s: %v; want a TooLargeError of the %d-byte bound", what, err, bound)
		}
		if want := "records no raw size and expands past 1048576 bytes"; !strings.Contains(err.Error(), want) {
			t.Errorf("%s: %q does not say %q", what, err, want)
		}
		if written > bound {
			t.Errorf("%s: %d bytes written past the bound", what, written)
		}
	}
	var out counter
	_, err := DecompressBounded(context.Background(), &out, bytes.NewReader(stored), ebv1.CompressionZstd, 0, bound)
	check("DecompressBounded", err, out.n)
	out = counter{}
	_, err = WritePlain(context.Background(), &out, bytes.NewReader(stored), Form{Compression: ebv1.CompressionZstd, MaxRawSize: bound}, nil, nil)
	check("WritePlain", err, out.n)

	var tl *TooLargeError
	_, err = DecompressLimit(context.Background(), &counter{}, bytes.NewReader(bomb(t, 32<<20)), ebv1.CompressionZstd, 0)
	if err != nil && errors.As(err, &tl) {
		t.Fatalf("DecompressLimit without a recorded size refused 32 MiB under the default bound: %v", err)
	}
}

// A frame asking for a window past MaxZstdWindow is refused before the
// decoder allocates it (the library's default would accept 512 MiB).
func TestZstdWindowIsBounded(t *testing.T) {
	// A frame header declaring a 64 MiB window (descriptor exponent 16:
	// 2^(10+16)), then one raw block of one byte, last.
	frame := append(append([]byte{}, zstdMagic...), 0x00, 16<<3, 0x09, 0x00, 0x00, 'x')
	var buf bytes.Buffer
	buf.Write(frame)
	_, err := DecompressLimit(context.Background(), &counter{}, bytes.NewReader(buf.Bytes()), ebv1.CompressionZstd, 0)
	if !errors.Is(err, ErrCorrupt) || !strings.Contains(err.Error(), "window") {
		t.Fatalf("a 64 MiB window: %v; want ErrCorrupt naming the window", err)
	}
	_, err = WritePlain(context.Background(), &counter{}, bytes.NewReader(buf.Bytes()), Form{Compression: ebv1.CompressionZstd}, nil, nil)
	if !errors.Is(err, ErrCorrupt) || !strings.Contains(err.Error(), "window") {
		t.Fatalf("WritePlain, a 64 MiB window: %v; want ErrCorrupt naming the window", err)
	}
}
