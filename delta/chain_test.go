package delta

import (
	"errors"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"
)

var t0 = time.Date(2026, 1, 2, 3, 0, 0, 0, time.UTC)

// seg is a segment of chain c holding first..last, seen at t0 + revision
// seconds.
func seg(c string, epoch, first, last int64) SegmentInfo {
	return SegmentInfo{
		Name: c + ".delta-" + itoa(first) + "-e" + itoa(epoch), Chain: c, Epoch: epoch,
		FirstRevision: first, LastRevision: last,
		FirstTime: t0.Add(time.Duration(first) * time.Second), LastTime: t0.Add(time.Duration(last) * time.Second),
	}
}

func itoa(i int64) string { return strconv.FormatInt(i, 10) }

func names(ss []SegmentInfo) []string {
	var n []string
	for _, s := range ss {
		n = append(n, s.Name)
	}
	return n
}

func TestContiguous(t *testing.T) {
	full := FullInfo{Name: "f", Revision: 100}
	for _, tc := range []struct {
		name     string
		segs     []SegmentInfo
		want     []string
		problems []string // substrings, one per problem, in order
	}{
		{name: "none"},
		{name: "in order", segs: []SegmentInfo{seg("f", 1, 101, 150), seg("f", 1, 151, 200)}, want: []string{"f.delta-101-e1", "f.delta-151-e1"}},
		{name: "shuffled", segs: []SegmentInfo{seg("f", 1, 151, 200), seg("f", 1, 101, 150)}, want: []string{"f.delta-101-e1", "f.delta-151-e1"}},
		{name: "gap", segs: []SegmentInfo{seg("f", 1, 101, 150), seg("f", 1, 160, 200)}, want: []string{"f.delta-101-e1"},
			problems: []string{"revisions 151..159 are missing"}},
		{name: "first missing", segs: []SegmentInfo{seg("f", 1, 102, 150)},
			problems: []string{"revisions 101..101 are missing"}},
		{name: "higher epoch wins", segs: []SegmentInfo{seg("f", 1, 101, 200), seg("f", 2, 101, 150), seg("f", 2, 151, 170)},
			want: []string{"f.delta-101-e2", "f.delta-151-e2"}, problems: []string{"f.delta-101-e1 (revisions 101..200, epoch 1) not used: epoch 1 is older"}},
		{name: "deposed writer after a takeover", segs: []SegmentInfo{seg("f", 1, 101, 150), seg("f", 2, 151, 170), seg("f", 1, 171, 200)},
			want: []string{"f.delta-101-e1", "f.delta-151-e2"}, problems: []string{"f.delta-171-e1 (revisions 171..200, epoch 1) not used: epoch 1 is older"}},
		{name: "stale epoch exactly at the end is not used", segs: []SegmentInfo{seg("f", 2, 101, 150), seg("f", 1, 151, 200)},
			want: []string{"f.delta-101-e2"}, problems: []string{"deposed"}},
		{name: "overlap not at the start", segs: []SegmentInfo{seg("f", 1, 101, 150), seg("f", 1, 140, 200)},
			want: []string{"f.delta-101-e1"}, problems: []string{"overlaps"}},
		{name: "before the full", segs: []SegmentInfo{seg("f", 1, 90, 99), seg("f", 1, 101, 110)},
			want: []string{"f.delta-101-e1"}, problems: []string{"at or before the full"}},
		{name: "other chain", segs: []SegmentInfo{seg("g", 1, 101, 150)}, problems: []string{"belongs to chain g"}},
		{name: "empty segments skipped", segs: []SegmentInfo{seg("f", 1, 101, 100), seg("f", 1, 101, 110)}, want: []string{"f.delta-101-e1"}},
		{name: "damaged manifest", segs: []SegmentInfo{seg("f", 1, 101, 50)}, problems: []string{"damaged"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			used, problems := Contiguous(full, tc.segs)
			if got := names(used); !slices.Equal(got, tc.want) {
				t.Errorf("used %v, want %v", got, tc.want)
			}
			if len(problems) != len(tc.problems) {
				t.Fatalf("problems %q, want ones containing %q", problems, tc.problems)
			}
			for i := range problems {
				if !strings.Contains(problems[i], tc.problems[i]) {
					t.Errorf("problem %q does not contain %q", problems[i], tc.problems[i])
				}
			}
		})
	}
}

func TestPlan(t *testing.T) {
	fulls := []FullInfo{
		{Name: "f100", Revision: 100, Time: t0.Add(100 * time.Second), Target: "prod"},
		{Name: "f300", Revision: 300, Time: t0.Add(300 * time.Second), Target: "prod"},
		{Name: "f500", Revision: 500, Time: t0.Add(500 * time.Second), Target: "prod"},
	}
	chains := map[string][]SegmentInfo{
		// f100 reaches 350; f300 reaches 400 (a gap after); f500 none.
		"f100": {seg("f100", 1, 101, 200), seg("f100", 1, 201, 350)},
		"f300": {seg("f300", 1, 301, 400), seg("f300", 1, 420, 480)},
	}
	at := func(rev int64) time.Time { return t0.Add(time.Duration(rev) * time.Second) }
	for _, tc := range []struct {
		name    string
		p       Point
		full    string
		segs    []string
		to      int64
		wantErr string
	}{
		{name: "revision in the first segment", p: Point{Revision: 150}, full: "f100", segs: []string{"f100.delta-101-e1"}, to: 150},
		{name: "revision at a segment's end", p: Point{Revision: 200}, full: "f100", segs: []string{"f100.delta-101-e1"}, to: 200},
		{name: "revision after a boundary", p: Point{Revision: 201}, full: "f100", segs: []string{"f100.delta-101-e1", "f100.delta-201-e1"}, to: 201},
		{name: "the full's own revision", p: Point{Revision: 100}, full: "f100", to: 100},
		{name: "newest full that reaches", p: Point{Revision: 320}, full: "f300", segs: []string{"f300.delta-301-e1"}, to: 320},
		{name: "newest full itself", p: Point{Revision: 500}, full: "f500", to: 500},
		{name: "before the oldest full", p: Point{Revision: 5}, wantErr: "revision 5 is before the oldest full backup of target prod (revision 100 at 2026-01-02T03:01:40Z, backup f100)"},
		{name: "after the newest event", p: Point{Revision: 501}, wantErr: "revision 501 is after the newest event stored of target prod (revision 500 at"},
		{name: "in a gap", p: Point{Revision: 410}, wantErr: "no chain of target prod covers revision 410"},
		{name: "newest", p: Point{}, full: "f500", to: 500},
		{name: "time in a segment", p: Point{Time: at(150).Add(time.Millisecond)}, full: "f100", segs: []string{"f100.delta-101-e1"}},
		{name: "time at a segment's end", p: Point{Time: at(200).Add(time.Millisecond)}, full: "f100", segs: []string{"f100.delta-101-e1"}, to: 200},
		{name: "time in the newer chain", p: Point{Time: at(350)}, full: "f300", segs: []string{"f300.delta-301-e1"}},
		{name: "time before the oldest full", p: Point{Time: at(50)}, wantErr: "before the oldest full backup of target prod"},
		{name: "time after the newest event", p: Point{Time: at(600)}, wantErr: "after the newest event stored of target prod (revision 500"},
		// The window's end is inclusive: the newest stamp itself (found on
		// the sandbox: a time equal to a chain's newest stamp was refused).
		{name: "time exactly the newest event", p: Point{Time: at(500)}, full: "f500", to: 500},
		{name: "just after the newest event", p: Point{Time: at(500).Add(time.Nanosecond)}, wantErr: "after the newest event stored"},
		{name: "both", p: Point{Revision: 1, Time: at(1)}, wantErr: "not both"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			res, err := Plan(fulls, chains, tc.p)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("error %v, want one containing %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if res.Full.Name != tc.full || !slices.Equal(names(res.Segments), tc.segs) || res.ToRevision != tc.to || res.Point != tc.p {
				t.Fatalf("got full %s, segments %v, to %d; want %s, %v, %d", res.Full.Name, names(res.Segments), res.ToRevision, tc.full, tc.segs, tc.to)
			}
		})
	}
	if _, err := Plan(nil, nil, Point{}); !errors.Is(err, ErrNotRecoverable) {
		t.Fatalf("no fulls: %v", err)
	}
}

// A time equal to the newest stamp of the newest chain is that chain's
// last revision.
func TestTimeAtTheNewestStamp(t *testing.T) {
	fulls := []FullInfo{{Name: "f100", Revision: 100, Time: t0.Add(100 * time.Second), Target: "prod"}}
	chains := map[string][]SegmentInfo{"f100": {seg("f100", 1, 101, 200), seg("f100", 1, 201, 350)}}
	p := Point{Time: t0.Add(350 * time.Second)}
	res, err := Plan(fulls, chains, p)
	if err != nil {
		t.Fatal(err)
	}
	if res.ReplayPoint().Revision != 350 || len(res.Segments) != 2 {
		t.Fatalf("planned %+v (replay to %v); want both segments, to revision 350", res, res.ReplayPoint())
	}
}

func TestWindow(t *testing.T) {
	fulls := []FullInfo{{Name: "b", Revision: 300, Time: t0.Add(300 * time.Second)}, {Name: "a", Revision: 100, Time: t0.Add(100 * time.Second)}}
	for _, tc := range []struct {
		name           string
		chains         map[string][]SegmentInfo
		earliest, last int64
	}{
		{name: "fulls only", earliest: 100, last: 300},
		{name: "newest chain", chains: map[string][]SegmentInfo{"b": {seg("b", 1, 301, 320)}}, earliest: 100, last: 320},
		{name: "older chain reaches further", chains: map[string][]SegmentInfo{"a": {seg("a", 1, 101, 400)}}, earliest: 100, last: 400},
		{name: "gap cuts the chain", chains: map[string][]SegmentInfo{"b": {seg("b", 1, 301, 320), seg("b", 1, 330, 340)}}, earliest: 100, last: 320},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e, l, ok := Window(fulls, tc.chains)
			if !ok || e.Revision != tc.earliest || l.Revision != tc.last || !l.Time.Equal(t0.Add(time.Duration(tc.last)*time.Second)) {
				t.Fatalf("window %+v .. %+v (%v), want %d..%d", e, l, ok, tc.earliest, tc.last)
			}
		})
	}
	if _, _, ok := Window(nil, nil); ok {
		t.Fatal("a window without fulls")
	}
}

// A time just after a new full: the old chain's agent saw the revisions
// up to the time live, the new chain's agent caught up later and stamped
// them with its catch-up time. Every revision committed by the time is
// restored, from whichever chain saw it first (review finding 1).
func TestTimePointJustAfterANewFull(t *testing.T) {
	at := func(s int64) time.Time { return t0.Add(time.Duration(s) * time.Second) }
	fulls := []FullInfo{{Name: "A", Revision: 100, Time: at(100)}, {Name: "B", Revision: 300, Time: at(300)}}
	chains := map[string][]SegmentInfo{
		"A": {{Name: "A.delta-101", Chain: "A", Epoch: 1, FirstRevision: 101, LastRevision: 350, FirstTime: at(101), LastTime: at(350)}},
		"B": {{Name: "B.delta-301", Chain: "B", Epoch: 2, FirstRevision: 301, LastRevision: 420, FirstTime: at(400), LastTime: at(420)}},
	}
	for _, tc := range []struct {
		name      string
		t         time.Time
		full      string
		segs      []string
		to, floor int64
	}{
		// Inside A's live segment: replayed on A by time, at least to B's
		// full (committed by then).
		{name: "while both chains run", t: at(340), full: "A", segs: []string{"A.delta-101"}, floor: 300},
		// After A's agent stopped, before B's caught up: everything A saw,
		// nothing B stamped later.
		{name: "in the hand-over", t: at(380), full: "B", segs: []string{"B.delta-301"}, to: 350},
		// Once B is live, B's own stamps.
		{name: "after the catch-up", t: at(410), full: "B", segs: []string{"B.delta-301"}, floor: 350},
	} {
		t.Run(tc.name, func(t *testing.T) {
			res, err := Plan(fulls, chains, Point{Time: tc.t})
			if err != nil {
				t.Fatal(err)
			}
			if res.Full.Name != tc.full || !slices.Equal(names(res.Segments), tc.segs) || res.ToRevision != tc.to || res.MinRevision != tc.floor {
				t.Fatalf("plan: full %s, segments %v, to %d, at least %d; want %s, %v, %d, %d",
					res.Full.Name, names(res.Segments), res.ToRevision, res.MinRevision, tc.full, tc.segs, tc.to, tc.floor)
			}
		})
	}
}

// A chain that ended on a change of etcd's history (restored without a
// revision bump under it) is never planned past its end, and a revision
// both histories hold is refused naming both (review finding 2).
func TestHistoryBreak(t *testing.T) {
	at := func(s int64) time.Time { return t0.Add(time.Duration(s) * time.Second) }
	fulls := []FullInfo{
		{Name: "old", Revision: 9000, Time: at(100), Target: "app"},
		// Taken after the restore, at a lower revision.
		{Name: "new", Revision: 5100, Time: at(700), Target: "app"},
	}
	chains := map[string][]SegmentInfo{
		"old": {
			{Name: "old.delta-9001", Chain: "old", FirstRevision: 9001, LastRevision: 9500, FirstTime: at(200), LastTime: at(500)},
			{Name: "old.delta-9501", Chain: "old", FirstRevision: 9501, LastRevision: 9500, EndReason: "etcd's revision went back from 9500 to 5000", HistoryBreak: true},
		},
		"new": {{Name: "new.delta-5101", Chain: "new", FirstRevision: 5101, LastRevision: 9600, FirstTime: at(710), LastTime: at(900)}},
	}
	res, err := Plan(fulls, chains, Point{Time: at(800)})
	if err != nil || res.Full.Name != "new" || res.MinRevision != 5100 {
		t.Fatalf("a time after the restore: full %s, at least %d, %v; want the new history's full", res.Full.Name, res.MinRevision, err)
	}
	if res, err := Plan(fulls, chains, Point{Time: at(400)}); err != nil || res.Full.Name != "old" {
		t.Fatalf("a time before the restore: full %s, %v; want the old history's", res.Full.Name, err)
	}
	// Between the last write seen in the old history and the new full:
	// nothing was captured.
	if _, err := Plan(fulls, chains, Point{Time: at(600)}); !errors.Is(err, ErrNotRecoverable) || !strings.Contains(err.Error(), "history changed") {
		t.Fatalf("a time between the histories: %v", err)
	}
	if _, err := Plan(fulls, chains, Point{Revision: 9200}); err == nil || !strings.Contains(err.Error(), "two histories") ||
		!strings.Contains(err.Error(), "backup new") || !strings.Contains(err.Error(), "backup old") {
		t.Fatalf("a revision both histories hold: %v", err)
	}
	if res, err := Plan(fulls, chains, Point{Revision: 9550}); err != nil || res.Full.Name != "new" {
		t.Fatalf("a revision only the new history holds: full %s, %v", res.Full.Name, err)
	}
	if res, err := Plan(fulls, chains, Point{}); err != nil || res.Full.Name != "new" || res.ToRevision != 9600 {
		t.Fatalf("the newest point: full %s to %d, %v; want the new history's newest", res.Full.Name, res.ToRevision, err)
	}
	if _, l, _ := Window(fulls, chains); l.Revision != 9600 {
		t.Fatalf("window ends at %d, want the new history's 9600", l.Revision)
	}
	// Restricted to the old history's full (a restore naming it), the
	// revision is the old history's.
	if res, err := Plan(fulls[:1], chains, Point{Revision: 9200}); err != nil || res.Full.Name != "old" {
		t.Fatalf("revision 9200 of backup old: %s, %v", res.Full.Name, err)
	}
}

// A segment stamped by an agent whose clock the server found off warns.
func TestPlanWarnsOfASkewedClock(t *testing.T) {
	at := func(s int64) time.Time { return t0.Add(time.Duration(s) * time.Second) }
	fulls := []FullInfo{{Name: "f", Revision: 100, Time: at(100)}}
	s := seg("f", 1, 101, 200)
	s.ClockOffset = 42 * time.Second
	res, err := Plan(fulls, map[string][]SegmentInfo{"f": {s}}, Point{Time: at(150)})
	if err != nil || len(res.Warnings) != 1 || !strings.Contains(res.Warnings[0], "42s behind the server's") {
		t.Fatalf("warnings %q, %v", res.Warnings, err)
	}
}

// Users and roles changed after the full (etcd's auth revision moved) are
// not replayed: a plan through such segments warns; one through segments
// of the full's auth revision, or of none recorded, does not.
func TestPlanWarnsOfAuthChanges(t *testing.T) {
	fulls := []FullInfo{{Name: "f", Revision: 100, Time: t0, AuthRevision: 7}}
	a, b := seg("f", 1, 101, 150), seg("f", 1, 151, 200)
	a.AuthRevision, b.AuthRevision = 7, 9
	chains := map[string][]SegmentInfo{"f": {a, b}}
	res, err := Plan(fulls, chains, Point{Revision: 120})
	if err != nil || len(res.Warnings) != 0 {
		t.Fatalf("point before the change: warnings %q, %v", res.Warnings, err)
	}
	res, err = Plan(fulls, chains, Point{Revision: 180})
	if err != nil || len(res.Warnings) != 1 || !strings.Contains(res.Warnings[0], "from 7 to 9") || !strings.Contains(res.Warnings[0], "etcdctl user list") {
		t.Fatalf("point after the change: warnings %q, %v", res.Warnings, err)
	}
	b.AuthRevision = 0
	if res, err = Plan(fulls, map[string][]SegmentInfo{"f": {a, b}}, Point{Revision: 180}); err != nil || len(res.Warnings) != 0 {
		t.Fatalf("unknown auth revision: warnings %q, %v", res.Warnings, err)
	}
}
