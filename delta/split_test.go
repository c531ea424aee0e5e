package delta

import (
	"bytes"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	"google.golang.org/protobuf/proto"
)

// goldenSegment is segment(t, 10, 3, "rotated") as the writer encoded it
// before revisions were ever split: segments without a big revision must
// stay byte for byte what they were.
const goldenSegment = "657463646261636b75702d64656c74612d7365676d656e742f76310a482a7b22636861696e223a2263222c2265706f6368223a332c2266697273745265766973696f6e223a31307d4c049a017854521d0af681d0e2c6bfce972f0111120f0a022f61100a180a20012a0176304d52280bf6a9a69ccebfce972f0211120f0a022f61100b180b20012a0176304d0a080112060a022f62180b521d0cf6d1fcd5d5bfce972f0111120f0a022f61100c180c20012a0176304d450b0c030407726f7461746564"

func TestSmallSegmentEncodingUnchanged(t *testing.T) {
	b, _ := segment(t, 10, 3, "rotated")
	if got := hex.EncodeToString(b); got != goldenSegment {
		t.Fatalf("a small segment is no longer encoded as before:\ngot  %s\nwant %s", got, goldenSegment)
	}
}

// singleFramePayload is the payload of the one 'R' frame a revision
// was always encoded as.
func singleFramePayload(r Revision) []byte {
	var p []byte
	p = binary.AppendUvarint(p, uint64(r.Revision))
	p = binary.AppendVarint(p, r.Time.UnixNano())
	p = binary.AppendUvarint(p, uint64(len(r.Events)))
	for _, ev := range r.Events {
		pb, err := proto.Marshal(ev)
		if err != nil {
			panic(err)
		}
		p = binary.AppendUvarint(p, uint64(len(pb)))
		p = append(p, pb...)
	}
	return p
}

// rawFrame is one frame of an encoded segment.
type rawFrame struct {
	typ     byte
	payload []byte
}

// splitFrames cuts an encoded segment into its frames, checking nothing
// but the framing.
func splitFrames(t *testing.T, b []byte) []rawFrame {
	t.Helper()
	if !bytes.HasPrefix(b, []byte(Magic)) {
		t.Fatal("no magic")
	}
	b = b[len(Magic):]
	var fs []rawFrame
	for len(b) > 0 {
		n, k := binary.Uvarint(b[1:])
		if k <= 0 || uint64(len(b)-1-k) < n {
			t.Fatalf("frame %d is cut", len(fs))
		}
		fs = append(fs, rawFrame{typ: b[0], payload: b[1+k : 1+k+int(n)]})
		b = b[1+k+int(n):]
	}
	return fs
}

// writeSegment encodes revs (after a lease frame for lease 77) into a
// segment that starts at revs[0] and ends with reason "big".
func writeSegment(t *testing.T, revs ...Revision) []byte {
	t.Helper()
	var buf bytes.Buffer
	w, err := NewWriter(&buf, Header{Chain: "c", Epoch: 2, FirstRevision: revs[0].Revision})
	if err != nil {
		t.Fatal(err)
	}
	if err := w.AddLease(Lease{ID: 77, TTL: 60, Remaining: 42}); err != nil {
		t.Fatal(err)
	}
	for _, r := range revs {
		if err := w.AddRevision(r); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := w.Close("big"); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

// readRevisions reads every revision of an encoded segment.
func readRevisions(t *testing.T, b []byte) ([]*Revision, Summary) {
	t.Helper()
	r, err := NewReader(bytes.NewReader(b))
	if err != nil {
		t.Fatal(err)
	}
	var revs []*Revision
	for {
		rev, _, err := r.Next()
		if err == io.EOF {
			return revs, r.Summary()
		}
		if err != nil {
			t.Fatal(err)
		}
		if rev != nil {
			revs = append(revs, rev)
		}
	}
}

func sameRevisions(t *testing.T, got []*Revision, want []Revision) {
	t.Helper()
	if len(got) != len(want) {
		t.Fatalf("%d revisions read, %d written", len(got), len(want))
	}
	for i := range want {
		g, w := got[i], want[i]
		if g.Revision != w.Revision || !g.Time.Equal(w.Time) || len(g.Events) != len(w.Events) {
			t.Fatalf("revision %d read as %d at %v with %d events, written at %v with %d", w.Revision, g.Revision, g.Time, len(g.Events), w.Time, len(w.Events))
		}
		for j := range w.Events {
			if !proto.Equal(g.Events[j], w.Events[j]) {
				t.Fatalf("revision %d, event %d: got %v want %v", w.Revision, j, g.Events[j], w.Events[j])
			}
		}
	}
}

// sizedRevision is a revision of puts whose 'R' frame payload, were it
// one frame, is exactly size bytes: four values of about a quarter each.
func sizedRevision(t *testing.T, rev int64, size int) Revision {
	t.Helper()
	r := Revision{Revision: rev, Time: time.Unix(1_700_000_000, 5)}
	for i := range 4 {
		r.Events = append(r.Events, put(rev, "/k"+strconv.Itoa(i), strings.Repeat("v", size/4-64), 0))
	}
	// Near 1 MiB, a byte more of value is a byte more of frame.
	last := r.Events[3].Kv
	last.Value = bytes.Repeat([]byte("v"), len(last.Value)+size-len(singleFramePayload(r)))
	if got := len(singleFramePayload(r)); got != size {
		t.Fatalf("could not size a revision to %d bytes: %d", size, got)
	}
	return r
}

func TestRevisionAtTargetIsOneFrame(t *testing.T) {
	r := sizedRevision(t, 10, revisionFrameTarget)
	b := writeSegment(t, r)
	fs := splitFrames(t, b)
	if len(fs) != 4 || fs[2].typ != frameRevision {
		t.Fatalf("frames %q, want H L R E", types(fs))
	}
	// Byte for byte the frame the writer always wrote.
	if want := singleFramePayload(r); !bytes.Equal(fs[2].payload, want) {
		t.Fatal("a revision that fits the frame target is not encoded as before")
	}
	got, _ := readRevisions(t, b)
	sameRevisions(t, got, []Revision{r})
}

func TestRevisionJustOverTargetIsTwoFrames(t *testing.T) {
	r := sizedRevision(t, 10, revisionFrameTarget+1)
	b := writeSegment(t, r)
	fs := splitFrames(t, b)
	if got := types(fs); got != "HLRCE" {
		t.Fatalf("frames %q, want HLRCE", got)
	}
	for _, f := range fs {
		if len(f.payload) > revisionFrameTarget {
			t.Fatalf("a %q frame of %d bytes, over the %d target", f.typ, len(f.payload), revisionFrameTarget)
		}
	}
	got, sum := readRevisions(t, b)
	sameRevisions(t, got, []Revision{r})
	if sum.Revisions != 1 || sum.Events != 4 || sum.LastRevision != 10 {
		t.Fatalf("summary %+v", sum)
	}
}

func types(fs []rawFrame) string {
	var s []byte
	for _, f := range fs {
		s = append(s, f.typ)
	}
	return string(s)
}

// deleteRangeKey is key i of a big DeleteRange: 110 bytes.
func deleteRangeKey(b []byte, i int) []byte {
	b = append(b[:0], "/registry/configmaps/bulk/"...)
	b = append(b, keyFiller...)
	return strconv.AppendInt(b, int64(1_000_000_000+i), 10)
}

// keyFiller makes deleteRangeKey's keys about 1 KiB.
var keyFiller = bytes.Repeat([]byte{'k'}, 974)

// TestBigDeleteRange is issue 36's case: one etcd DeleteRange whose
// events are more than a frame could ever hold (about 70 MiB at one
// revision, between two small revisions) — here 70,000 keys of 1 KiB
// (600,000 of 110 bytes make the same bytes, and cost the race detector
// a minute).
func TestBigDeleteRange(t *testing.T) {
	const n, rev = 70_000, 11
	seen := time.Unix(1_700_000_100, 42)
	before := Revision{Revision: rev - 1, Time: seen.Add(-time.Second), Events: []*mvccpb.Event{put(rev-1, "/a", "v", 77)}}
	after := Revision{Revision: rev + 1, Time: seen.Add(time.Second), Events: []*mvccpb.Event{put(rev+1, "/b", "w", 0), del(rev+1, "/a")}}
	start := time.Now()
	b := func() []byte {
		// One allocation each for the events, their key-values and keys:
		// building 600,000 events one by one is the slow part otherwise.
		evs, kvs, keys := make([]mvccpb.Event, n), make([]mvccpb.KeyValue, n), make([]byte, 0, n*1010)
		big := Revision{Revision: rev, Time: seen, Events: make([]*mvccpb.Event, n)}
		var k []byte
		for i := range n {
			k = deleteRangeKey(k, i)
			start := len(keys)
			keys = append(keys, k...)
			kvs[i].Key, kvs[i].ModRevision = keys[start:len(keys):len(keys)], rev
			evs[i].Type, evs[i].Kv = mvccpb.Event_DELETE, &kvs[i]
			big.Events[i] = &evs[i]
		}
		return writeSegment(t, before, big, after)
	}()

	fs := splitFrames(t, b)
	var eventBytes int
	for _, f := range fs[3 : len(fs)-2] {
		eventBytes += len(f.payload)
	}
	wantFrames := "HLR" + "R" + strings.Repeat("C", len(fs)-6) + "RE"
	if got := types(fs); got != wantFrames || len(fs) < 6 {
		t.Fatalf("frames %q", got)
	}
	if eventBytes < 65<<20 || len(fs)-5 > eventBytes/revisionFrameTarget+1 {
		t.Fatalf("%d frames for %d bytes of the big revision", len(fs)-5, eventBytes)
	}
	for _, f := range fs {
		if len(f.payload) > revisionFrameTarget {
			t.Fatalf("a %q frame of %d bytes, over the %d target", f.typ, len(f.payload), revisionFrameTarget)
		}
	}

	t.Log("written", time.Since(start))
	runtime.GC()
	var m0, m1 runtime.MemStats
	runtime.ReadMemStats(&m0)
	got, sum := readRevisions(t, b)
	t.Log("read", time.Since(start))
	runtime.ReadMemStats(&m1)
	// All the reader allocated, freed or not: the revision it returns
	// (decoded events are about 2.5 times their encoding) and one frame
	// buffer, never a copy of the revision's frames.
	if alloc := m1.TotalAlloc - m0.TotalAlloc; alloc > 3*uint64(len(b)) {
		t.Errorf("reading a %d-byte segment allocated %d bytes, over 3 times its size", len(b), alloc)
	} else {
		t.Logf("reading a %d-byte segment allocated %d bytes (%.2f times)", len(b), alloc, float64(alloc)/float64(len(b)))
	}

	sameRevisions(t, []*Revision{got[0], got[2]}, []Revision{before, after})
	big := got[1]
	if big.Revision != rev || !big.Time.Equal(seen) || len(big.Events) != n {
		t.Fatalf("the big revision read as %d at %v with %d events", big.Revision, big.Time, len(big.Events))
	}
	var k []byte
	for i, ev := range big.Events {
		k = deleteRangeKey(k, i)
		if ev.Type != mvccpb.Event_DELETE || !bytes.Equal(ev.Kv.Key, k) || ev.Kv.ModRevision != rev ||
			ev.Kv.CreateRevision != 0 || ev.Kv.Version != 0 || ev.Kv.Value != nil || ev.Kv.Lease != 0 || ev.PrevKv != nil {
			t.Fatalf("event %d read as %v", i, ev)
		}
	}
	want := Summary{
		Header: Header{Chain: "c", Epoch: 2, FirstRevision: rev - 1}, LastRevision: rev + 1,
		Revisions: 3, Events: 1 + n + 2, EndReason: "big",
	}
	if !sum.FirstTime.Equal(before.Time) || !sum.LastTime.Equal(after.Time) {
		t.Fatalf("summary times %v, %v", sum.FirstTime, sum.LastTime)
	}
	sum.FirstTime, sum.LastTime = time.Time{}, time.Time{}
	if sum != want {
		t.Fatalf("summary %+v, want %+v", sum, want)
	}
	// The end frame's counts are the reader's, which it checked; here
	// they are read as written.
	end := decoder{b: fs[len(fs)-1].payload}
	if last, revs, events := end.uvarint(), end.uvarint(), end.uvarint(); last != rev+1 || revs != 3 || events != 1+n+2 {
		t.Fatalf("end frame counts up to %d, %d revisions, %d events", last, revs, events)
	}
}

// splitRevFrame is an 'R' frame saying count events and holding evs.
func splitRevFrame(rev int64, count int, evs ...*mvccpb.Event) []byte {
	b := revFrame(rev)
	b = b[:len(b)-1] // revFrame's count, 0
	b = binary.AppendUvarint(b, uint64(count))
	return append(b, contFrame(evs...)[1:]...)
}

// contFrame is a 'C' frame holding evs.
func contFrame(evs ...*mvccpb.Event) []byte {
	b := []byte{'C'}
	for _, ev := range evs {
		pb, _ := proto.Marshal(ev)
		b = binary.AppendUvarint(b, uint64(len(pb)))
		b = append(b, pb...)
	}
	return b
}

func TestSplitRevisionRead(t *testing.T) {
	hdr := append([]byte{'H'}, `{"chain":"c","epoch":1,"firstRevision":5}`...)
	evs := []*mvccpb.Event{put(5, "a", "1", 0), put(5, "b", "2", 0), del(5, "c")}
	b := frames(hdr, splitRevFrame(5, 3, evs[0]), contFrame(evs[1]), contFrame(evs[2]),
		revFrame(6, put(6, "d", "4", 0)), endFrame(6, 2, 4))
	got, sum := readRevisions(t, b)
	sameRevisions(t, got, []Revision{{Revision: 5, Time: time.Unix(0, 0), Events: evs}, {Revision: 6, Time: time.Unix(0, 0), Events: []*mvccpb.Event{put(6, "d", "4", 0)}}})
	if sum.Revisions != 2 || sum.Events != 4 {
		t.Fatalf("summary %+v", sum)
	}
}

func TestMalformedContinuationRefused(t *testing.T) {
	hdr := append([]byte{'H'}, `{"chain":"c","epoch":1,"firstRevision":5}`...)
	lease := []byte{'L', 18, 120, 2}
	p5, q5, p6 := put(5, "a", "1", 0), put(5, "b", "2", 0), put(6, "c", "3", 0)
	for name, c := range map[string]struct {
		b    []byte
		says string
	}{
		"continuation before any revision": {frames(hdr, contFrame(p5), endFrame(5, 1, 1)), "no revision is split"},
		"continuation after a whole revision": {
			frames(hdr, revFrame(5, p5), contFrame(q5), endFrame(5, 1, 2)), "no revision is split"},
		"continuation after a completed split": {
			frames(hdr, splitRevFrame(5, 2, p5), contFrame(q5), contFrame(q5), endFrame(5, 1, 3)), "no revision is split"},
		"end before the rest": {frames(hdr, splitRevFrame(5, 2, p5), endFrame(5, 1, 1)), "then a 'E' frame comes instead of the rest"},
		"revision before the rest": {
			frames(hdr, splitRevFrame(5, 2, p5), revFrame(6, p6), endFrame(6, 2, 2)), "then a 'R' frame comes instead of the rest"},
		"lease before the rest": {
			frames(hdr, splitRevFrame(5, 2, p5), lease, contFrame(q5), endFrame(5, 1, 2)), "then a 'L' frame comes instead of the rest"},
		"header before the rest": {frames(hdr, splitRevFrame(5, 2, p5), hdr, contFrame(q5), endFrame(5, 1, 2)), "instead of the rest"},
		"cut before the rest":    {frames(hdr, splitRevFrame(5, 2, p5)), "ends inside revision 5, after 1 of its 2 events"},
		"cut inside the rest":    {frames(hdr, splitRevFrame(5, 2, p5), contFrame(q5))[:len(frames(hdr, splitRevFrame(5, 2, p5)))+3], "inside a frame of revision 5"},
		"more events than the count": {
			frames(hdr, splitRevFrame(5, 2, p5), contFrame(q5, del(5, "c")), endFrame(5, 1, 3)), "says it has 2 events, but its frames hold more"},
		"empty continuation": {
			frames(hdr, splitRevFrame(5, 2, p5), contFrame(), contFrame(q5), endFrame(5, 1, 2)), "a frame that holds none"},
		"revision frame without events": {
			frames(hdr, splitRevFrame(5, 2), contFrame(p5, q5), endFrame(5, 1, 2)), "has 0 of its 2 events, then a frame that holds none"},
		"continuation of another revision": {
			frames(hdr, splitRevFrame(5, 2, p5), contFrame(p6), endFrame(5, 1, 2)), "event 1 is not an event of that revision"},
		"continuation with an unknown lease": {
			frames(hdr, splitRevFrame(5, 2, p5), contFrame(put(5, "b", "2", 9)), endFrame(5, 1, 2)), "with lease 9"},
		"continuation damaged": {
			frames(hdr, splitRevFrame(5, 2, p5), []byte{'C', 9, 1}, endFrame(5, 1, 2)), "revision 5, event 1"},
		"event count past the bound": {
			frames(hdr, splitRevFrame(5, MaxRevisionBytes+1, p5), endFrame(5, 1, 1)), "says it has 268435457 events"},
	} {
		err := readAll(c.b)
		if !errors.Is(err, ErrCorrupt) || !strings.Contains(err.Error(), c.says) {
			t.Errorf("%s: %v, want ErrCorrupt saying %q", name, err, c.says)
		}
	}
}

// hugeEvent is the encoding, length first, of an event of revision 5
// that takes size bytes (2 to 256 MiB) in a frame but decodes to one
// small event: its key-value sets the mod revision again and again,
// mostly with a needlessly long varint (protobuf keeps the last value). A
// reader then spends time on it, not memory.
func hugeEvent(size int) []byte {
	long := []byte{0x18, 0x85, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x00}
	short := []byte{0x18, 5}
	kvLen := size - 4 - 1 - 4 // event length, key-value tag, key-value length
	shorts := 1
	for (kvLen-shorts*len(short))%len(long) != 0 {
		shorts++
	}
	kv := bytes.Repeat(long, (kvLen-shorts*len(short))/len(long))
	kv = append(kv, bytes.Repeat(short, shorts)...)
	ev := binary.AppendUvarint([]byte{0x12}, uint64(len(kv)))
	ev = append(ev, kv...)
	return append(binary.AppendUvarint(nil, uint64(len(ev))), ev...)
}

func TestReaderRefusesRevisionOverBound(t *testing.T) {
	hdr := append([]byte{'H'}, `{"chain":"c","epoch":1,"firstRevision":5}`...)
	ev := hugeEvent(MaxFrameSize - 16)
	if decoded := (&mvccpb.Event{}); len(ev) != MaxFrameSize-16 || proto.Unmarshal(ev[4:], decoded) != nil || decoded.Kv.GetModRevision() != 5 {
		t.Fatalf("the huge event is %d bytes and decodes to %v", len(ev), decoded)
	}
	var parts []io.Reader
	head := frames(hdr)
	parts = append(parts, bytes.NewReader(head))
	open := binary.AppendUvarint(nil, 5)
	open = binary.AppendVarint(open, 0)
	open = binary.AppendUvarint(open, 100)
	parts = append(parts, bytes.NewReader(binary.AppendUvarint([]byte{'R'}, uint64(len(open)+len(ev)))), bytes.NewReader(open), bytes.NewReader(ev))
	read := len(ev)
	for read+len(ev) <= MaxRevisionBytes {
		parts = append(parts, bytes.NewReader(binary.AppendUvarint([]byte{'C'}, uint64(len(ev)))), bytes.NewReader(ev))
		read += len(ev)
	}
	// The frame that passes the bound says so, and then the segment
	// ends: a reader that read on would say it was cut.
	parts = append(parts, bytes.NewReader(binary.AppendUvarint([]byte{'C'}, uint64(len(ev)))), bytes.NewReader([]byte{1, 2, 3}))

	runtime.GC()
	var m0, m1 runtime.MemStats
	runtime.ReadMemStats(&m0)
	r, err := NewReader(io.MultiReader(parts...))
	if err != nil {
		t.Fatal(err)
	}
	_, _, err = r.Next()
	runtime.ReadMemStats(&m1)
	want := fmt.Sprintf("revision 5 is more than %d bytes (%d read and a continuation frame of %d), more than the %d one revision may be", read+len(ev), read, len(ev), MaxRevisionBytes)
	if !errors.Is(err, ErrCorrupt) || !strings.Contains(err.Error(), want) {
		t.Fatalf("got %v, want ErrCorrupt saying %q", err, want)
	}
	// The revision's events are held until it is whole, in one frame
	// buffer that grows as bytes arrive (twice a frame at most): the
	// frame past the bound is never read.
	if alloc := m1.TotalAlloc - m0.TotalAlloc; alloc > uint64(read)+3*MaxFrameSize {
		t.Errorf("reading %d bytes of one revision allocated %d", read, alloc)
	}
}

// countingWriter counts what is written through it.
type countingWriter struct{ n int64 }

func (c *countingWriter) Write(p []byte) (int, error) { c.n += int64(len(p)); return len(p), nil }

func TestWriterRefusesRevisionTooLarge(t *testing.T) {
	var cw countingWriter
	w, err := NewWriter(&cw, Header{Chain: "c", FirstRevision: 5})
	if err != nil {
		t.Fatal(err)
	}
	written := cw.n
	// One buffer shared by every value: a revision over the bound costs
	// one frame's worth of memory to build.
	value := make([]byte, MaxFrameSize)
	huge := func(n int, size int) Revision {
		r := Revision{Revision: 5, Time: time.Unix(0, 0)}
		for i := range n {
			ev := put(5, "/k"+strconv.Itoa(i), "", 0)
			ev.Kv.Value = value[:size]
			r.Events = append(r.Events, ev)
		}
		return r
	}
	for name, c := range map[string]struct {
		r    Revision
		says string
	}{
		"over the revision bound":       {huge(5, 60<<20), fmt.Sprintf("revision 5: its 5 events encode to %d bytes, more than the %d one revision may be", 5*eventSize(proto.Size(huge(1, 60<<20).Events[0])), MaxRevisionBytes)},
		"an event over the frame bound": {huge(1, MaxFrameSize), fmt.Sprintf("revision 5: event 0 (key \"/k0\") encodes to %d bytes, more than the %d a segment frame may hold", eventSize(proto.Size(huge(1, MaxFrameSize).Events[0])), MaxFrameSize-3)},
		"an event over the frame bound after others": {
			Revision{Revision: 5, Events: []*mvccpb.Event{put(5, "a", "1", 0), huge(1, MaxFrameSize).Events[0]}}, "revision 5: event 1"},
	} {
		err := w.AddRevision(c.r)
		if !errors.Is(err, ErrRevisionTooLarge) || !strings.Contains(err.Error(), c.says) {
			t.Errorf("%s: %v, want ErrRevisionTooLarge saying %q", name, err, c.says)
		}
		if cw.n != written {
			t.Fatalf("%s: %d bytes written for a revision refused", name, cw.n-written)
		}
	}
	// Nothing was written, so the segment goes on, with that revision.
	var buf bytes.Buffer
	w, _ = NewWriter(&buf, Header{Chain: "c", FirstRevision: 5})
	if err := w.AddRevision(huge(1, MaxFrameSize)); !errors.Is(err, ErrRevisionTooLarge) {
		t.Fatal(err)
	}
	if err := w.AddRevision(Revision{Revision: 5, Events: []*mvccpb.Event{put(5, "a", "1", 0)}}); err != nil {
		t.Fatal(err)
	}
	if _, err := w.Close(""); err != nil {
		t.Fatal(err)
	}
	if err := readAll(buf.Bytes()); err != nil {
		t.Fatal(err)
	}
}

// TestLargestEventRoundTrips writes the largest event a revision's
// first frame may hold, and reads it back: what the writer writes, the
// reader reads.
func TestLargestEventRoundTrips(t *testing.T) {
	head := binary.AppendUvarint(nil, 5)
	head = binary.AppendVarint(head, time.Unix(1, 0).UnixNano())
	head = binary.AppendUvarint(head, 2)
	ev := put(5, "/k", "", 0)
	ev.Kv.Value = make([]byte, MaxFrameSize-len(head)-64)
	for eventSize(proto.Size(ev)) < MaxFrameSize-len(head) {
		ev.Kv.Value = append(ev.Kv.Value, 'v')
	}
	if eventSize(proto.Size(ev)) != MaxFrameSize-len(head) {
		t.Fatalf("could not size an event to %d bytes", MaxFrameSize-len(head))
	}
	r := Revision{Revision: 5, Time: time.Unix(1, 0), Events: []*mvccpb.Event{ev, put(5, "/l", "w", 0)}}
	b := writeSegment(t, r)
	if got := types(splitFrames(t, b)); got != "HLRCE" {
		t.Fatalf("frames %q", got)
	}
	got, _ := readRevisions(t, b)
	sameRevisions(t, got, []Revision{r})
}
