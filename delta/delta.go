package delta

import (
	"bufio"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	"google.golang.org/protobuf/proto"
)

// Magic starts every plain segment.
const Magic = "etcdbackup-delta-segment/v1\n"

// MaxFrameSize bounds a frame's payload on read: a damaged length cannot
// make a reader allocate more. etcd refuses requests over 1.5 MiB by
// default and a revision is one request, so a real frame is far smaller.
const MaxFrameSize = 64 << 20

// ErrCorrupt is wrapped by every error about a segment's content: one cut
// short, damaged, or breaking the format's invariants.
var ErrCorrupt = errors.New("delta segment corrupt")

// ErrNotSegment is returned by NewReader for bytes that do not start with
// the segment magic (wrapped with ErrCorrupt).
var ErrNotSegment = errors.New("not a delta segment (no etcdbackup-delta-segment/v1 magic): a backup or a still compressed or encrypted file?")

const (
	frameHeader   = 'H'
	frameLease    = 'L'
	frameRevision = 'R'
	frameEnd      = 'E'
)

// Header opens a segment.
type Header struct {
	// Chain is the full backup the chain starts from.
	Chain string `json:"chain"`
	// Epoch is the writer's fencing epoch.
	Epoch int64 `json:"epoch"`
	// FirstRevision is the first revision the segment holds (the chain's
	// previous segment's last + 1, or the full's revision + 1).
	FirstRevision int64 `json:"firstRevision"`
}

// Revision is every event etcd produced at one revision, and when the
// watcher saw them.
type Revision struct {
	Revision int64
	Time     time.Time
	Events   []*mvccpb.Event
}

// Lease is a lease some event of a segment uses, as the watcher read it
// from etcd (LeaseTimeToLive) when it first saw it.
type Lease struct {
	ID int64
	// TTL is the TTL the lease was granted with, in seconds.
	TTL int64
	// Remaining is what was left of it when read, in seconds; -1 when the
	// lease was already gone (expired or revoked) when the watcher asked.
	Remaining int64
}

// Summary is what a finished segment holds: what its manifest records.
type Summary struct {
	Header
	// LastRevision is FirstRevision - 1 for a segment without revisions.
	LastRevision        int64
	FirstTime, LastTime time.Time
	Revisions, Events   int64
	EndReason           string
}

// Writer encodes one segment. It is not safe for concurrent use.
type Writer struct {
	w   io.Writer
	sum Summary
	err error
	buf []byte
	// closed is set once the end frame was written (or tried).
	closed bool
}

// NewWriter writes the magic and the header frame of a segment to w.
func NewWriter(w io.Writer, h Header) (*Writer, error) {
	if h.FirstRevision < 1 {
		return nil, fmt.Errorf("delta segment of chain %q: first revision %d: etcd revisions start at 1", h.Chain, h.FirstRevision)
	}
	hdr, err := json.Marshal(h)
	if err != nil {
		return nil, fmt.Errorf("delta segment header: %w", err)
	}
	dw := &Writer{w: w, sum: Summary{Header: h, LastRevision: h.FirstRevision - 1}}
	if _, err := io.WriteString(w, Magic); err != nil {
		return nil, fmt.Errorf("write delta segment: %w", err)
	}
	if err := dw.frame(frameHeader, hdr); err != nil {
		return nil, err
	}
	return dw, nil
}

// frame writes one frame; a write error sticks, since the stream is then
// cut at an unknown point.
func (w *Writer) frame(typ byte, payload []byte) error {
	if w.err != nil {
		return w.err
	}
	hdr := make([]byte, 1, 1+binary.MaxVarintLen64)
	hdr[0] = typ
	hdr = binary.AppendUvarint(hdr, uint64(len(payload)))
	if _, err := w.w.Write(hdr); err != nil {
		w.err = fmt.Errorf("write delta segment: %w", err)
		return w.err
	}
	if _, err := w.w.Write(payload); err != nil {
		w.err = fmt.Errorf("write delta segment: %w", err)
		return w.err
	}
	return nil
}

func (w *Writer) usable() error {
	if w.err != nil {
		return w.err
	}
	if w.closed {
		return errors.New("delta segment already closed")
	}
	return nil
}

// AddLease writes a lease frame. Write it before the first revision whose
// events use the lease.
func (w *Writer) AddLease(l Lease) error {
	if err := w.usable(); err != nil {
		return err
	}
	b := w.buf[:0]
	b = binary.AppendVarint(b, l.ID)
	b = binary.AppendVarint(b, l.TTL)
	b = binary.AppendVarint(b, l.Remaining)
	w.buf = b
	return w.frame(frameLease, b)
}

// AddRevision writes a revision frame. It refuses, writing nothing, a
// revision that does not follow the previous one (or is not the header's
// FirstRevision for the first), one without events, and one with an event
// whose mod revision is not the revision: such a segment could not be
// replayed.
func (w *Writer) AddRevision(r Revision) error {
	if err := w.usable(); err != nil {
		return err
	}
	if want := w.sum.LastRevision + 1; r.Revision != want {
		return fmt.Errorf("delta segment of chain %q: revision %d given where %d is next: a revision was missed or repeated", w.sum.Chain, r.Revision, want)
	}
	if len(r.Events) == 0 {
		return fmt.Errorf("delta segment of chain %q: revision %d has no events (every etcd revision has at least one)", w.sum.Chain, r.Revision)
	}
	b := w.buf[:0]
	b = binary.AppendUvarint(b, uint64(r.Revision))
	b = binary.AppendVarint(b, r.Time.UnixNano())
	b = binary.AppendUvarint(b, uint64(len(r.Events)))
	for i, ev := range r.Events {
		if ev == nil || ev.Kv == nil {
			return fmt.Errorf("delta segment of chain %q: revision %d: event %d has no key-value", w.sum.Chain, r.Revision, i)
		}
		if ev.Kv.ModRevision != r.Revision {
			return fmt.Errorf("delta segment of chain %q: revision %d: event %d (key %q) has mod revision %d", w.sum.Chain, r.Revision, i, ev.Kv.Key, ev.Kv.ModRevision)
		}
		pb, err := proto.Marshal(ev)
		if err != nil {
			return fmt.Errorf("delta segment of chain %q: revision %d: encode event: %w", w.sum.Chain, r.Revision, err)
		}
		b = binary.AppendUvarint(b, uint64(len(pb)))
		b = append(b, pb...)
	}
	w.buf = b
	if err := w.frame(frameRevision, b); err != nil {
		return err
	}
	w.sum.add(r)
	return nil
}

// add counts revision r into s.
func (s *Summary) add(r Revision) {
	if s.Revisions == 0 {
		s.FirstTime = r.Time
	}
	s.LastRevision, s.LastTime = r.Revision, r.Time
	s.Revisions++
	s.Events += int64(len(r.Events))
}

// Summary is what was written so far.
func (w *Writer) Summary() Summary { return w.sum }

// Close writes the end frame, saying why the segment ended (may be
// empty), and returns the segment's summary. It does not close the
// underlying writer.
func (w *Writer) Close(endReason string) (Summary, error) {
	if err := w.usable(); err != nil {
		return w.sum, err
	}
	w.closed = true
	w.sum.EndReason = endReason
	b := w.buf[:0]
	b = binary.AppendUvarint(b, uint64(w.sum.LastRevision))
	b = binary.AppendUvarint(b, uint64(w.sum.Revisions))
	b = binary.AppendUvarint(b, uint64(w.sum.Events))
	b = binary.AppendUvarint(b, uint64(len(endReason)))
	b = append(b, endReason...)
	w.buf = b
	return w.sum, w.frame(frameEnd, b)
}

// Reader decodes one segment, checking the format's invariants as it
// goes.
type Reader struct {
	r      *bufio.Reader
	hdr    Header
	sum    Summary
	leases map[int64]bool
	done   bool
	err    error
}

// NewReader reads the magic and header of a plain segment.
func NewReader(r io.Reader) (*Reader, error) {
	br := bufio.NewReader(r)
	magic := make([]byte, len(Magic))
	if n, err := io.ReadFull(br, magic); err != nil || string(magic) != Magic {
		if err != nil && !errors.Is(err, io.EOF) && !errors.Is(err, io.ErrUnexpectedEOF) {
			return nil, fmt.Errorf("read delta segment: %w", err)
		}
		if n == 0 {
			return nil, fmt.Errorf("%w: %w (the file is empty)", ErrCorrupt, ErrNotSegment)
		}
		return nil, fmt.Errorf("%w: %w", ErrCorrupt, ErrNotSegment)
	}
	dr := &Reader{r: br, leases: map[int64]bool{}}
	typ, payload, err := dr.frame()
	if err != nil {
		return nil, err
	}
	if typ != frameHeader {
		return nil, fmt.Errorf("%w: the first frame is %q, not the header", ErrCorrupt, typ)
	}
	if err := json.Unmarshal(payload, &dr.hdr); err != nil {
		return nil, fmt.Errorf("%w: header: %v", ErrCorrupt, err)
	}
	if dr.hdr.FirstRevision < 1 {
		return nil, fmt.Errorf("%w: header says first revision %d", ErrCorrupt, dr.hdr.FirstRevision)
	}
	dr.sum = Summary{Header: dr.hdr, LastRevision: dr.hdr.FirstRevision - 1}
	return dr, nil
}

// Header is the segment's header.
func (r *Reader) Header() Header { return r.hdr }

// Summary is what was read; complete (EndReason included) once Next
// returned io.EOF.
func (r *Reader) Summary() Summary { return r.sum }

// frame reads one frame, bounding its size.
func (r *Reader) frame() (byte, []byte, error) {
	typ, err := r.r.ReadByte()
	if errors.Is(err, io.EOF) {
		return 0, nil, fmt.Errorf("%w: it ends after revision %d without an end frame (cut short: an upload or a writer interrupted?)", ErrCorrupt, r.sum.LastRevision)
	}
	if err != nil {
		return 0, nil, fmt.Errorf("read delta segment: %w", err)
	}
	n, err := binary.ReadUvarint(r.r)
	if err != nil {
		return 0, nil, r.short(err)
	}
	if n > MaxFrameSize {
		return 0, nil, fmt.Errorf("%w: a %q frame says it is %d bytes, more than the %d a segment frame may be", ErrCorrupt, typ, n, MaxFrameSize)
	}
	payload := make([]byte, n)
	if _, err := io.ReadFull(r.r, payload); err != nil {
		return 0, nil, r.short(err)
	}
	return typ, payload, nil
}

func (r *Reader) short(err error) error {
	if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
		return fmt.Errorf("%w: it ends inside a frame after revision %d (cut short)", ErrCorrupt, r.sum.LastRevision)
	}
	return fmt.Errorf("read delta segment: %w", err)
}

// Next returns the next revision or lease (exactly one is non-nil), or
// io.EOF after a valid end frame. Every other error leaves the reader
// unusable; one about the content wraps ErrCorrupt.
func (r *Reader) Next() (*Revision, *Lease, error) {
	if r.err != nil {
		return nil, nil, r.err
	}
	if r.done {
		return nil, nil, io.EOF
	}
	rev, l, err := r.next()
	if err != nil {
		r.err = err
		if errors.Is(err, io.EOF) {
			r.done, r.err = true, nil
		}
	}
	return rev, l, err
}

func (r *Reader) next() (*Revision, *Lease, error) {
	typ, p, err := r.frame()
	if err != nil {
		return nil, nil, err
	}
	d := decoder{b: p}
	switch typ {
	case frameLease:
		l := &Lease{ID: d.varint(), TTL: d.varint(), Remaining: d.varint()}
		if err := d.end(); err != nil {
			return nil, nil, fmt.Errorf("%w: lease frame after revision %d: %v", ErrCorrupt, r.sum.LastRevision, err)
		}
		r.leases[l.ID] = true
		return nil, l, nil
	case frameRevision:
		rev, err := r.revision(&d)
		if err != nil {
			return nil, nil, err
		}
		r.sum.add(*rev)
		return rev, nil, nil
	case frameEnd:
		last, revs, events := int64(d.uvarint()), int64(d.uvarint()), int64(d.uvarint())
		reason := d.bytes()
		if err := d.end(); err != nil {
			return nil, nil, fmt.Errorf("%w: end frame: %v", ErrCorrupt, err)
		}
		if last != r.sum.LastRevision || revs != r.sum.Revisions || events != r.sum.Events {
			return nil, nil, fmt.Errorf("%w: the end frame counts revisions up to %d (%d revisions, %d events) but %d revisions up to %d with %d events were read",
				ErrCorrupt, last, revs, events, r.sum.Revisions, r.sum.LastRevision, r.sum.Events)
		}
		r.sum.EndReason = string(reason)
		// Bytes after the end frame mean the file is not what was written.
		if _, err := r.r.ReadByte(); !errors.Is(err, io.EOF) {
			if err != nil {
				return nil, nil, fmt.Errorf("read delta segment: %w", err)
			}
			return nil, nil, fmt.Errorf("%w: bytes follow the end frame", ErrCorrupt)
		}
		return nil, nil, io.EOF
	case frameHeader:
		return nil, nil, fmt.Errorf("%w: a second header after revision %d (two segments concatenated?)", ErrCorrupt, r.sum.LastRevision)
	default:
		return nil, nil, fmt.Errorf("%w: unknown frame type %q after revision %d", ErrCorrupt, typ, r.sum.LastRevision)
	}
}

func (r *Reader) revision(d *decoder) (*Revision, error) {
	want := r.sum.LastRevision + 1
	rev := &Revision{Revision: int64(d.uvarint())}
	rev.Time = time.Unix(0, d.varint())
	n := d.uvarint()
	if d.err != nil {
		return nil, fmt.Errorf("%w: revision frame after revision %d: %v", ErrCorrupt, r.sum.LastRevision, d.err)
	}
	if rev.Revision != want {
		return nil, fmt.Errorf("%w: revision %d follows revision %d (a gap or a repeat)", ErrCorrupt, rev.Revision, r.sum.LastRevision)
	}
	// Each event takes at least one byte: more than the frame's length is
	// damage, and would otherwise size an allocation.
	if n == 0 || n > uint64(len(d.b)) {
		return nil, fmt.Errorf("%w: revision %d says it has %d events", ErrCorrupt, rev.Revision, n)
	}
	rev.Events = make([]*mvccpb.Event, 0, n)
	for i := uint64(0); i < n; i++ {
		b := d.bytes()
		if d.err != nil {
			return nil, fmt.Errorf("%w: revision %d, event %d: %v", ErrCorrupt, rev.Revision, i, d.err)
		}
		ev := &mvccpb.Event{}
		if err := proto.Unmarshal(b, ev); err != nil {
			return nil, fmt.Errorf("%w: revision %d, event %d: %v", ErrCorrupt, rev.Revision, i, err)
		}
		if ev.Kv == nil || ev.Kv.ModRevision != rev.Revision {
			return nil, fmt.Errorf("%w: revision %d, event %d is not an event of that revision", ErrCorrupt, rev.Revision, i)
		}
		if ev.Kv.Lease != 0 && ev.Type == mvccpb.Event_PUT && !r.leases[ev.Kv.Lease] {
			return nil, fmt.Errorf("%w: revision %d puts key %q with lease %d, which no lease frame before it describes", ErrCorrupt, rev.Revision, ev.Kv.Key, ev.Kv.Lease)
		}
		rev.Events = append(rev.Events, ev)
	}
	if err := d.end(); err != nil {
		return nil, fmt.Errorf("%w: revision %d: %v", ErrCorrupt, rev.Revision, err)
	}
	return rev, nil
}

// decoder reads varints from a frame's payload; the first error sticks.
type decoder struct {
	b   []byte
	err error
}

func (d *decoder) uvarint() uint64 {
	if d.err != nil {
		return 0
	}
	v, n := binary.Uvarint(d.b)
	if n <= 0 {
		d.err = errors.New("bad or truncated number")
		return 0
	}
	d.b = d.b[n:]
	return v
}

func (d *decoder) varint() int64 {
	if d.err != nil {
		return 0
	}
	v, n := binary.Varint(d.b)
	if n <= 0 {
		d.err = errors.New("bad or truncated number")
		return 0
	}
	d.b = d.b[n:]
	return v
}

func (d *decoder) bytes() []byte {
	n := d.uvarint()
	if d.err != nil {
		return nil
	}
	if n > uint64(len(d.b)) {
		d.err = fmt.Errorf("a length of %d where %d bytes are left", n, len(d.b))
		return nil
	}
	b := d.b[:n]
	d.b = d.b[n:]
	return b
}

func (d *decoder) end() error {
	if d.err == nil && len(d.b) != 0 {
		d.err = fmt.Errorf("%d bytes left over", len(d.b))
	}
	return d.err
}
