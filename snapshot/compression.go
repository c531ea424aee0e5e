package snapshot

import (
	"context"
	"fmt"
	"io"

	"github.com/klauspost/compress/zstd"

	ebv1 "github.com/kubectl-etcdbackup/kubectl-etcdbackup/api/etcdbackup/v1"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/internal/ctxio"
)

// Decompress copies r to w, undoing the backup's compression (one of
// ebv1.Compressions). A damaged compressed stream wraps ErrCorrupt. It
// stops when ctx is done.
func Decompress(ctx context.Context, w io.Writer, r io.Reader, compression string) (int64, error) {
	if err := ebv1.ValidateCompression(compression); err != nil {
		return 0, err
	}
	r = ctxio.NewReader(ctx, r)
	if compression == ebv1.CompressionNone {
		return io.Copy(w, r)
	}
	dec, err := zstd.NewReader(r, zstd.WithDecoderConcurrency(1), zstd.WithDecoderLowmem(true))
	if err != nil {
		return 0, err
	}
	defer dec.Close()
	n, err := io.Copy(w, dec)
	if err != nil && ctx.Err() == nil {
		return n, fmt.Errorf("%w: zstd: %v", ErrCorrupt, err)
	}
	return n, err
}

// Compress returns a reader of r's bytes in the given compression (one of
// ebv1.Compressions; none returns r itself, wrapped). The encoder runs in a
// goroutine that ends when r ends or fails, when ctx is done, or when the
// returned reader is closed — the caller must close it.
func Compress(ctx context.Context, r io.Reader, compression string) (io.ReadCloser, error) {
	if err := ebv1.ValidateCompression(compression); err != nil {
		return nil, err
	}
	if compression == ebv1.CompressionNone {
		return io.NopCloser(ctxio.NewReader(ctx, r)), nil
	}
	pr, pw := io.Pipe()
	go func() {
		enc, err := zstd.NewWriter(pw, zstd.WithEncoderConcurrency(1))
		if err != nil {
			pw.CloseWithError(err)
			return
		}
		_, err = io.Copy(enc, ctxio.NewReader(ctx, r))
		if cerr := enc.Close(); err == nil {
			err = cerr
		}
		pw.CloseWithError(err) // nil closes with io.EOF
	}()
	return pr, nil
}

// zstdMagic starts every zstd frame.
var zstdMagic = []byte{0x28, 0xb5, 0x2f, 0xfd}
