package backup

import (
	"context"
	"errors"
	"hash"
	"io"
	"sync"
)

// readAhead reads its source on a goroutine of its own, a few buffers
// ahead of its reader: etcd's stream, the trailer check and the hashes run
// while the upload sends the bytes before them, instead of in turn with
// it. Memory is bounded by depth buffers of size bytes.
type readAhead struct {
	full chan []byte // filled buffers, in order; closed after the last
	free chan []byte // buffers the reader is done with
	buf  []byte      // the buffer being read
	cur  []byte      // what is left of it

	mu     sync.Mutex
	srcErr error // what ended the source, io.EOF when it ended well

	stop context.CancelFunc
	done chan struct{} // closed when the goroutine returned
}

// newReadAhead starts reading r. sum, if set, is fed every byte read, on
// the reading goroutine. Close must be called; it waits for the
// goroutine, which ends when r ends or fails, or when ctx is done.
func newReadAhead(ctx context.Context, r io.Reader, sum hash.Hash, depth, size int) *readAhead {
	ctx, stop := context.WithCancel(ctx)
	a := &readAhead{
		full: make(chan []byte, depth),
		free: make(chan []byte, depth),
		stop: stop,
		done: make(chan struct{}),
	}
	for range depth {
		a.free <- make([]byte, size)
	}
	go a.run(ctx, r, sum)
	return a
}

func (a *readAhead) run(ctx context.Context, r io.Reader, sum hash.Hash) {
	defer close(a.done)
	defer close(a.full)
	for {
		var buf []byte
		select {
		case buf = <-a.free:
		case <-ctx.Done():
			a.setErr(ctx.Err())
			return
		}
		n, err := io.ReadFull(r, buf)
		if n > 0 {
			if sum != nil {
				sum.Write(buf[:n])
			}
			// full has room for every buffer: this never blocks.
			a.full <- buf[:n]
		}
		if errors.Is(err, io.ErrUnexpectedEOF) {
			err = io.EOF
		}
		if err != nil {
			a.setErr(err)
			return
		}
	}
}

func (a *readAhead) setErr(err error) {
	a.mu.Lock()
	a.srcErr = err
	a.mu.Unlock()
}

// sourceErr is the error that ended the source, nil while it runs or when
// it ended with io.EOF.
func (a *readAhead) sourceErr() error {
	a.mu.Lock()
	defer a.mu.Unlock()
	if errors.Is(a.srcErr, io.EOF) {
		return nil
	}
	return a.srcErr
}

// Read implements io.Reader. It returns io.EOF only when the source did.
func (a *readAhead) Read(p []byte) (int, error) {
	if len(a.cur) == 0 {
		buf, ok := <-a.full
		if !ok {
			// The goroutine set srcErr before it closed full.
			a.mu.Lock()
			defer a.mu.Unlock()
			return 0, a.srcErr
		}
		a.buf, a.cur = buf, buf
	}
	n := copy(p, a.cur)
	if a.cur = a.cur[n:]; len(a.cur) == 0 {
		a.free <- a.buf[:cap(a.buf)]
	}
	return n, nil
}

// Close stops reading ahead and waits for the goroutine. It does not
// close the source: a goroutine blocked in its Read ends when the context
// given to newReadAhead (or the source's own) is cancelled.
func (a *readAhead) Close() error {
	a.stop()
	<-a.done
	return nil
}
