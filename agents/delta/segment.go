package delta

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"

	"filippo.io/age"
	"go.etcd.io/etcd/api/v3/mvccpb"

	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/crypt"
	deltafmt "github.com/kubectl-etcdbackup/kubectl-etcdbackup/delta"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/snapshot"
)

// Segment is one finished segment, encoded as it is stored.
type Segment struct {
	// Name is <chain>.delta-<first revision>.
	Name string
	// Summary is what the segment holds (the upload's DeltaSegment).
	Summary deltafmt.Summary
	// Body is what is stored: the plain segment compressed with
	// Compression, then encrypted to AgeRecipients when there are any.
	Body []byte
	// Compression is one of ebv1.Compressions.
	Compression string
	// AgeRecipients are the age public keys Body is encrypted to; none:
	// Body is not encrypted.
	AgeRecipients []string
	// RawSize and RawSHA256 describe the plain segment.
	RawSize   int64
	RawSHA256 string
	// LastEvent is the first event of the segment's newest revision (nil
	// when it holds none).
	LastEvent *Event
	// HistoryBreak says the chain ends (Summary.EndReason) because etcd's
	// history changed under it.
	HistoryBreak bool
	// AuthRevision is etcd's auth revision as the segment is stored (0:
	// unknown): changes of users and roles are not in the watch stream.
	AuthRevision uint64
}

// SegmentName is the name of the segment of chain that starts at first.
func SegmentName(chain string, first int64) string {
	return fmt.Sprintf("%s.delta-%d", chain, first)
}

// filling is the segment being filled: its plain bytes, and the leases
// it recorded already (each lease is recorded once per segment, so that
// every segment replays on its own).
type filling struct {
	buf    bytes.Buffer
	w      *deltafmt.Writer
	leases map[int64]bool
	// last is the first event of the newest revision added.
	last *mvccpb.Event
	// first is the segment's first revision.
	first int64
}

func newFilling(h deltafmt.Header) (*filling, error) {
	f := &filling{leases: map[int64]bool{}, first: h.FirstRevision}
	w, err := deltafmt.NewWriter(&f.buf, h)
	if err != nil {
		return nil, err
	}
	f.w = w
	return f, nil
}

// size is the plain segment's size so far.
func (f *filling) size() int64 { return int64(f.buf.Len()) }

// encoder turns plain segments into stored ones.
type encoder struct {
	chain         string
	compression   string
	recipients    []age.Recipient
	ageRecipients []string
}

// copies says whether encode makes a new body, rather than store the
// plain segment's bytes as they are.
func (e encoder) copies() bool { return e.compression != "" || len(e.recipients) > 0 }

// encode closes f with endReason and compresses and encrypts it. f's
// buffer is not needed afterwards unless Body is it (no compression, no
// encryption).
func (e encoder) encode(ctx context.Context, f *filling, endReason string) (Segment, error) {
	sum, err := f.w.Close(endReason)
	if err != nil {
		return Segment{}, fmt.Errorf("finish delta segment at revision %d: %w", sum.FirstRevision, err)
	}
	plain := f.buf.Bytes()
	raw := sha256.Sum256(plain)
	seg := Segment{
		Name:        SegmentName(e.chain, sum.FirstRevision),
		Summary:     sum,
		Compression: e.compression,
		RawSize:     int64(len(plain)),
		RawSHA256:   hex.EncodeToString(raw[:]),
	}
	if len(e.recipients) > 0 {
		seg.AgeRecipients = e.ageRecipients
	}
	if f.last != nil {
		seg.LastEvent = eventOf(f.last)
	}
	if !e.copies() {
		seg.Body = plain
		return seg, nil
	}
	compressed, err := snapshot.Compress(ctx, bytes.NewReader(plain), e.compression)
	if err != nil {
		return Segment{}, err
	}
	defer compressed.Close()
	var body io.Reader = compressed
	if len(e.recipients) > 0 {
		if body, err = crypt.Encrypt(ctx, compressed, e.recipients); err != nil {
			return Segment{}, fmt.Errorf("encrypt delta segment %s: %w", seg.Name, err)
		}
	}
	var out bytes.Buffer
	if _, err := io.Copy(&out, body); err != nil {
		return Segment{}, fmt.Errorf("encode delta segment %s: %w", seg.Name, err)
	}
	seg.Body = out.Bytes()
	return seg, nil
}

// eventOf is ev's fingerprint.
func eventOf(ev *mvccpb.Event) *Event {
	out := &Event{Key: ev.Kv.Key, Deleted: ev.Type == mvccpb.Event_DELETE}
	if !out.Deleted {
		sum := sha256.Sum256(ev.Kv.Value)
		out.ValueSHA256 = hex.EncodeToString(sum[:])
	}
	return out
}
