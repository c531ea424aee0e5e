package snapshot

import (
	"errors"
	"fmt"
	"io"
)

// ErrTooLarge reports a backup whose plain snapshot would be larger than
// the size recorded when it was stored: a damaged or crafted compressed
// stream (a few kilobytes of zstd can expand to gigabytes). It is refused
// before the excess is written anywhere. Errors matching it also match
// ErrCorrupt, so callers that treat corruption as DataLoss need no change.
var ErrTooLarge = errors.New("the backup expands past its recorded size")

// TooLargeError is the error DecompressLimit and WritePlain return when
// the output would pass Limit bytes; it matches ErrTooLarge and ErrCorrupt.
type TooLargeError struct {
	Limit int64
}

func (e *TooLargeError) Error() string {
	return fmt.Sprintf("the backup expands past its recorded size of %d bytes and is refused", e.Limit)
}

// Is makes errors.Is(err, ErrTooLarge) and errors.Is(err, ErrCorrupt) true.
func (e *TooLargeError) Is(target error) bool { return target == ErrTooLarge || target == ErrCorrupt }

// limitReader passes at most max bytes of r through; once they are read it
// looks for one more byte and, if r has it, fails with a TooLargeError
// instead of io.EOF. Limiting the reader, not the writer, means the excess
// is never handed to anyone.
type limitReader struct {
	r    io.Reader
	left int64
	max  int64
}

// limit returns r limited to max bytes; max <= 0 is no limit (a backup
// recorded without its raw size: no etcd snapshot is empty).
func limit(r io.Reader, max int64) io.Reader {
	if max <= 0 {
		return r
	}
	return &limitReader{r: r, left: max, max: max}
}

func (l *limitReader) Read(p []byte) (int, error) {
	if len(p) == 0 {
		return 0, nil
	}
	if l.left > 0 {
		if int64(len(p)) > l.left {
			p = p[:l.left]
		}
		n, err := l.r.Read(p)
		l.left -= int64(n)
		return n, err
	}
	var one [1]byte
	for {
		n, err := l.r.Read(one[:])
		if n > 0 {
			return 0, &TooLargeError{Limit: l.max}
		}
		if err != nil {
			return 0, err
		}
	}
}
