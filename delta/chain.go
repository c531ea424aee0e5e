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
	// HistoryBreak says the chain ended because etcd's history changed
	// under it (restored or re-created): no point after its end is
	// planned on it or on an older chain.
	HistoryBreak bool
	// ClockOffset is how far the server found the writing agent's clock
	// behind its own (negative: ahead) when the segment arrived.
	ClockOffset time.Duration
	// AuthRevision is etcd's auth revision when the segment was stored
	// (0: unknown).
	AuthRevision uint64
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
	// AuthRevision is etcd's auth revision right after the snapshot (0:
	// unknown).
	AuthRevision uint64
}

// Point is a restore target: Revision > 0, or Time non-zero, or neither
// (the newest point stored).
type Point struct {
	Revision int64
	Time     time.Time
	// MinRevision, with Time, is a revision replay reaches whatever the
	// stamps of the segments before it say (PlanResult.MinRevision):
	// another chain or a full shows it committed by Time.
	MinRevision int64
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
	// MinRevision, for a time point replayed by time, is the revision the
	// replay reaches at least, whatever its segments' stamps: one another
	// chain (or a full) shows committed by the time.
	MinRevision int64
	Point       Point
	// Warnings are what the operator should know about the plan (a
	// delta agent's clock found off the server's).
	Warnings []string
}

// ReplayPoint is where a replay of the plan stops: the revision when the
// plan knows it, else the point's time with the revision the plan knows
// committed by then (MinRevision).
func (r PlanResult) ReplayPoint() Point {
	if r.ToRevision > 0 {
		return Point{Revision: r.ToRevision}
	}
	return Point{Time: r.Point.Time, MinRevision: r.MinRevision}
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
		case s.FirstRevision < 1 || s.LastRevision < s.FirstRevision-1:
			// Revisions start at 1 (a segment's reader refuses less);
			// below, FirstRevision-1 and the run's LastRevision+1 would
			// wrap around int64 and chain a segment to the wrong end.
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
	// history is the full's history: how many history breaks (chains
	// ended because etcd's history changed under them) came before it.
	history int
	// breaks says the chain ended on a change of etcd's history.
	breaks bool
}

func reaches(fulls []FullInfo, chains map[string][]SegmentInfo) []reach {
	rs := make([]reach, 0, len(fulls))
	for _, f := range fulls {
		used, _ := Contiguous(f, chains[f.Name])
		r := reach{full: f, segs: used, last: PointInfo{Revision: f.Revision, Time: f.Time}}
		if n := len(used); n > 0 {
			r.last = PointInfo{Revision: used[n-1].LastRevision, Time: used[n-1].LastTime}
		}
		// The end segment holds no revision, so Contiguous leaves it out:
		// whether the chain broke is read from any of its segments that
		// starts right after the chain's last revision.
		for _, s := range chains[f.Name] {
			if s.HistoryBreak && s.FirstRevision <= r.last.Revision+1 && s.LastRevision <= r.last.Revision {
				r.breaks = true
			}
		}
		rs = append(rs, r)
	}
	// A history break at time B (the last time the old history was seen)
	// puts every full taken after B in a newer history.
	var breaks []time.Time
	for _, r := range rs {
		if r.breaks {
			breaks = append(breaks, r.last.Time)
		}
	}
	for i := range rs {
		rs[i].history = historyAt(breaks, rs[i].full.Time)
	}
	// Newest full first: the fewest segments to replay.
	slices.SortFunc(rs, func(a, b reach) int {
		return cmp.Or(-cmp.Compare(a.history, b.history), -cmp.Compare(a.full.Revision, b.full.Revision), -a.full.Time.Compare(b.full.Time), strings.Compare(a.full.Name, b.full.Name))
	})
	return rs
}

// historyAt is how many history breaks happened before t.
func historyAt(breaks []time.Time, t time.Time) int {
	n := 0
	for _, b := range breaks {
		if b.Before(t) {
			n++
		}
	}
	return n
}

// Window is the recoverable range of a target: earliest is its oldest
// full backup, latest the newest revision a contiguous chain of the
// newest history reaches (a full's own when it has no segments). ok is
// false without fulls. Points inside the window may still be
// unrecoverable where chains have gaps: Plan says so.
func Window(fulls []FullInfo, chains map[string][]SegmentInfo) (earliest, latest PointInfo, ok bool) {
	rs := reaches(fulls, chains)
	if len(rs) == 0 {
		return PointInfo{}, PointInfo{}, false
	}
	oldest := rs[0].full
	for _, r := range rs[1:] {
		if r.full.Time.Before(oldest.Time) {
			oldest = r.full
		}
	}
	return PointInfo{Revision: oldest.Revision, Time: oldest.Time}, newest(rs).last, true
}

// newest is the chain that reaches furthest in the newest history.
func newest(rs []reach) reach {
	best := rs[0]
	for _, r := range rs[1:] {
		if r.history == best.history && r.last.Revision > best.last.Revision {
			best = r
		}
	}
	return best
}

// ErrNotRecoverable is wrapped by Plan's errors for a point no stored
// chain reaches.
var ErrNotRecoverable = errors.New("point not recoverable")

// Plan picks the full backup and the segments a restore to the point
// needs.
//
// A revision is restored from the newest full at or before it whose chain
// reaches it. When chains of two histories of the target hold the
// revision (etcd restored without a revision bump under a running chain)
// Plan refuses and names both: which one is meant is the operator's call
// (a restore naming the full backup decides it).
//
// A time T is restored to the newest revision any capture had seen by T:
// each revision is stamped with the time its delta agent saw it, and when
// two chains hold it (after a new full or a fold, the old chain's agent
// runs on while the new one catches up) the earlier stamp counts. Writes
// committed before T that no capture had seen by T (within the capture's
// lag, or while no agent ran) are not included, and no write committed
// after T is. The point must lie inside a chain of the history in force
// at T, from its full's time to its newest stamp: a time after every
// stamp is refused, since a write may have followed that no capture
// stored yet.
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
	var res PlanResult
	var err error
	switch {
	case p.Revision > 0:
		res, err = planRevision(rs, p, -1)
	case !p.Time.IsZero():
		res, err = planTime(rs, p)
	default:
		best := newest(rs)
		res = PlanResult{Full: best.full, Segments: best.segs, ToRevision: best.last.Revision, Point: p}
	}
	if err == nil {
		res.Warnings = append(res.Warnings, authChanged(res)...)
	}
	return res, err
}

// authChanged warns when etcd's auth revision moved between the full and
// a segment replayed: users, roles or authentication changed, which the
// watch stream does not carry, so the restore holds the full's. A
// segment's revision is read when it is stored, so a change after the
// point but before that segment was stored warns too: it says "may".
func authChanged(res PlanResult) []string {
	from := res.Full.AuthRevision
	for _, s := range res.Segments {
		if s.AuthRevision == 0 {
			continue
		}
		if from == 0 {
			from = s.AuthRevision
			continue
		}
		if s.AuthRevision != from {
			return []string{fmt.Sprintf("etcd's users, roles or authentication may have changed after backup %s (its auth revision went from %d to %d by segment %s): a restore to a point holds the users and roles of the full backup, not later changes; check them after the restore (etcdctl user list, role list)",
				res.Full.Name, from, s.AuthRevision, s.Name)}
		}
	}
	return nil
}

// planRevision plans p.Revision on the newest full at or before it whose
// chain reaches it, in history (or any history, -1, when only one holds
// the revision).
func planRevision(rs []reach, p Point, history int) (PlanResult, error) {
	var holders []reach
	for _, r := range rs {
		if r.full.Revision <= p.Revision && p.Revision <= r.last.Revision && (history < 0 || r.history == history) {
			holders = append(holders, r)
		}
	}
	if len(holders) == 0 {
		return PlanResult{}, notRecoverable(rs, p)
	}
	// rs is sorted newest history first, then newest full: holders[0] is
	// the one to replay, unless another history holds the revision too.
	r := holders[0]
	if i := slices.IndexFunc(holders, func(o reach) bool { return o.history != r.history }); i >= 0 {
		o := holders[i]
		return PlanResult{}, fmt.Errorf("%w: %s is in two histories of the target: etcd's revisions went back under a delta chain (restored or re-created without a revision bump), so revision %d names both a state of the newer history (backup %s, %s) and one of the older (backup %s, %s). "+
			"Name the backup to restore from to choose one (`restore BACKUP --to-revision %d`), or restore to a time",
			ErrNotRecoverable, p, p.Revision, r.full.Name, stamp(r.full.Time), o.full.Name, stamp(o.full.Time), p.Revision)
	}
	// Segments are contiguous: those starting at or before the point are
	// the ones it needs.
	n := 0
	for n < len(r.segs) && r.segs[n].FirstRevision <= p.Revision {
		n++
	}
	return PlanResult{Full: r.full, Segments: r.segs[:n], ToRevision: p.Revision, Point: p}, nil
}

// planTime plans time p.Time: the newest revision stamped at or before it
// by any chain of the history in force then.
func planTime(rs []reach, p Point) (PlanResult, error) {
	t := p.Time
	var breaks []time.Time
	for _, r := range rs {
		if r.breaks {
			breaks = append(breaks, r.last.Time)
		}
	}
	history := historyAt(breaks, t)
	// floor is the newest revision known committed by t without reading
	// a segment: a full taken by t, and every revision of a chain whose
	// newest stamp is at or before t. open are the chains that saw
	// something after t, oldest full first: the oldest one's agent saw
	// every revision it shares with a newer chain first (the controller
	// starts a chain's agent only after stopping the one before), so its
	// stamps decide.
	var floor int64
	var open []reach
	for _, r := range rs {
		if r.history != history || r.full.Time.After(t) {
			continue
		}
		floor = max(floor, r.full.Revision)
		if r.last.Time.After(t) {
			open = append(open, r)
		} else {
			floor = max(floor, r.last.Revision)
		}
	}
	if len(open) == 0 {
		// Nothing was seen after t. t is the window's end itself only
		// when it is the newest stamp of a chain (or a full's time) that
		// reaches floor; after that no capture says what happened.
		for _, r := range rs {
			if r.history == history && !r.full.Time.After(t) && r.last.Time.Equal(t) && r.last.Revision == floor {
				res, err := planRevision(rs, Point{Revision: floor}, history)
				res.Point = p
				return res, err
			}
		}
		return PlanResult{}, notRecoverable(rs, p)
	}
	o := open[len(open)-1]
	for _, r := range open {
		if r.full.Time.Before(o.full.Time) {
			o = r
		}
	}
	// The oldest open chain's newest revision stamped by t lies in lo..hi:
	// past the segments seen entirely by t, inside the one that straddles
	// t, if any.
	lo, hi := o.full.Revision, o.full.Revision
	for _, s := range o.segs {
		if s.LastTime.After(t) {
			if !s.FirstTime.After(t) {
				hi = s.LastRevision
			}
			break
		}
		lo, hi = s.LastRevision, s.LastRevision
	}
	if hi <= floor {
		// Known without replaying by time: a revision point on the newest
		// full of this history that reaches it.
		res, err := planRevision(rs, Point{Revision: floor}, history)
		res.Point = p
		return res, err
	}
	res := PlanResult{Full: o.full, Point: p, MinRevision: floor}
	for _, s := range o.segs {
		if s.FirstRevision > max(hi, floor) {
			break
		}
		res.Segments = append(res.Segments, s)
		if s.ClockOffset.Abs() > MaxClockOffset {
			res.Warnings = append(res.Warnings, fmt.Sprintf("the times of segment %s were stamped by a delta agent whose clock was %s: the point may be off by as much",
				s.Name, clockOffset(s.ClockOffset)))
		}
	}
	if lo == hi {
		res.ToRevision = max(lo, floor)
	}
	return res, nil
}

// MaxClockOffset is how far a delta agent's clock may be off the
// server's (as the server measures it on each upload, transit included)
// before a restore to a time through its segments warns.
const MaxClockOffset = time.Second

// clockOffset says an offset (server minus agent) in words.
func clockOffset(d time.Duration) string {
	if d > 0 {
		return d.Round(time.Millisecond).String() + " behind the server's"
	}
	return (-d).Round(time.Millisecond).String() + " ahead of the server's"
}

// notRecoverable says why no chain reaches p, and what can be restored.
func notRecoverable(rs []reach, p Point) error {
	oldest := rs[0].full
	for _, r := range rs[1:] {
		if r.full.Time.Before(oldest.Time) || r.full.Time.Equal(oldest.Time) && r.full.Revision < oldest.Revision {
			oldest = r.full
		}
	}
	newest := newest(rs).last
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
		return fmt.Errorf("%w: %s is after the newest event stored%s (revision %d at %s): a later write may not be stored yet; restore to that revision or an earlier time",
			ErrNotRecoverable, p, target, newest.Revision, stamp(newest.Time))
	}
	// Inside the window, in a gap between chains.
	var ranges []string
	for i := len(rs) - 1; i >= 0; i-- {
		r := rs[i]
		ended := ""
		if r.breaks {
			ended = ", where etcd's history changed"
		}
		ranges = append(ranges, fmt.Sprintf("revisions %d..%d (%s .. %s, from backup %s%s)",
			r.full.Revision, r.last.Revision, stamp(r.full.Time), stamp(r.last.Time), r.full.Name, ended))
	}
	return fmt.Errorf("%w: no chain%s covers %s (a gap in the deltas: no delta agent stored what happened then, or etcd's history changed); recoverable: %s",
		ErrNotRecoverable, target, p, strings.Join(ranges, "; "))
}

func stamp(t time.Time) string {
	if t.IsZero() {
		return "an unknown time"
	}
	return t.UTC().Format(time.RFC3339)
}
