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
	check    TrailerCheck
	whole    bool
	digest   string
	err      error
	// done: the stream ended and its trailer checked; later reads say
	// io.EOF again without checking twice (io.ReadFull, and readers
	// built on it, read once more after a short last read).
	done bool
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
	return &Verifier{r: r, progress: opts.Progress, check: *NewTrailerCheck(), whole: opts.HashWhole}
}

// Read implements io.Reader.
func (v *Verifier) Read(p []byte) (int, error) {
	if v.err != nil {
		return 0, v.err
	}
	if v.done {
		return 0, io.EOF
	}
	n, err := v.r.Read(p)
	if n > 0 {
		v.check.Write(p[:n])
		if v.progress != nil {
			v.progress(v.check.size)
		}
	}
	if errors.Is(err, io.EOF) {
		digest, cerr := v.check.Finish()
		if cerr != nil {
			v.err = cerr
			return n, v.err
		}
		if v.whole {
			v.digest = digest
		}
		v.done = true
		return n, io.EOF
	}
	if errors.Is(err, ErrTooLarge) {
		v.err = err // a verdict on the data, not a failed read
		return n, v.err
	}
	if err != nil {
		v.err = fmt.Errorf("reading the snapshot after %d bytes: %w", v.check.size, err)
		return n, v.err
	}
	return n, nil
}

// TrailerCheck is the write side of a Verifier: an io.Writer that checks
// etcd's trailer of everything written to it, and with the same single
// SHA-256 pass returns the SHA-256 of all of it (the database's hash state
// carried on through the trailer). The server uses it on an agent's
// snapshot stored as is, so that neither side hashes the bytes twice.
type TrailerCheck struct {
	sum  hash.Hash // of the database bytes (all but the trailer)
	tail []byte    // the last up-to-32 bytes seen, not yet in sum
	size int64
}

// NewTrailerCheck returns an empty TrailerCheck.
func NewTrailerCheck() *TrailerCheck {
	return &TrailerCheck{sum: sha256.New(), tail: make([]byte, 0, 2*trailerSize)}
}

// Write hashes all but the last 32 bytes seen so far and keeps those back:
// they may be the trailer. Only the held-back bytes are copied. It never
// fails.
func (c *TrailerCheck) Write(p []byte) (int, error) {
	c.size += int64(len(p))
	if len(p) >= trailerSize {
		c.sum.Write(c.tail)
		c.sum.Write(p[:len(p)-trailerSize])
		c.tail = append(c.tail[:0], p[len(p)-trailerSize:]...)
		return len(p), nil
	}
	c.tail = append(c.tail, p...)
	if over := len(c.tail) - trailerSize; over > 0 {
		c.sum.Write(c.tail[:over])
		c.tail = append(c.tail[:0], c.tail[over:]...)
	}
	return len(p), nil
}

// Finish checks that what was written is a whole bolt database followed
// by its SHA-256, and returns the hex SHA-256 of all of it. A failed check
// wraps ErrCorrupt. Nothing may be written after Finish.
func (c *TrailerCheck) Finish() (string, error) {
	if !ValidSize(c.size) {
		return "", fmt.Errorf("%w: it ended after %d bytes, not a whole database followed by its 32-byte SHA-256", ErrCorrupt, c.size)
	}
	// Sum leaves the state as it is: carried on through the trailer it is
	// the hash of the whole stream.
	if !bytes.Equal(c.sum.Sum(nil), c.tail) {
		return "", fmt.Errorf("%w: etcd's SHA-256 trailer does not match the database", ErrCorrupt)
	}
	c.sum.Write(c.tail)
	return hex.EncodeToString(c.sum.Sum(nil)), nil
}

// Hash is c as a hash.Hash, for a caller that takes one to hash what it
// writes (a download's SHA-256): what is written to it is written to c,
// and its Sum is the SHA-256 of everything written, trailer included —
// the one pass serves both. Finish still gives the trailer's verdict.
func (c *TrailerCheck) Hash() hash.Hash { return trailerHash{c} }

// trailerHash is TrailerCheck.Hash.
type trailerHash struct{ c *TrailerCheck }

func (h trailerHash) Write(p []byte) (int, error) { return h.c.Write(p) }

// Sum appends the SHA-256 of everything written so far to b, leaving the
// check's state as it is.
func (h trailerHash) Sum(b []byte) []byte {
	whole, err := h.c.sum.(hash.Cloner).Clone()
	if err != nil {
		panic(err) // crypto/sha256 clones
	}
	whole.Write(h.c.tail)
	return whole.Sum(b)
}

func (h trailerHash) Reset() {
	h.c.sum.Reset()
	h.c.tail = h.c.tail[:0]
	h.c.size = 0
}

func (trailerHash) Size() int      { return sha256.Size }
func (trailerHash) BlockSize() int { return sha256.BlockSize }

// Size is the number of bytes read so far.
func (v *Verifier) Size() int64 { return v.check.size }

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
