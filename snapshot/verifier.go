package snapshot

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"hash"
	"io"
	"os"
)

// etcd writes a snapshot as a bolt database — whole 512-byte pages at the
// least — followed by the SHA-256 of those bytes.
const (
	trailerSize = sha256.Size
	pageSize    = 512
)

// ValidSize reports whether size bytes can be a bolt database followed by
// etcd's 32-byte trailer.
func ValidSize(size int64) bool {
	return size >= trailerSize && (size-trailerSize)%pageSize == 0
}

// Verifier passes a snapshot stream through unchanged and checks, at its
// end, that the last 32 bytes are the SHA-256 of everything before them —
// the trailer etcd appends. It returns io.EOF only if they are: a short or
// damaged stream ends in an error wrapping ErrCorrupt, so whatever consumes
// it (an upload, a restore) never takes a bad snapshot for a good one.
//
// It hashes each byte once: SHA-256 of the whole stream is the database's
// hash state carried on through the trailer, so HashWhole costs nothing.
type Verifier struct {
	r        io.Reader
	progress func(int64)
	sum      hash.Hash // of the database bytes (all but the trailer)
	whole    bool
	tail     []byte // the last up-to-32 bytes seen, not yet in sum
	size     int64
	digest   string
	err      error
}

// VerifierOptions tune a Verifier.
type VerifierOptions struct {
	// Progress, if set, is called with the bytes read so far.
	Progress func(n int64)
	// HashWhole also keeps the SHA-256 of the whole stream, trailer
	// included (SHA256 returns it), for callers that record it.
	HashWhole bool
}

// NewVerifier returns a Verifier reading r.
func NewVerifier(r io.Reader, opts VerifierOptions) *Verifier {
	return &Verifier{r: r, progress: opts.Progress, sum: sha256.New(), whole: opts.HashWhole, tail: make([]byte, 0, 2*trailerSize)}
}

// Read implements io.Reader.
func (v *Verifier) Read(p []byte) (int, error) {
	if v.err != nil {
		return 0, v.err
	}
	n, err := v.r.Read(p)
	if n > 0 {
		v.size += int64(n)
		v.hold(p[:n])
		if v.progress != nil {
			v.progress(v.size)
		}
	}
	if errors.Is(err, io.EOF) {
		if !ValidSize(v.size) {
			v.err = fmt.Errorf("%w: it ended after %d bytes, not a whole database followed by its 32-byte SHA-256", ErrCorrupt, v.size)
			return n, v.err
		}
		// Sum leaves the state as it is: carried on through the trailer
		// it is the hash of the whole stream.
		if !bytes.Equal(v.sum.Sum(nil), v.tail) {
			v.err = fmt.Errorf("%w: etcd's SHA-256 trailer does not match the database", ErrCorrupt)
			return n, v.err
		}
		if v.whole {
			v.sum.Write(v.tail)
			v.digest = hex.EncodeToString(v.sum.Sum(nil))
		}
		return n, io.EOF
	}
	if errors.Is(err, ErrTooLarge) {
		v.err = err // a verdict on the data, not a failed read
		return n, v.err
	}
	if err != nil {
		v.err = fmt.Errorf("reading the snapshot after %d bytes: %w", v.size, err)
		return n, v.err
	}
	return n, nil
}

// hold hashes all but the last 32 bytes seen so far and keeps those back:
// they may be the trailer. Only the held-back bytes are copied.
func (v *Verifier) hold(p []byte) {
	if len(p) >= trailerSize {
		v.sum.Write(v.tail)
		v.sum.Write(p[:len(p)-trailerSize])
		v.tail = append(v.tail[:0], p[len(p)-trailerSize:]...)
		return
	}
	v.tail = append(v.tail, p...)
	if over := len(v.tail) - trailerSize; over > 0 {
		v.sum.Write(v.tail[:over])
		v.tail = append(v.tail[:0], v.tail[over:]...)
	}
}

// Size is the number of bytes read so far.
func (v *Verifier) Size() int64 { return v.size }

// SHA256 is the hex SHA-256 of the whole stream once it ended verified,
// when HashWhole was asked for; "" otherwise.
func (v *Verifier) SHA256() string { return v.digest }

// Err is the error that ended the stream, if any: a corrupt snapshot wraps
// ErrCorrupt.
func (v *Verifier) Err() error { return v.err }

// CheckTrailer verifies etcd's trailer of the snapshot file at path.
func CheckTrailer(path string) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	_, err = io.Copy(io.Discard, NewVerifier(f, VerifierOptions{}))
	return err
}
