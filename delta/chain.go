package delta

import (
	"cmp"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"
)

// SegmentInfo is what a segment's manifest says (storage.Delta plus the
// stored name and SHA-256).
type SegmentInfo struct {
	Name, SHA256                string
	Chain                       string
	Epoch                       int64
	FirstRevision, LastRevision int64
	FirstTime, LastTime         time.Time
	Events                      int64
	EndReason                   string
}

// empty says the segment holds no revision.
func (s SegmentInfo) empty() bool { return s.LastRevision < s.FirstRevision }

// FullInfo is a full backup that can start a chain.
type FullInfo struct {
	Name, SHA256 string
	// Revision is the snapshot's own revision.
	Revision int64
	// Time is when its snapshot was taken (the source's start time).
	Time   time.Time
	Target string
}

// Point is a restore target: Revision > 0, or Time non-zero, or neither
// (the newest point stored).
type Point struct {
	Revision int64
	Time     time.Time
}

func (p Point) String() string {
	switch {
	case p.Revision > 0:
		return fmt.Sprintf("revision %d", p.Revision)
	case !p.Time.IsZero():
		return p.Time.UTC().Format(time.RFC3339Nano)
	}
	return "the newest point stored"
}

// PointInfo is one end of a recoverable window.
type PointInfo struct {
	Revision int64
	Time     time.Time
}

// PlanResult is what a restore to a point needs.
type PlanResult struct {
	Full FullInfo
	// Segments are the chain's segments to replay, in order; the last may
	// extend past the point (replay stops at it).
	Segments []SegmentInfo
	// ToRevision is the revision the restore ends at; 0 for a time point
	// when only replay can tell (the revision before the first one seen
	// after the time).
	ToRevision int64
	Point      Point
}

// Contiguous orders a full's segments and returns the longest contiguous
// run of them from full.Revision+1, and in words what was left out and
// why (gap, overlap, stale epoch, another chain). Only a segment starting
// exactly where the run has reached is used: of several, the one with
// the highest epoch (then the longest). A segment whose epoch is lower
// than one already used is never used: its writer was deposed, and what
// it wrote after may disagree with the cluster.
func Contiguous(full FullInfo, segs []SegmentInfo) (used []SegmentInfo, problems []string) {
	var rest []SegmentInfo
	for _, s := range segs {
		switch {
		case s.Chain != "" && s.Chain != full.Name:
			problems = append(problems, fmt.Sprintf("segment %s belongs to chain %s, not %s", s.Name, s.Chain, full.Name))
		case s.LastRevision < s.FirstRevision-1:
			problems = append(problems, fmt.Sprintf("segment %s says it holds revisions %d..%d: its manifest is damaged", s.Name, s.FirstRevision, s.LastRevision))
		case s.empty():
			// Holds nothing to replay: neither used nor a problem.
		default:
			rest = append(rest, s)
		}
	}
	slices.SortFunc(rest, func(a, b SegmentInfo) int {
		return cmp.Or(cmp.Compare(a.FirstRevision, b.FirstRevision), -cmp.Compare(a.Epoch, b.Epoch),
			-cmp.Compare(a.LastRevision, b.LastRevision), strings.Compare(a.Name, b.Name))
	})
	next, epoch := full.Revision+1, int64(0)
	for {
		// rest is sorted by first revision, then best first: the first
		// usable candidate at next is the winner.
		i := slices.IndexFunc(rest, func(s SegmentInfo) bool { return s.FirstRevision == next && s.Epoch >= epoch })
		if i < 0 {
			break
		}
		s := rest[i]
		used = append(used, s)
		rest = slices.Delete(rest, i, i+1)
		next, epoch = s.LastRevision+1, s.Epoch
	}
	end := next - 1
	for _, s := range rest {
		var why string
		switch {
		case s.Epoch < epoch && s.FirstRevision <= end+1:
			why = fmt.Sprintf("epoch %d is older than the chain's (%d): written by a deposed delta agent", s.Epoch, epoch)
		case s.FirstRevision > end+1:
			why = fmt.Sprintf("revisions %d..%d are missing before it (gap): the chain ends at revision %d", end+1, s.FirstRevision-1, end)
		case s.FirstRevision <= full.Revision:
			why = fmt.Sprintf("it starts at or before the full backup's revision %d", full.Revision)
		default:
			why = "it overlaps segments already in the chain"
		}
		if s.Epoch < epoch && s.FirstRevision > end+1 {
			why += fmt.Sprintf(" (and its epoch %d is older than the chain's %d)", s.Epoch, epoch)
		}
		problems = append(problems, fmt.Sprintf("segment %s (revisions %d..%d, epoch %d) not used: %s", s.Name, s.FirstRevision, s.LastRevision, s.Epoch, why))
	}
	return used, problems
}

// reach is how far a full's chain goes.
type reach struct {
	full FullInfo
	segs []SegmentInfo
	// last is the newest revision and the time it was seen (the full's
	// when the chain has no segments).
	last PointInfo
}

func reaches(fulls []FullInfo, chains map[string][]SegmentInfo) []reach {
	rs := make([]reach, 0, len(fulls))
	for _, f := range fulls {
		used, _ := Contiguous(f, chains[f.Name])
		r := reach{full: f, segs: used, last: PointInfo{Revision: f.Revision, Time: f.Time}}
		if n := len(used); n > 0 {
			r.last = PointInfo{Revision: used[n-1].LastRevision, Time: used[n-1].LastTime}
		}
		rs = append(rs, r)
	}
	// Newest full first: the fewest segments to replay.
	slices.SortFunc(rs, func(a, b reach) int {
		return cmp.Or(-cmp.Compare(a.full.Revision, b.full.Revision), -a.full.Time.Compare(b.full.Time), strings.Compare(a.full.Name, b.full.Name))
	})
	return rs
}

// Window is the recoverable range of a target: earliest is its oldest
// full backup, latest the newest revision a contiguous chain reaches (a
// full's own when it has no segments). ok is false without fulls. Points
// inside the window may still be unrecoverable where chains have gaps:
// Plan says so.
func Window(fulls []FullInfo, chains map[string][]SegmentInfo) (earliest, latest PointInfo, ok bool) {
	rs := reaches(fulls, chains)
	if len(rs) == 0 {
		return PointInfo{}, PointInfo{}, false
	}
	oldest := rs[len(rs)-1].full
	earliest = PointInfo{Revision: oldest.Revision, Time: oldest.Time}
	latest = rs[0].last
	for _, r := range rs[1:] {
		if r.last.Revision > latest.Revision {
			latest = r.last
		}
	}
	return earliest, latest, true
}

// ErrNotRecoverable is wrapped by Plan's errors for a point no stored
// chain reaches.
var ErrNotRecoverable = errors.New("point not recoverable")

// Plan picks the newest full backup at or before the point whose chain
// reaches the point, and the segments needed up to it. For a time, a
// chain reaches it when it holds a revision seen at or after it, so no
// write between its last revision and the time can be missing.
func Plan(fulls []FullInfo, chains map[string][]SegmentInfo, p Point) (PlanResult, error) {
	if p.Revision < 0 {
		return PlanResult{}, fmt.Errorf("revision %d: etcd revisions are positive", p.Revision)
	}
	if p.Revision > 0 && !p.Time.IsZero() {
		return PlanResult{}, errors.New("restore to a revision or to a time, not both")
	}
	rs := reaches(fulls, chains)
	if len(rs) == 0 {
		return PlanResult{}, fmt.Errorf("%w: no full backup to start from", ErrNotRecoverable)
	}
	switch {
	case p.Revision > 0:
		for _, r := range rs {
			if r.full.Revision <= p.Revision && p.Revision <= r.last.Revision {
				// Segments are contiguous: those starting at or before the
				// point are the ones it needs.
				n := 0
				for n < len(r.segs) && r.segs[n].FirstRevision <= p.Revision {
					n++
				}
				return PlanResult{Full: r.full, Segments: r.segs[:n], ToRevision: p.Revision, Point: p}, nil
			}
		}
	case !p.Time.IsZero():
		for _, r := range rs {
			if r.full.Time.After(p.Time) || r.last.Time.Before(p.Time) {
				continue
			}
			res := PlanResult{Full: r.full, Point: p}
			for _, s := range r.segs {
				if s.FirstTime.After(p.Time) {
					break
				}
				res.Segments = append(res.Segments, s)
			}
			switch n := len(res.Segments); {
			case n == 0:
				res.ToRevision = r.full.Revision
			case n < len(r.segs) && !res.Segments[n-1].LastTime.After(p.Time):
				// The next segment starts after the time: the point is
				// this one's end.
				res.ToRevision = res.Segments[n-1].LastRevision
			}
			return res, nil
		}
	default:
		best := rs[0]
		for _, r := range rs[1:] {
			if r.last.Revision > best.last.Revision {
				best = r
			}
		}
		return PlanResult{Full: best.full, Segments: best.segs, ToRevision: best.last.Revision, Point: p}, nil
	}
	return PlanResult{}, notRecoverable(rs, p)
}

// notRecoverable says why no chain reaches p, and what can be restored.
func notRecoverable(rs []reach, p Point) error {
	oldest := rs[len(rs)-1].full
	newest := rs[0].last
	for _, r := range rs[1:] {
		if r.last.Revision > newest.Revision {
			newest = r.last
		}
	}
	target := ""
	if oldest.Target != "" {
		target = " of target " + oldest.Target
	}
	before := p.Revision > 0 && p.Revision < oldest.Revision || !p.Time.IsZero() && p.Time.Before(oldest.Time)
	after := p.Revision > newest.Revision || !p.Time.IsZero() && p.Time.After(newest.Time)
	switch {
	case before:
		return fmt.Errorf("%w: %s is before the oldest full backup%s (revision %d at %s, backup %s)",
			ErrNotRecoverable, p, target, oldest.Revision, stamp(oldest.Time), oldest.Name)
	case after:
		return fmt.Errorf("%w: %s is after the newest event stored%s (revision %d at %s)",
			ErrNotRecoverable, p, target, newest.Revision, stamp(newest.Time))
	}
	// Inside the window, in a gap between chains.
	var ranges []string
	for i := len(rs) - 1; i >= 0; i-- {
		r := rs[i]
		ranges = append(ranges, fmt.Sprintf("revisions %d..%d (%s .. %s, from backup %s)",
			r.full.Revision, r.last.Revision, stamp(r.full.Time), stamp(r.last.Time), r.full.Name))
	}
	return fmt.Errorf("%w: no chain%s covers %s (a gap in the deltas); recoverable: %s",
		ErrNotRecoverable, target, p, strings.Join(ranges, "; "))
}

func stamp(t time.Time) string {
	if t.IsZero() {
		return "an unknown time"
	}
	return t.UTC().Format(time.RFC3339)
}
