package snapshot

import (
	"errors"
	"fmt"
	"io"

	"github.com/klauspost/compress/zstd"
)

// ErrTooLarge reports a backup whose plain snapshot would be larger than
// the size recorded when it was stored: a damaged or crafted compressed
// stream (a few kilobytes of zstd can expand to gigabytes). It is refused
// before the excess is written anywhere. Errors matching it also match
// ErrCorrupt, so callers that treat corruption as DataLoss need no change.
var ErrTooLarge = errors.New("the backup expands past its recorded size")

// DefaultMaxRawSize bounds what a backup that records no raw size may
// unpack to: 16 GiB, twice etcd's suggested maximum database size
// (--quota-backend-bytes, 8 GiB) and below the 20 GiB scratch volumes
// the server and agents unpack into. The server's limits.maxRawSize
// (same default) refuses uploads over it, and compressed or encrypted
// uploads without a raw size, so only a backup stored before that rule
// lacks one.
const DefaultMaxRawSize = 16 << 30

// MaxZstdWindow is the largest zstd window a decoder accepts: 16 MiB,
// twice the 8 MiB window of the encoder backups are compressed with
// (and of the zstd CLI up to level 19). The library's default, 512 MiB,
// would let a crafted frame make each decoder allocate that much.
const MaxZstdWindow = 16 << 20

// TooLargeError is the error DecompressLimit and WritePlain return when
// the output would pass Limit bytes; it matches ErrTooLarge and ErrCorrupt.
type TooLargeError struct {
	Limit int64
	// Unrecorded is set when Limit is not the backup's recorded raw
	// size (it records none) but a bound on backups without one.
	Unrecorded bool
}

func (e *TooLargeError) Error() string {
	if e.Unrecorded {
		return fmt.Sprintf("the backup records no raw size and expands past %d bytes, the most one without a recorded size may unpack to; it is refused", e.Limit)
	}
	return fmt.Sprintf("the backup expands past its recorded size of %d bytes and is refused", e.Limit)
}

// Is makes errors.Is(err, ErrTooLarge) and errors.Is(err, ErrCorrupt) true.
func (e *TooLargeError) Is(target error) bool { return target == ErrTooLarge || target == ErrCorrupt }

// limitReader passes at most max bytes of r through; once they are read it
// looks for one more byte and, if r has it, fails with a TooLargeError
// instead of io.EOF. Limiting the reader, not the writer, means the excess
// is never handed to anyone.
type limitReader struct {
	r          io.Reader
	left       int64
	max        int64
	unrecorded bool
}

// limit returns r limited to max bytes; max <= 0 is no limit.
func limit(r io.Reader, max int64) io.Reader {
	if max <= 0 {
		return r
	}
	return &limitReader{r: r, left: max, max: max}
}

// limitRaw returns r limited to a backup's recorded raw size, or, when
// none is recorded (0: no etcd snapshot is empty), to bound
// (DefaultMaxRawSize when bound <= 0), with an error that says which.
func limitRaw(r io.Reader, recorded, bound int64) io.Reader {
	if recorded > 0 {
		return limit(r, recorded)
	}
	if bound <= 0 {
		bound = DefaultMaxRawSize
	}
	return &limitReader{r: r, left: bound, max: bound, unrecorded: true}
}

// newZstdReader is the one zstd decoder of backups: one goroutine, low
// memory, and a window of at most MaxZstdWindow.
func newZstdReader(r io.Reader) (*zstd.Decoder, error) {
	return zstd.NewReader(r, zstd.WithDecoderConcurrency(1), zstd.WithDecoderLowmem(true),
		zstd.WithDecoderMaxWindow(MaxZstdWindow), zstd.WithDecoderMaxMemory(MaxZstdWindow))
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
			return 0, &TooLargeError{Limit: l.max, Unrecorded: l.unrecorded}
		}
		if err != nil {
			return 0, err
		}
	}
}
