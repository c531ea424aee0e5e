package delta

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/klauspost/compress/zstd"
	"go.etcd.io/etcd/api/v3/mvccpb"

	ebv1 "github.com/kubectl-etcdbackup/kubectl-etcdbackup/api/etcdbackup/v1"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/snapshot"
)

// allocated runs f and returns the bytes it allocated, freed or not: an
// upper bound on how much its heap grew. (No GC first: TotalAlloc counts
// whatever the collector does, and a collection per fuzz input would
// take most of the fuzzer's time.)
func allocated(f func()) uint64 {
	var m0, m1 runtime.MemStats
	runtime.ReadMemStats(&m0)
	f()
	runtime.ReadMemStats(&m1)
	return m1.TotalAlloc - m0.TotalAlloc
}

// zstdBomb compresses head followed by n zero bytes, as an encoder would
// for a segment: a few KB for tens of MiB.
func zstdBomb(t testing.TB, head []byte, n int) []byte {
	t.Helper()
	var out bytes.Buffer
	enc, err := zstd.NewWriter(&out, zstd.WithEncoderConcurrency(1))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := enc.Write(head); err != nil {
		t.Fatal(err)
	}
	zeros := make([]byte, 1<<20)
	for n > 0 {
		k := min(n, len(zeros))
		if _, err := enc.Write(zeros[:k]); err != nil {
			t.Fatal(err)
		}
		n -= k
	}
	if err := enc.Close(); err != nil {
		t.Fatal(err)
	}
	return out.Bytes()
}

// readThroughZstd reads a compressed segment as a restore or fold agent
// does (snapshot.DecompressLimit, bounded by the recorded raw size),
// through a pipe instead of a file, until the reader fails or ends.
func readThroughZstd(compressed []byte, rawSize int64) error {
	pr, pw := io.Pipe()
	go func() {
		_, err := snapshot.DecompressLimit(context.Background(), pw, bytes.NewReader(compressed), ebv1.CompressionZstd, rawSize)
		pw.CloseWithError(err)
	}()
	// Whatever the reader says, the decompressor must stop with it.
	defer pr.CloseWithError(errors.New("reader done"))
	r, err := NewReader(pr)
	if err != nil {
		return err
	}
	for {
		_, _, err := r.Next()
		if err != nil {
			if errors.Is(err, io.EOF) {
				return nil
			}
			return err
		}
	}
}

// A few KB of zstd expanding to a frame of MaxFrameSize — zeros behind a
// frame header of each kind, or behind a revision's valid start — make
// the reader fail at once with a clear error, and cost little memory:
// nothing is sized by a length or count the bytes declare.
func TestReaderBoundsAZstdBomb(t *testing.T) {
	hdr := append([]byte{'H'}, `{"chain":"c","epoch":1,"firstRevision":5}`...)
	frameOf := func(typ byte, prefix ...byte) []byte {
		b := binary.AppendUvarint([]byte{typ}, MaxFrameSize)
		return append(b, prefix...)
	}
	revStart := binary.AppendUvarint(nil, 5)
	revStart = binary.AppendVarint(revStart, time.Now().UnixNano())
	revStart = binary.AppendUvarint(revStart, 1<<27)
	for _, tc := range []struct {
		name string
		head []byte
		says string
	}{
		{"a header frame", []byte(Magic + string(frameOf('H'))), "a 'H' frame says it is 67108864 bytes, more than the 65536 such a frame may be"},
		{"a lease frame", append(frames(hdr), frameOf('L')...), "a 'L' frame says it is 67108864 bytes"},
		{"an end frame", append(frames(hdr), frameOf('E')...), "a 'E' frame says it is 67108864 bytes"},
		{"a revision frame", append(frames(hdr), frameOf('R')...), "revision 0 follows revision 4"},
		{"a revision's events", append(frames(hdr), frameOf('R', revStart...)...), "revision 5, event 0 is not an event of that revision"},
		{"an unknown frame", append(frames(hdr), frameOf('Z')...), "unknown frame type 'Z'"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			raw := len(tc.head) + MaxFrameSize
			bomb := zstdBomb(t, tc.head, MaxFrameSize)
			if len(bomb) > 16<<10 {
				t.Fatalf("the bomb is %d bytes, not a few KB", len(bomb))
			}
			var err error
			alloc := allocated(func() { err = readThroughZstd(bomb, int64(raw)) })
			if !errors.Is(err, ErrCorrupt) || !strings.Contains(err.Error(), tc.says) {
				t.Fatalf("%d bytes of zstd (%d raw): %v, want ErrCorrupt saying %q", len(bomb), raw, err, tc.says)
			}
			if alloc > 32<<20 {
				t.Fatalf("%d bytes of zstd expanding to %d made the reader and its decompressor allocate %d bytes", len(bomb), raw, alloc)
			}
			t.Logf("%d bytes of zstd, %d raw: %d bytes allocated: %v", len(bomb), raw, alloc, err)
		})
	}
}

// Lengths and counts near the bounds, with a few KB behind them: the
// segment is cut short (or refused), and reading it allocates about what
// it holds.
func TestDeclaredLengthsAreBackedByBytes(t *testing.T) {
	hdr := append([]byte{'H'}, `{"chain":"c","epoch":1,"firstRevision":5}`...)
	revStart := binary.AppendUvarint(nil, 5)
	revStart = binary.AppendVarint(revStart, 0)
	revStart = binary.AppendUvarint(revStart, MaxRevisionBytes)
	filler := bytes.Repeat([]byte{0xff}, 4<<10)
	var events []*mvccpb.Event
	for range 100 {
		events = append(events, put(5, "k", "v", 0))
	}
	for name, b := range map[string][]byte{
		"a frame": append(append(append(frames(hdr), binary.AppendUvarint([]byte{'R'}, MaxFrameSize)...), revStart...), contFrame(events...)[1:]...),
		"an event": append(append(append(append(frames(hdr), binary.AppendUvarint([]byte{'R'}, MaxFrameSize)...), revStart...),
			binary.AppendUvarint(nil, MaxFrameSize-64)...), filler...),
		"a header": append(binary.AppendUvarint([]byte(Magic+"H"), maxSmallFrame), filler...),
	} {
		var err error
		alloc := allocated(func() { err = readAll(b) })
		if !errors.Is(err, ErrCorrupt) || !strings.Contains(err.Error(), "cut short") {
			t.Errorf("%s declared large, %d bytes behind it: %v, want ErrCorrupt, cut short", name, len(b), err)
		}
		if alloc > 1<<20 {
			t.Errorf("%s declared large, %d bytes behind it: reading allocated %d bytes", name, len(b), alloc)
		}
	}
}

// An end reason too long for an end frame is cut, and the segment reads.
func TestLongEndReasonIsCut(t *testing.T) {
	var buf bytes.Buffer
	w, err := NewWriter(&buf, Header{Chain: "c", FirstRevision: 5})
	if err != nil {
		t.Fatal(err)
	}
	reason := strings.Repeat("é", maxSmallFrame)
	sum, err := w.Close(reason)
	if err != nil {
		t.Fatal(err)
	}
	if len(sum.EndReason) > maxEndReason || !strings.HasPrefix(reason, sum.EndReason) || !strings.HasSuffix(sum.EndReason, "é") {
		t.Fatalf("a reason of %d bytes recorded as %d bytes, ending %q", len(reason), len(sum.EndReason), sum.EndReason[len(sum.EndReason)-4:])
	}
	r, err := NewReader(&buf)
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := r.Next(); !errors.Is(err, io.EOF) || r.Summary().EndReason != sum.EndReason {
		t.Fatalf("read back: %v, reason of %d bytes", err, len(r.Summary().EndReason))
	}
}

// fuzzSegment is a segment the Writer makes of revs (and a lease before
// each revision whose events use one), split into frames of at most
// frameTarget bytes.
func fuzzSegment(f *testing.F, frameTarget int, reason string, revs ...Revision) []byte {
	f.Helper()
	var buf bytes.Buffer
	w, err := NewWriter(&buf, Header{Chain: "f", Epoch: 2, FirstRevision: revs[0].Revision})
	if err != nil {
		f.Fatal(err)
	}
	w.frameTarget = frameTarget
	for _, r := range revs {
		for _, ev := range r.Events {
			if ev.Kv.Lease != 0 {
				if err := w.AddLease(Lease{ID: ev.Kv.Lease, TTL: 60, Remaining: 30}); err != nil {
					f.Fatal(err)
				}
			}
		}
		if err := w.AddRevision(r); err != nil {
			f.Fatal(err)
		}
	}
	if _, err := w.Close(reason); err != nil {
		f.Fatal(err)
	}
	return buf.Bytes()
}

// item is what Next returned once.
type item struct {
	rev   *Revision
	lease *Lease
}

// readItems reads a segment to its end or first error.
func readItems(b []byte) ([]item, Summary, error) {
	r, err := NewReader(bytes.NewReader(b))
	if err != nil {
		return nil, Summary{}, err
	}
	var items []item
	for {
		rev, l, err := r.Next()
		if errors.Is(err, io.EOF) {
			return items, r.Summary(), nil
		}
		if err != nil {
			return items, r.Summary(), err
		}
		if (rev == nil) == (l == nil) {
			return items, r.Summary(), fmt.Errorf("Next returned revision %v and lease %v", rev, l)
		}
		items = append(items, item{rev, l})
	}
}

// FuzzSegmentReader reads arbitrary bytes as a delta segment — a damaged
// store, a compromised delta agent: it never panics; every error but a
// clean end wraps ErrCorrupt; it allocates in proportion to the bytes,
// whatever they declare; and a segment it accepts holds what the format
// promises (revisions consecutive from the header's first, events of
// their revision, put leases described before) and, written again by
// the Writer, reads back the same.
func FuzzSegmentReader(f *testing.F) {
	at := time.Unix(1_700_000_000, 5)
	f.Add(fuzzSegment(f, revisionFrameTarget, "rotated",
		Revision{Revision: 10, Time: at, Events: []*mvccpb.Event{put(10, "/a", "v", 77)}},
		Revision{Revision: 11, Time: at.Add(time.Second), Events: []*mvccpb.Event{put(11, "/b", "w", 0), del(11, "/a")}}))
	// Split revisions: a tiny frame target puts each event in a frame.
	f.Add(fuzzSegment(f, 8, "",
		Revision{Revision: 3, Time: at, Events: []*mvccpb.Event{put(3, "a", "1", 0), put(3, "b", "2", 9), del(3, "c")}},
		Revision{Revision: 4, Time: at, Events: []*mvccpb.Event{del(4, "a")}}))
	hdr := append([]byte{'H'}, `{"chain":"c","epoch":1,"firstRevision":5}`...)
	f.Add(frames(hdr, endFrame(4, 0, 0)))
	f.Add(frames(hdr, splitRevFrame(5, 2, put(5, "a", "1", 0)), contFrame(put(5, "b", "2", 0)), endFrame(5, 1, 2)))
	f.Add(append(frames(hdr), binary.AppendUvarint([]byte{'R'}, MaxFrameSize)...))
	f.Add(binary.AppendUvarint([]byte(Magic+"H"), 1<<40))
	f.Add([]byte("\x28\xb5\x2f\xfd some zstd"))
	f.Fuzz(func(t *testing.T, b []byte) {
		var items []item
		var sum Summary
		var err error
		alloc := allocated(func() { items, sum, err = readItems(b) })
		// Decoded events cost a few hundred bytes each, from as few as
		// six; buffers start at 64 KiB.
		if most := uint64(1<<20 + 256*len(b)); alloc > most {
			t.Fatalf("reading %d bytes allocated %d, more than %d", len(b), alloc, most)
		}
		if err != nil {
			if !errors.Is(err, ErrCorrupt) {
				t.Fatalf("an error that is not ErrCorrupt: %v", err)
			}
			return
		}
		next, leases, events := sum.FirstRevision, map[int64]bool{}, int64(0)
		var again bytes.Buffer
		w, werr := NewWriter(&again, sum.Header)
		if werr != nil {
			t.Fatalf("the Writer refuses the header the reader accepted: %v", werr)
		}
		for _, it := range items {
			if it.lease != nil {
				leases[it.lease.ID] = true
				if err := w.AddLease(*it.lease); err != nil {
					t.Fatal(err)
				}
				continue
			}
			r := it.rev
			if r.Revision != next || len(r.Events) == 0 {
				t.Fatalf("revision %d with %d events where %d was next", r.Revision, len(r.Events), next)
			}
			for _, ev := range r.Events {
				if ev.Kv == nil || ev.Kv.ModRevision != r.Revision || ev.Type == mvccpb.Event_PUT && ev.Kv.Lease != 0 && !leases[ev.Kv.Lease] {
					t.Fatalf("revision %d holds event %v", r.Revision, ev)
				}
			}
			next++
			events += int64(len(r.Events))
			if err := w.AddRevision(*r); err != nil {
				t.Fatalf("the Writer refuses revision %d the reader accepted: %v", r.Revision, err)
			}
		}
		if sum.LastRevision != next-1 || sum.Events != events {
			t.Fatalf("summary %+v after revisions up to %d with %d events", sum, next-1, events)
		}
		wrote, err := w.Close(sum.EndReason)
		if err != nil {
			t.Fatal(err)
		}
		items2, sum2, err := readItems(again.Bytes())
		if err != nil || len(items2) != len(items) || sum2.Header != sum.Header || sum2.EndReason != wrote.EndReason ||
			sum2.LastRevision != sum.LastRevision || sum2.Revisions != sum.Revisions || sum2.Events != sum.Events ||
			!sum2.FirstTime.Equal(sum.FirstTime) || !sum2.LastTime.Equal(sum.LastTime) {
			t.Fatalf("written again, it reads as %d items, %+v (%v); it was %d items, %+v", len(items2), sum2, err, len(items), sum)
		}
	})
}
