package delta

import (
	"bufio"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	"google.golang.org/protobuf/proto"
)

// Magic starts every plain segment.
const Magic = "etcdbackup-delta-segment/v1\n"

// MaxFrameSize bounds a frame's payload, on read and on write. A writer
// splits a revision larger than revisionFrameTarget across frames, so a
// frame only comes near this bound to hold a single event that large.
const MaxFrameSize = 64 << 20

// MaxRevisionBytes bounds one revision's encoded events (lengths
// included) over all its frames: the largest request the replay etcd
// takes (delta/replay applies a revision as one transaction, and its
// operations are smaller than the events they come from, which also
// carry create revisions and versions). A writer refuses a larger
// revision (ErrRevisionTooLarge); a reader refuses one whose frames add
// up to more, before reading past the bound, so that it holds at most
// this much of one revision's events.
const MaxRevisionBytes = 256 << 20

// revisionFrameTarget is the payload size past which a writer splits a
// revision into an 'R' frame and 'C' frames, each at most this large (a
// single larger event gets a frame of its own). It keeps a reader's frame
// buffer small next to the revision it assembles, while a frame's few
// header bytes stay negligible. A revision that fits is one 'R' frame,
// encoded exactly as before revisions were ever split.
const revisionFrameTarget = 4 << 20

// ErrCorrupt is wrapped by every error about a segment's content: one cut
// short, damaged, or breaking the format's invariants.
var ErrCorrupt = errors.New("delta segment corrupt")

// ErrNotSegment is returned by NewReader for bytes that do not start with
// the segment magic (wrapped with ErrCorrupt).
var ErrNotSegment = errors.New("not a delta segment (no etcdbackup-delta-segment/v1 magic): a backup or a still compressed or encrypted file?")

// ErrRevisionTooLarge is wrapped by AddRevision's error for a revision no
// segment can hold: its events encode to more than MaxRevisionBytes, or
// one of them alone to more than a frame may be (MaxFrameSize). Nothing
// of it was written, but the chain cannot go past it either: end the
// chain there and take a full backup.
var ErrRevisionTooLarge = errors.New("revision too large to replay")

const (
	frameHeader       = 'H'
	frameLease        = 'L'
	frameRevision     = 'R'
	frameContinuation = 'C'
	frameEnd          = 'E'
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
	// frameTarget is revisionFrameTarget; tests lower it to split small
	// revisions.
	frameTarget int
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
	dw := &Writer{w: w, sum: Summary{Header: h, LastRevision: h.FirstRevision - 1}, frameTarget: revisionFrameTarget}
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

// AddRevision writes a revision: one 'R' frame, or, for a revision whose
// frame would be larger than revisionFrameTarget, an 'R' frame and the
// 'C' frames that hold the rest of its events. It refuses, writing
// nothing, a revision that does not follow the previous one (or is not
// the header's FirstRevision for the first), one without events, one
// with an event whose mod revision is not the revision: such a segment
// could not be replayed; and one too large to replay
// (ErrRevisionTooLarge).
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
	// Check and size every event before writing a byte, so that a
	// revision refused leaves the segment as it was.
	var size int64
	for i, ev := range r.Events {
		if ev == nil || ev.Kv == nil {
			return fmt.Errorf("delta segment of chain %q: revision %d: event %d has no key-value", w.sum.Chain, r.Revision, i)
		}
		if ev.Kv.ModRevision != r.Revision {
			return fmt.Errorf("delta segment of chain %q: revision %d: event %d (key %q) has mod revision %d", w.sum.Chain, r.Revision, i, ev.Kv.Key, ev.Kv.ModRevision)
		}
		n := int64(eventSize(proto.Size(ev)))
		room := int64(MaxFrameSize)
		if i == 0 {
			room -= int64(len(b))
		}
		if n > room {
			return fmt.Errorf("delta segment of chain %q: %w: revision %d: event %d (key %.100q) encodes to %d bytes, more than the %d a segment frame may hold", w.sum.Chain, ErrRevisionTooLarge, r.Revision, i, ev.Kv.Key, n, room)
		}
		size += n
	}
	if size > MaxRevisionBytes {
		return fmt.Errorf("delta segment of chain %q: %w: revision %d: its %d events encode to %d bytes, more than the %d one revision may be (the largest request the replay etcd takes)", w.sum.Chain, ErrRevisionTooLarge, r.Revision, len(r.Events), size, MaxRevisionBytes)
	}
	typ, inFrame, written := byte(frameRevision), 0, false
	for i, ev := range r.Events {
		n := proto.Size(ev)
		// Greedy: a frame takes events while they fit, and at least one,
		// which the check above let fit in MaxFrameSize. A revision that
		// fits the target never gets here with a full frame.
		if inFrame > 0 && len(b)+eventSize(n) > w.frameTarget {
			if err := w.frame(typ, b); err != nil {
				return err
			}
			typ, inFrame, written, b = frameContinuation, 0, true, b[:0]
		}
		b = binary.AppendUvarint(b, uint64(n))
		start := len(b)
		var err error
		b, err = proto.MarshalOptions{}.MarshalAppend(b, ev)
		if err == nil && len(b)-start != n {
			err = fmt.Errorf("it encoded to %d bytes where it was sized %d (the event changed while being written?)", len(b)-start, n)
		}
		if err != nil {
			err = fmt.Errorf("delta segment of chain %q: revision %d: encode event %d: %w", w.sum.Chain, r.Revision, i, err)
			if written {
				// Part of the revision is written: the segment cannot go on.
				w.err = err
			}
			return err
		}
		inFrame++
	}
	// A buffer grown for one huge event is not kept for the segment's
	// life.
	if cap(b) <= 2*w.frameTarget {
		w.buf = b
	} else {
		w.buf = nil
	}
	if err := w.frame(typ, b); err != nil {
		return err
	}
	w.sum.add(r)
	return nil
}

// eventSize is what an event of n bytes takes in a frame: its length,
// then itself.
func eventSize(n int) int {
	return uvarintLen(uint64(n)) + n
}

func uvarintLen(v uint64) int {
	n := 1
	for ; v >= 0x80; v >>= 7 {
		n++
	}
	return n
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
// empty; cut to its first maxEndReason bytes), and returns the segment's
// summary. It does not close the underlying writer.
func (w *Writer) Close(endReason string) (Summary, error) {
	if err := w.usable(); err != nil {
		return w.sum, err
	}
	w.closed = true
	if len(endReason) > maxEndReason {
		// A reader refuses a larger end frame; the reason is for people,
		// and its start says it.
		endReason = strings.ToValidUTF8(endReason[:maxEndReason], "")
	}
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
// goes. It reads a revision's frames event by event rather than whole,
// and grows what it holds as bytes arrive, never to a length the segment
// declares: a few KB of zstd expand to megabytes of zeros, and a length
// or count read from them must not cost more than the bytes behind it.
type Reader struct {
	r *bufio.Reader
	// left is what is still unread of the current frame's payload.
	left uint64
	// srcErr is the error of reading the segment itself, seen while
	// reading a number of a frame: it was cut short or failed, which is
	// not a malformed number.
	srcErr error
	hdr    Header
	sum    Summary
	leases map[int64]bool
	// open is a revision split across frames whose 'C' frames are still
	// to come: it has fewer than openEvents events, which took openBytes
	// bytes.
	open       *Revision
	openEvents uint64
	openBytes  uint64
	// buf holds one event's encoding, or a small frame's payload, reused
	// for the next: nothing decoded from it refers to it.
	buf  []byte
	done bool
	err  error
}

// maxSmallFrame bounds the payload of a header, lease or end frame,
// which a reader holds whole. They take tens of bytes (a header's JSON,
// three numbers, an end reason in words): a larger length is damage.
const maxSmallFrame = 64 << 10

// maxEndReason is the longest end reason a Writer records, so that its
// end frame stays within maxSmallFrame.
const maxEndReason = maxSmallFrame - 4*binary.MaxVarintLen64

// eventsPrealloc bounds the capacity a revision's events start with: the
// count a revision frame gives is not backed by bytes yet, so the slice
// grows as events are decoded past it.
const eventsPrealloc = 1024

// errBadNumber is a number of a frame that is malformed or runs past the
// frame's end.
var errBadNumber = errors.New("bad or truncated number")

// errFrameEnd ends a number that runs past its frame.
var errFrameEnd = errors.New("end of frame")

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
	typ, err := dr.frame()
	if err != nil {
		return nil, err
	}
	if typ != frameHeader {
		return nil, fmt.Errorf("%w: the first frame is %q, not the header", ErrCorrupt, typ)
	}
	payload, err := dr.payload()
	if err != nil {
		return nil, err
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

// frame reads a frame's type and length, bounds the length, and checks
// that the frame may come here as far as a revision split across frames
// goes. Its payload is left to read: r.left bytes.
func (r *Reader) frame() (byte, error) {
	typ, err := r.r.ReadByte()
	if errors.Is(err, io.EOF) {
		if r.open != nil {
			return 0, fmt.Errorf("%w: it ends inside revision %d, after %d of its %d events, without the rest or an end frame (cut short: an upload or a writer interrupted?)", ErrCorrupt, r.open.Revision, len(r.open.Events), r.openEvents)
		}
		return 0, fmt.Errorf("%w: it ends after revision %d without an end frame (cut short: an upload or a writer interrupted?)", ErrCorrupt, r.sum.LastRevision)
	}
	if err != nil {
		return 0, fmt.Errorf("read delta segment: %w", err)
	}
	n, err := binary.ReadUvarint(r.r)
	if err != nil {
		return 0, r.short(err)
	}
	if n > MaxFrameSize {
		return 0, fmt.Errorf("%w: a %q frame says it is %d bytes, more than the %d a segment frame may be", ErrCorrupt, typ, n, MaxFrameSize)
	}
	switch {
	case r.open != nil && typ != frameContinuation:
		return 0, fmt.Errorf("%w: revision %d is split across frames and has %d of its %d events, then a %q frame comes instead of the rest", ErrCorrupt, r.open.Revision, len(r.open.Events), r.openEvents, typ)
	case r.open != nil && r.openBytes+n > MaxRevisionBytes:
		// Refused before reading it: the revision held so far is all a
		// damaged or hostile segment costs.
		return 0, fmt.Errorf("%w: revision %d is more than %d bytes (%d read and a continuation frame of %d), more than the %d one revision may be (the largest request the replay etcd takes)", ErrCorrupt, r.open.Revision, r.openBytes+n, r.openBytes, n, MaxRevisionBytes)
	case r.open == nil && typ == frameContinuation:
		return 0, fmt.Errorf("%w: a continuation frame after revision %d, which is complete: no revision is split across frames there", ErrCorrupt, r.sum.LastRevision)
	case (typ == frameHeader || typ == frameLease || typ == frameEnd) && n > maxSmallFrame:
		return 0, fmt.Errorf("%w: a %q frame says it is %d bytes, more than the %d such a frame may be", ErrCorrupt, typ, n, maxSmallFrame)
	}
	r.left = n
	return typ, nil
}

// payload reads the rest of the current frame whole.
func (r *Reader) payload() ([]byte, error) {
	return r.read(int(r.left))
}

// read reads the next n bytes of the current frame (n <= r.left) into
// the reused buffer. It grows the buffer as bytes arrive rather than to
// n, so that a damaged length in a short segment costs what the segment
// holds, not up to MaxFrameSize.
func (r *Reader) read(n int) ([]byte, error) {
	const minGrow = 64 << 10
	b := r.buf[:0]
	for len(b) < n {
		if len(b) == cap(b) {
			b = slices.Grow(b, min(n-len(b), max(len(b), minGrow)))
		}
		got, err := io.ReadFull(r.r, b[len(b):min(n, cap(b))])
		b = b[:len(b)+got]
		r.left -= uint64(got)
		if err != nil {
			return nil, r.short(err)
		}
	}
	r.buf = b
	return b, nil
}

// body reads a Reader's current frame byte by byte, for binary's varint
// readers: errFrameEnd past the frame's end.
type body Reader

func (b *body) ReadByte() (byte, error) {
	if b.left == 0 {
		return 0, errFrameEnd
	}
	c, err := b.r.ReadByte()
	if err != nil {
		b.srcErr = err
		return 0, err
	}
	b.left--
	return c, nil
}

// uvarint and varint read a number of the current frame. Their error is
// errBadNumber for a malformed number or one past the frame's end, else
// the segment's own (cut short, or its reader failed), ready to return.
func (r *Reader) uvarint() (uint64, error) {
	v, err := binary.ReadUvarint((*body)(r))
	return v, r.numberErr(err)
}

func (r *Reader) varint() (int64, error) {
	v, err := binary.ReadVarint((*body)(r))
	return v, r.numberErr(err)
}

func (r *Reader) numberErr(err error) error {
	switch {
	case err == nil:
		return nil
	case r.srcErr != nil:
		return r.short(r.srcErr)
	}
	return errBadNumber
}

// release drops a buffer larger than a split revision's frames (a single
// huge event, an older writer's big revision) once no revision is open:
// the events of one split revision reuse it.
func (r *Reader) release() {
	if r.open == nil && cap(r.buf) > 2*revisionFrameTarget {
		r.buf = nil
	}
}

func (r *Reader) short(err error) error {
	if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
		if r.open != nil {
			return fmt.Errorf("%w: it ends inside a frame of revision %d, which is split across frames (cut short)", ErrCorrupt, r.open.Revision)
		}
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
	r.release()
	if err != nil {
		r.err = err
		if errors.Is(err, io.EOF) {
			r.done, r.err = true, nil
		}
	}
	return rev, l, err
}

func (r *Reader) next() (*Revision, *Lease, error) {
	// A revision split across frames is read whole: it is one etcd
	// transaction to whoever replays it.
	for {
		typ, err := r.frame()
		if err != nil {
			return nil, nil, err
		}
		switch typ {
		case frameLease:
			p, err := r.payload()
			if err != nil {
				return nil, nil, err
			}
			d := decoder{b: p}
			l := &Lease{ID: d.varint(), TTL: d.varint(), Remaining: d.varint()}
			if err := d.end(); err != nil {
				return nil, nil, fmt.Errorf("%w: lease frame after revision %d: %v", ErrCorrupt, r.sum.LastRevision, err)
			}
			r.leases[l.ID] = true
			return nil, l, nil
		case frameRevision, frameContinuation:
			var rev *Revision
			if typ == frameRevision {
				rev, err = r.revision()
			} else {
				rev, err = r.continuation()
			}
			if err != nil {
				return nil, nil, err
			}
			if rev == nil {
				continue
			}
			r.sum.add(*rev)
			return rev, nil, nil
		case frameEnd:
			p, err := r.payload()
			if err != nil {
				return nil, nil, err
			}
			d := decoder{b: p}
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
}

// revision decodes an 'R' frame. It returns nil for a revision whose
// events do not all fit in the frame: it stays open for the 'C' frames
// after it.
func (r *Reader) revision() (*Revision, error) {
	want := r.sum.LastRevision + 1
	bad := func(err error) error {
		if errors.Is(err, errBadNumber) {
			return fmt.Errorf("%w: revision frame after revision %d: %v", ErrCorrupt, r.sum.LastRevision, err)
		}
		return err
	}
	number, err := r.uvarint()
	if err != nil {
		return nil, bad(err)
	}
	nanos, err := r.varint()
	if err != nil {
		return nil, bad(err)
	}
	n, err := r.uvarint()
	if err != nil {
		return nil, bad(err)
	}
	rev := &Revision{Revision: int64(number), Time: time.Unix(0, nanos)}
	if rev.Revision != want {
		return nil, fmt.Errorf("%w: revision %d follows revision %d (a gap or a repeat)", ErrCorrupt, rev.Revision, r.sum.LastRevision)
	}
	// Each event takes at least one byte, and a revision at most
	// MaxRevisionBytes: a larger count is damage.
	if n == 0 || n > MaxRevisionBytes {
		return nil, fmt.Errorf("%w: revision %d says it has %d events", ErrCorrupt, rev.Revision, n)
	}
	rev.Events = make([]*mvccpb.Event, 0, min(n, eventsPrealloc, r.left))
	size := r.left
	if err := r.events(rev, n); err != nil {
		return nil, err
	}
	if uint64(len(rev.Events)) < n {
		r.open, r.openEvents, r.openBytes = rev, n, size
		return nil, nil
	}
	return rev, nil
}

// continuation decodes a 'C' frame of the open revision, and returns the
// revision once this frame completes it.
func (r *Reader) continuation() (*Revision, error) {
	rev := r.open
	size := r.left
	if err := r.events(rev, r.openEvents); err != nil {
		return nil, err
	}
	r.openBytes += size
	if uint64(len(rev.Events)) < r.openEvents {
		return nil, nil
	}
	r.open = nil
	return rev, nil
}

// events decodes the rest of the current frame, events of rev, which
// has count events in all: a frame holds at least one, and never more
// than the count leaves. Each event is read, decoded and checked before
// the next is read.
func (r *Reader) events(rev *Revision, count uint64) error {
	if r.left == 0 {
		return fmt.Errorf("%w: revision %d has %d of its %d events, then a frame that holds none", ErrCorrupt, rev.Revision, len(rev.Events), count)
	}
	for r.left > 0 {
		i := len(rev.Events)
		if uint64(i) == count {
			return fmt.Errorf("%w: revision %d says it has %d events, but its frames hold more", ErrCorrupt, rev.Revision, count)
		}
		n, err := r.uvarint()
		if errors.Is(err, errBadNumber) {
			return fmt.Errorf("%w: revision %d, event %d: %v", ErrCorrupt, rev.Revision, i, err)
		}
		if err != nil {
			return err
		}
		if n > r.left {
			return fmt.Errorf("%w: revision %d, event %d: a length of %d where %d bytes are left", ErrCorrupt, rev.Revision, i, n, r.left)
		}
		b, err := r.read(int(n))
		if err != nil {
			return err
		}
		ev := &mvccpb.Event{}
		if err := proto.Unmarshal(b, ev); err != nil {
			return fmt.Errorf("%w: revision %d, event %d: %v", ErrCorrupt, rev.Revision, i, err)
		}
		if ev.Kv == nil || ev.Kv.ModRevision != rev.Revision {
			return fmt.Errorf("%w: revision %d, event %d is not an event of that revision", ErrCorrupt, rev.Revision, i)
		}
		if ev.Kv.Lease != 0 && ev.Type == mvccpb.Event_PUT && !r.leases[ev.Kv.Lease] {
			return fmt.Errorf("%w: revision %d puts key %.100q with lease %d, which no lease frame before it describes", ErrCorrupt, rev.Revision, ev.Kv.Key, ev.Kv.Lease)
		}
		rev.Events = append(rev.Events, ev)
	}
	return nil
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
