package snapshot

import (
	"context"
	"errors"
	"fmt"
	"io"

	"github.com/klauspost/compress/zstd"

	ebv1 "github.com/kubectl-etcdbackup/kubectl-etcdbackup/api/etcdbackup/v1"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/internal/ctxio"
)

// DecompressLimit copies r to w, undoing the backup's compression (one of
// ebv1.Compressions), and writes at most max bytes: a stream that would
// expand past them fails with a *TooLargeError (matching ErrTooLarge and
// ErrCorrupt) as soon as the first excess byte is decoded, with exactly
// max bytes written. Pass a backup's recorded raw size; max <= 0 (none
// recorded) bounds compressed data by DefaultMaxRawSize and leaves data
// stored as is unbounded. A damaged compressed stream wraps ErrCorrupt;
// an error of w or of r is returned as is. It stops when ctx is done.
func DecompressLimit(ctx context.Context, w io.Writer, r io.Reader, compression string, max int64) (int64, error) {
	return DecompressBounded(ctx, w, r, compression, max, 0)
}

// DecompressBounded is DecompressLimit whose bound on compressed data
// without a recorded raw size (recorded <= 0) is bound, not
// DefaultMaxRawSize: the server passes its limits.maxRawSize.
func DecompressBounded(ctx context.Context, w io.Writer, r io.Reader, compression string, recorded, bound int64) (int64, error) {
	if err := ebv1.ValidateCompression(compression); err != nil {
		return 0, err
	}
	src := &ctxio.Recorder{R: ctxio.NewReader(ctx, r)}
	var plain io.Reader = src
	if compression != ebv1.CompressionNone {
		dec, err := newZstdReader(src)
		if err != nil {
			return 0, err
		}
		defer dec.Close()
		plain = limitRaw(dec, recorded, bound)
	} else {
		plain = limit(plain, recorded)
	}
	out := &writeRecorder{w: w}
	n, err := io.Copy(out, plain)
	switch {
	case err == nil, out.err != nil, ctx.Err() != nil, errors.Is(err, ErrTooLarge), compression == ebv1.CompressionNone:
		return n, err
	case src.Err != nil && !errors.Is(src.Err, io.EOF):
		return n, src.Err // the source failed, not the data
	}
	return n, fmt.Errorf("%w: zstd: %v", ErrCorrupt, err)
}

// writeRecorder remembers w's first error, to tell it from the reader's.
type writeRecorder struct {
	w   io.Writer
	err error
}

func (r *writeRecorder) Write(p []byte) (int, error) {
	n, err := r.w.Write(p)
	if err != nil && r.err == nil {
		r.err = err
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
