package delta

import (
	"bytes"
	"encoding/binary"
	"errors"
	"io"
	"strings"
	"testing"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	"google.golang.org/protobuf/proto"
)

func put(rev int64, key, val string, lease int64) *mvccpb.Event {
	return &mvccpb.Event{Type: mvccpb.Event_PUT, Kv: &mvccpb.KeyValue{Key: []byte(key), Value: []byte(val), CreateRevision: rev, ModRevision: rev, Version: 1, Lease: lease}}
}

func del(rev int64, key string) *mvccpb.Event {
	return &mvccpb.Event{Type: mvccpb.Event_DELETE, Kv: &mvccpb.KeyValue{Key: []byte(key), ModRevision: rev}}
}

// segment writes a segment of revisions first..first+n-1, a lease before
// the first, and returns its bytes.
func segment(t *testing.T, first int64, n int, reason string) ([]byte, []Revision) {
	t.Helper()
	var buf bytes.Buffer
	w, err := NewWriter(&buf, Header{Chain: "c", Epoch: 3, FirstRevision: first})
	if err != nil {
		t.Fatal(err)
	}
	if err := w.AddLease(Lease{ID: 77, TTL: 60, Remaining: 42}); err != nil {
		t.Fatal(err)
	}
	var revs []Revision
	base := time.Unix(1_700_000_000, 123)
	for i := 0; i < n; i++ {
		rev := first + int64(i)
		r := Revision{Revision: rev, Time: base.Add(time.Duration(i) * time.Second), Events: []*mvccpb.Event{put(rev, "/a", "v", 77)}}
		if i%2 == 1 {
			r.Events = append(r.Events, del(rev, "/b"))
		}
		if err := w.AddRevision(r); err != nil {
			t.Fatal(err)
		}
		revs = append(revs, r)
	}
	if _, err := w.Close(reason); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes(), revs
}

func TestRoundTrip(t *testing.T) {
	b, revs := segment(t, 10, 5, "rotated")
	r, err := NewReader(bytes.NewReader(b))
	if err != nil {
		t.Fatal(err)
	}
	if h := r.Header(); h != (Header{Chain: "c", Epoch: 3, FirstRevision: 10}) {
		t.Fatalf("header %+v", h)
	}
	var got []Revision
	var leases []Lease
	for {
		rev, l, err := r.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		if (rev == nil) == (l == nil) {
			t.Fatalf("Next returned revision %v and lease %v", rev, l)
		}
		if l != nil {
			leases = append(leases, *l)
		} else {
			got = append(got, *rev)
		}
	}
	if len(leases) != 1 || leases[0] != (Lease{ID: 77, TTL: 60, Remaining: 42}) {
		t.Fatalf("leases %+v", leases)
	}
	if len(got) != len(revs) {
		t.Fatalf("%d revisions read, %d written", len(got), len(revs))
	}
	for i := range revs {
		if got[i].Revision != revs[i].Revision || !got[i].Time.Equal(revs[i].Time) || len(got[i].Events) != len(revs[i].Events) {
			t.Fatalf("revision %d: got %+v want %+v", i, got[i], revs[i])
		}
		for j := range revs[i].Events {
			if !proto.Equal(got[i].Events[j], revs[i].Events[j]) {
				t.Fatalf("revision %d event %d: got %v want %v", i, j, got[i].Events[j], revs[i].Events[j])
			}
		}
	}
	s := r.Summary()
	if s.LastRevision != 14 || s.Revisions != 5 || s.Events != 7 || s.EndReason != "rotated" || !s.FirstTime.Equal(revs[0].Time) || !s.LastTime.Equal(revs[4].Time) {
		t.Fatalf("summary %+v", s)
	}
	if _, _, err := r.Next(); err != io.EOF {
		t.Fatalf("Next after the end: %v", err)
	}
}

func TestEmptySegment(t *testing.T) {
	b, _ := segment(t, 10, 0, "")
	r, err := NewReader(bytes.NewReader(b))
	if err != nil {
		t.Fatal(err)
	}
	for {
		_, _, err := r.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
	}
	if s := r.Summary(); s.LastRevision != 9 || s.Revisions != 0 {
		t.Fatalf("summary %+v", s)
	}
}

func readAll(b []byte) error {
	r, err := NewReader(bytes.NewReader(b))
	if err != nil {
		return err
	}
	for {
		_, _, err := r.Next()
		if err == io.EOF {
			return nil
		}
		if err != nil {
			return err
		}
	}
}

func TestTruncationDetected(t *testing.T) {
	b, _ := segment(t, 10, 4, "done")
	// Every cut, at every byte, is refused as corrupt: none reads as a
	// shorter valid segment.
	for n := 0; n < len(b); n++ {
		err := readAll(b[:n])
		if !errors.Is(err, ErrCorrupt) {
			t.Fatalf("cut at %d of %d bytes: %v, want ErrCorrupt", n, len(b), err)
		}
	}
	if err := readAll(append(append([]byte{}, b...), 'x')); !errors.Is(err, ErrCorrupt) {
		t.Fatalf("trailing byte: %v", err)
	}
}

func TestNotASegment(t *testing.T) {
	err := readAll([]byte("\x28\xb5\x2f\xfd some zstd"))
	if !errors.Is(err, ErrCorrupt) || !errors.Is(err, ErrNotSegment) {
		t.Fatalf("got %v", err)
	}
}

func TestAbsurdFrameLength(t *testing.T) {
	var b bytes.Buffer
	b.WriteString(Magic)
	b.WriteByte('H')
	b.Write(binary.AppendUvarint(nil, 1<<40))
	err := readAll(b.Bytes())
	if !errors.Is(err, ErrCorrupt) || !strings.Contains(err.Error(), "more than") {
		t.Fatalf("got %v", err)
	}
}

func TestWriterRefuses(t *testing.T) {
	w, err := NewWriter(io.Discard, Header{Chain: "c", FirstRevision: 5})
	if err != nil {
		t.Fatal(err)
	}
	for name, r := range map[string]Revision{
		"not the first":      {Revision: 6, Events: []*mvccpb.Event{put(6, "k", "v", 0)}},
		"no events":          {Revision: 5},
		"wrong mod revision": {Revision: 5, Events: []*mvccpb.Event{put(4, "k", "v", 0)}},
		"no kv":              {Revision: 5, Events: []*mvccpb.Event{{}}},
	} {
		if err := w.AddRevision(r); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
	if err := w.AddRevision(Revision{Revision: 5, Events: []*mvccpb.Event{put(5, "k", "v", 0)}}); err != nil {
		t.Fatal(err)
	}
	for _, rev := range []int64{5, 7} {
		if err := w.AddRevision(Revision{Revision: rev, Events: []*mvccpb.Event{put(rev, "k", "v", 0)}}); err == nil {
			t.Errorf("revision %d after 5 accepted", rev)
		}
	}
	if s := w.Summary(); s.LastRevision != 5 || s.Revisions != 1 {
		t.Fatalf("summary %+v", s)
	}
	if _, err := w.Close(""); err != nil {
		t.Fatal(err)
	}
	if err := w.AddRevision(Revision{Revision: 6, Events: []*mvccpb.Event{put(6, "k", "v", 0)}}); err == nil {
		t.Error("revision after Close accepted")
	}
	if _, err := NewWriter(io.Discard, Header{Chain: "c"}); err == nil {
		t.Error("first revision 0 accepted")
	}
}

// frames builds a segment from raw frames, for what the Writer refuses
// to write.
func frames(fs ...[]byte) []byte {
	b := []byte(Magic)
	for _, f := range fs {
		b = append(b, f[0])
		b = binary.AppendUvarint(b, uint64(len(f)-1))
		b = append(b, f[1:]...)
	}
	return b
}

func revFrame(rev int64, evs ...*mvccpb.Event) []byte {
	b := []byte{'R'}
	b = binary.AppendUvarint(b, uint64(rev))
	b = binary.AppendVarint(b, 0)
	b = binary.AppendUvarint(b, uint64(len(evs)))
	for _, ev := range evs {
		pb, _ := proto.Marshal(ev)
		b = binary.AppendUvarint(b, uint64(len(pb)))
		b = append(b, pb...)
	}
	return b
}

func endFrame(last, revs, events int64) []byte {
	b := []byte{'E'}
	for _, v := range []int64{last, revs, events, 0} {
		b = binary.AppendUvarint(b, uint64(v))
	}
	return b
}

func TestReaderRefuses(t *testing.T) {
	hdr := append([]byte{'H'}, `{"chain":"c","epoch":1,"firstRevision":5}`...)
	for name, b := range map[string][]byte{
		"gap":              frames(hdr, revFrame(5, put(5, "k", "v", 0)), revFrame(7, put(7, "k", "v", 0)), endFrame(7, 2, 2)),
		"wrong first":      frames(hdr, revFrame(6, put(6, "k", "v", 0)), endFrame(6, 1, 1)),
		"mod revision":     frames(hdr, revFrame(5, put(4, "k", "v", 0)), endFrame(5, 1, 1)),
		"no events":        frames(hdr, revFrame(5), endFrame(5, 1, 0)),
		"counts differ":    frames(hdr, revFrame(5, put(5, "k", "v", 0)), endFrame(5, 1, 2)),
		"unknown lease":    frames(hdr, revFrame(5, put(5, "k", "v", 9)), endFrame(5, 1, 1)),
		"no header":        frames(revFrame(5, put(5, "k", "v", 0)), endFrame(5, 1, 1)),
		"second header":    frames(hdr, hdr, endFrame(4, 0, 0)),
		"unknown frame":    frames(hdr, []byte{'X', 1}, endFrame(4, 0, 0)),
		"no end":           frames(hdr, revFrame(5, put(5, "k", "v", 0))),
		"header not json":  frames([]byte("H{"), endFrame(4, 0, 0)),
		"event count huge": frames(hdr, []byte{'R', 5, 0, 0x80, 0x80, 0x80, 0x01}, endFrame(5, 1, 1)),
	} {
		if err := readAll(b); !errors.Is(err, ErrCorrupt) {
			t.Errorf("%s: %v, want ErrCorrupt", name, err)
		}
	}
	if err := readAll(frames(hdr, revFrame(5, put(5, "k", "v", 0)), endFrame(5, 1, 1))); err != nil {
		t.Fatalf("the valid control: %v", err)
	}
}
