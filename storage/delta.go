package storage

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"sort"
	"strconv"
	"strings"
	"time"

	ebv1 "github.com/kubectl-etcdbackup/kubectl-etcdbackup/api/etcdbackup/v1"
)

// SegmentInfix joins a delta segment's name: CHAIN.delta-FIRSTREVISION.
const SegmentInfix = ".delta-"

// SegmentName is the name a chain's segment starting at first is
// stored under: one name per (chain, first revision), so that two
// writers of the same revisions cannot both store them.
func SegmentName(chain string, first int64) string {
	return chain + SegmentInfix + strconv.FormatInt(first, 10)
}

// IsSegment says whether m is a delta segment rather than a backup.
func (m *Manifest) IsSegment() bool { return m.Delta != nil || m.Source.Kind == ebv1.SourceDelta }

// SplitParts separates a location's listing into backups and the parts
// stored with them: delta segments and recovery kits. Everything that
// handles backups (listing, retention, schedules, drills) sees only the
// first: a segment exists only as part of its full backup's chain, a
// kit only beside its backup.
func SplitParts(ms []*Manifest) (backups, parts []*Manifest) {
	for _, m := range ms {
		if m.IsSegment() || m.IsKit() {
			parts = append(parts, m)
		} else {
			backups = append(backups, m)
		}
	}
	return backups, parts
}

// Chains groups segments by the full backup they follow, each chain in
// revision order.
func Chains(segments []*Manifest) map[string][]*Manifest {
	out := map[string][]*Manifest{}
	for _, m := range segments {
		if m.Delta == nil {
			continue
		}
		out[m.Delta.Chain] = append(out[m.Delta.Chain], m)
	}
	for _, c := range out {
		sort.Slice(c, func(i, j int) bool {
			if c[i].Delta.FirstRevision != c[j].Delta.FirstRevision {
				return c[i].Delta.FirstRevision < c[j].Delta.FirstRevision
			}
			return c[i].Delta.Epoch > c[j].Delta.Epoch
		})
	}
	return out
}

// DeleteParts removes the parts stored with backup full after full itself
// was removed — the delta segments of the chain that starts from it and
// its recovery kit: they go only with their backup. It returns how many
// it removed.
func DeleteParts(ctx context.Context, loc Location, parts []*Manifest, full string) (int, error) {
	n := 0
	var errs []error
	for _, m := range PartsOf(parts, full) {
		what := "delta segment"
		if m.Kit != nil {
			what = "recovery kit"
		}
		if err := loc.Delete(ctx, m.Name); err != nil && !errors.Is(err, ErrNotFound) {
			errs = append(errs, fmt.Errorf("%s %q: %w", what, m.Name, err))
			continue
		}
		n++
	}
	return n, errors.Join(errs...)
}

// ChainOf returns the chain a segment name belongs to, if name is one.
func ChainOf(name string) (string, bool) {
	i := strings.LastIndex(name, SegmentInfix)
	if i <= 0 {
		return "", false
	}
	if _, err := strconv.ParseInt(name[i+len(SegmentInfix):], 10, 64); err != nil {
		return "", false
	}
	return name[:i], true
}

// ContiguousSegments returns the segments (sorted by Chains) that
// follow each other from revision from+1 on: each starts where the one
// before ended, none from a writer of an older epoch than the one before,
// none after a chain's end.
func ContiguousSegments(from int64, segs []*Manifest) []*Manifest {
	var out []*Manifest
	next, epoch := from+1, int64(0)
	for _, m := range segs {
		d := m.Delta
		if d == nil || d.FirstRevision != next || d.Epoch < epoch {
			continue
		}
		out = append(out, m)
		next, epoch = d.LastRevision+1, d.Epoch
		if d.EndReason != "" {
			break
		}
	}
	return out
}

// NewestChainBase is the newest backup of target a chain can start
// from: one an agent took, whose revision was read from the snapshot
// itself (a chain starts at exactly that revision + 1).
func NewestChainBase(backups []*Manifest, target string) *Manifest {
	var newest *Manifest
	for _, m := range backups {
		if m.Source.Kind != ebv1.SourceAgent || m.Source.Target != target || m.Etcd == nil || !m.Etcd.SnapshotStatus || m.Etcd.Revision <= 0 {
			continue
		}
		if newest == nil || TakenAfter(m, newest) {
			newest = m
		}
	}
	return newest
}

// TakenAfter says whether full a holds a later state of its target than
// b: by when its state was taken, then by revision. Revision alone would
// keep an old full when etcd's history went back (restored without a
// revision bump, re-created): every new full would then be older than it
// and the controller would start one each round.
func TakenAfter(a, b *Manifest) bool {
	ta, tb := cmp.Or(a.Source.StartTime, a.CreateTime), cmp.Or(b.Source.StartTime, b.CreateTime)
	if !ta.Equal(tb) {
		return ta.After(tb)
	}
	return a.Etcd.Revision > b.Etcd.Revision
}

// PartsOf are the parts among parts that go with backup full: its
// recovery kit and the delta segments of its chain.
func PartsOf(parts []*Manifest, full string) []*Manifest {
	var out []*Manifest
	for _, m := range parts {
		if (m.Kit != nil && m.Kit.Backup == full) || (m.Delta != nil && m.Delta.Chain == full) {
			out = append(out, m)
		}
	}
	return out
}

// LockedUntil is when the object lock of backup m and of every part of
// it among parts (PartsOf) has ended: a backup is removed with its
// parts, so it is locked while any of them is.
func LockedUntil(m *Manifest, parts []*Manifest) time.Time {
	until := m.LockedUntil
	for _, p := range PartsOf(parts, m.Name) {
		if p.LockedUntil.After(until) {
			until = p.LockedUntil
		}
	}
	return until
}
