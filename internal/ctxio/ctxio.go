// Package ctxio adapts io.Readers for long copies: a reader that stops when
// its context is done (io.Copy itself never looks at a context), and one
// that remembers the error of the reader under it, so a layer above (age,
// zstd) that turns every failure into its own error can be told apart from
// a failing source.
package ctxio

import (
	"context"
	"io"
)

// NewReader returns a reader of r that fails with ctx's error once ctx is
// done.
func NewReader(ctx context.Context, r io.Reader) io.Reader { return reader{ctx, r} }

type reader struct {
	ctx context.Context
	r   io.Reader
}

func (r reader) Read(p []byte) (int, error) {
	if err := r.ctx.Err(); err != nil {
		return 0, err
	}
	return r.r.Read(p)
}

// Recorder reads R and remembers the first error it returned.
type Recorder struct {
	R   io.Reader
	Err error
}

// Read implements io.Reader.
func (s *Recorder) Read(p []byte) (int, error) {
	n, err := s.R.Read(p)
	if err != nil && s.Err == nil {
		s.Err = err
	}
	return n, err
}
