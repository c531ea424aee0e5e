package delta

import (
	"encoding/binary"
	"math"
	"slices"
	"testing"
	"time"
)

// fuzzBytes hands out a fuzz input's bytes as small choices; past the
// end every choice is 0.
type fuzzBytes []byte

func (b *fuzzBytes) byte() byte {
	if len(*b) == 0 {
		return 0
	}
	c := (*b)[0]
	*b = (*b)[1:]
	return c
}

// revision is mostly a small revision near base, sometimes one of the
// values manifests must not be trusted with (0, negative, the int64
// extremes), so that arithmetic on them is exercised.
func (b *fuzzBytes) revision(base int64) int64 {
	c := b.byte()
	switch c {
	case 250:
		return 0
	case 251:
		return -1
	case 252:
		return math.MaxInt64
	case 253:
		return math.MinInt64
	case 254:
		return math.MaxInt64 - 1
	case 255:
		var v [8]byte
		for i := range v {
			v[i] = b.byte()
		}
		return int64(binary.LittleEndian.Uint64(v[:]))
	}
	return base + int64(c)
}

func (b *fuzzBytes) time() time.Time {
	c := b.byte()
	if c == 255 {
		return time.Time{}
	}
	return t0.Add(time.Duration(c) * 10 * time.Second)
}

// chainWorld decodes a fuzz input into fulls, their chains and a point.
func chainWorld(data []byte) ([]FullInfo, map[string][]SegmentInfo, Point) {
	b := fuzzBytes(data)
	names := []string{"f0", "f1", "f2"}
	var fulls []FullInfo
	for i := range 1 + int(b.byte()%3) {
		fulls = append(fulls, FullInfo{Name: names[i], Revision: b.revision(int64(i) * 100), Time: b.time(), Target: "prod", AuthRevision: uint64(b.byte() % 3)})
	}
	chains := map[string][]SegmentInfo{}
	for i := range int(b.byte() % 16) {
		owner := names[int(b.byte())%len(names)]
		chain := owner
		switch b.byte() % 8 {
		case 0:
			chain = ""
		case 1:
			chain = "other"
		}
		base := int64(0)
		if j := slices.IndexFunc(fulls, func(f FullInfo) bool { return f.Name == owner }); j >= 0 {
			base = fulls[j].Revision
		}
		first := b.revision(base)
		last := b.revision(first)
		flags := b.byte()
		chains[owner] = append(chains[owner], SegmentInfo{
			Name: owner + ".seg" + itoa(int64(i)), Chain: chain, Epoch: int64(b.byte() % 4),
			FirstRevision: first, LastRevision: last, FirstTime: b.time(), LastTime: b.time(),
			HistoryBreak: flags&1 != 0, ClockOffset: time.Duration(int8(flags)) * 100 * time.Millisecond,
			AuthRevision: uint64(flags>>4) % 3,
		})
	}
	var p Point
	switch b.byte() % 4 {
	case 1:
		p.Revision = b.revision(0)
	case 2:
		p.Time = b.time()
	case 3:
		p.Revision, p.Time = b.revision(0), b.time()
	}
	return fulls, chains, p
}

// contiguousFrom checks that segs follow full revision after revision,
// each holding some, with epochs that never go back.
func contiguousFrom(t *testing.T, full FullInfo, segs []SegmentInfo) {
	t.Helper()
	last, epoch := full.Revision, int64(math.MinInt64)
	for _, s := range segs {
		if last == math.MaxInt64 || s.FirstRevision != last+1 || s.LastRevision < s.FirstRevision || s.Epoch < epoch {
			t.Fatalf("segments %v do not follow full %s (revision %d) one after another: %s holds %d..%d, epoch %d, after revision %d, epoch %d",
				names(segs), full.Name, full.Revision, s.Name, s.FirstRevision, s.LastRevision, s.Epoch, last, epoch)
		}
		if s.Chain != "" && s.Chain != full.Name {
			t.Fatalf("segment %s of chain %s used for full %s", s.Name, s.Chain, full.Name)
		}
		last, epoch = s.LastRevision, s.Epoch
	}
}

// FuzzPlan feeds Contiguous, Window and Plan manifests no upload would
// make — overlapping, gapped, of other chains, with revisions at int64's
// ends — as a damaged store or a writer of it could: they never panic,
// a chain's segments follow its full contiguously, and a plan replays a
// stored full's own contiguous segments up to a point inside them.
func FuzzPlan(f *testing.F) {
	// fulls f0 (rev 0+a), segments, point: see chainWorld.
	f.Add([]byte{0, 100, 1, 0, 3, 0, 2, 1, 50, 0, 1, 2, 0, 0, 51, 99, 0, 2, 3, 1, 75})
	f.Add([]byte{1, 100, 10, 0, 0, 20, 0, 4, 0, 2, 1, 50, 0, 2, 5, 1, 2, 0, 51, 60, 0, 2, 8, 1, 1, 2, 1, 150, 0, 1, 20, 2, 30})
	f.Add([]byte{2, 252, 1, 0, 0, 2, 0, 2, 0, 0, 253, 252, 0, 1, 2, 3, 0, 0, 0, 253, 252, 0, 1, 2, 3, 1, 252})
	f.Add([]byte{0, 254, 1, 0, 2, 0, 2, 0, 0, 1, 0, 0, 2, 0, 0, 2, 5, 7, 0, 1})
	f.Add([]byte{0, 255, 1, 2, 3, 4, 5, 6, 7, 8, 3, 0, 1})
	f.Fuzz(func(t *testing.T, data []byte) {
		fulls, chains, p := chainWorld(data)
		byName := map[string]FullInfo{}
		for _, full := range fulls {
			byName[full.Name] = full
			segs := chains[full.Name]
			used, problems := Contiguous(full, segs)
			contiguousFrom(t, full, used)
			empties := 0
			for _, s := range segs {
				if s.FirstRevision >= 1 && s.LastRevision == s.FirstRevision-1 && (s.Chain == "" || s.Chain == full.Name) {
					empties++
				}
			}
			if len(used)+len(problems)+empties != len(segs) {
				t.Fatalf("of %d segments, %d used, %d empty and %d problems: %q", len(segs), len(used), empties, len(problems), problems)
			}
		}
		if earliest, _, ok := Window(fulls, chains); !ok || !slices.ContainsFunc(fulls, func(f FullInfo) bool { return f.Revision == earliest.Revision && f.Time.Equal(earliest.Time) }) {
			t.Fatalf("window from %v (%v), not a full of %v", earliest, ok, fulls)
		}
		res, err := Plan(fulls, chains, p)
		if err != nil {
			return
		}
		full, ok := byName[res.Full.Name]
		if !ok || full != res.Full {
			t.Fatalf("planned on full %+v, not one stored", res.Full)
		}
		contiguousFrom(t, full, res.Segments)
		stored, _ := Contiguous(full, chains[full.Name])
		if len(res.Segments) > len(stored) || !slices.EqualFunc(res.Segments, stored[:len(res.Segments)], func(a, b SegmentInfo) bool { return a == b }) {
			t.Fatalf("planned segments %v, not a start of the chain %v", names(res.Segments), names(stored))
		}
		end := full.Revision
		if n := len(res.Segments); n > 0 {
			end = res.Segments[n-1].LastRevision
		}
		if res.ToRevision != 0 && (res.ToRevision < full.Revision || res.ToRevision > end) {
			t.Fatalf("plan to revision %d from full %s (revision %d) and segments ending at %d", res.ToRevision, full.Name, full.Revision, end)
		}
		if p.Revision > 0 && res.ToRevision != p.Revision {
			t.Fatalf("revision %d planned to revision %d", p.Revision, res.ToRevision)
		}
	})
}
