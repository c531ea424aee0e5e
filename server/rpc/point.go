package rpc

import (
	"context"
	"errors"
	"fmt"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	ebv1 "github.com/kubectl-etcdbackup/kubectl-etcdbackup/api/etcdbackup/v1"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/delta"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/server/jobs"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/server/rpc/internal/edge"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/storage"
)

// A restore to a point (to_revision, to_time) is planned here, from the
// location's own listing, with the same delta.Plan the plugin's --local
// restore uses: the restore Jobs then get the full backup picked and the
// segments to replay, each pinned to its SHA-256.

// pointOf is the point a restore request names; ok is false for a
// restore of a backup as it is.
func pointOf(req *ebv1.RestoreBackupRequest) (p delta.Point, ok bool, err error) {
	p.Revision = req.GetToRevision()
	if ts := req.GetToTime(); ts != nil {
		if err := ts.CheckValid(); err != nil {
			return p, false, status.Errorf(codes.InvalidArgument, "to_time: %v", err)
		}
		p.Time = ts.AsTime()
	}
	ok = p.Revision != 0 || !p.Time.IsZero()
	switch {
	case p.Revision < 0:
		return p, false, status.Errorf(codes.InvalidArgument, "--to-revision %d: etcd revisions are positive", p.Revision)
	case p.Revision > 0 && !p.Time.IsZero():
		return p, false, status.Error(codes.InvalidArgument, "give --to-revision or --to-time, not both")
	case req.GetAllowLeaseLoss() && !ok:
		return p, false, status.Error(codes.InvalidArgument, "--allow-lease-loss goes with --to-revision or --to-time")
	}
	return p, ok, nil
}

// pointPlan is what a restore to a point restores: full, then segments
// replayed up to toRevision (0 for a time only replay can turn into a
// revision).
type pointPlan struct {
	full       *storage.Manifest
	segments   []*storage.Manifest
	toRevision int64
	// replay is where the agents' replay stops (PlanResult.ReplayPoint).
	replay   delta.Point
	warnings []string
}

// pins are the plan's segments as a restore Job lists them.
func (p *pointPlan) pins() []jobs.SegmentPin {
	out := make([]jobs.SegmentPin, 0, len(p.segments))
	for _, m := range p.segments {
		out = append(out, jobs.SegmentPin{Name: m.Name, SHA256: m.SHA256})
	}
	return out
}

// names are the plan's segments' names, in replay order.
func (p *pointPlan) names() []string {
	out := make([]string, 0, len(p.segments))
	for _, m := range p.segments {
		out = append(out, m.Name)
	}
	return out
}

// planPoint picks, among target's full backups in loc (only name, when
// set), the newest at or before point whose delta chain reaches it, and
// the segments up to it. A point no chain reaches is FailedPrecondition
// with delta.Plan's words, which say what can be restored.
func (s *Service) planPoint(ctx context.Context, locName string, loc storage.Location, target, name string, point delta.Point) (*pointPlan, error) {
	op := fmt.Sprintf("restore target %q to %s", target, point)
	all, err := loc.List(ctx)
	if err != nil {
		return nil, edge.StorageStatus("restore to a point", locName, "", err)
	}
	backups, segments := storage.SplitParts(all)
	fullByName := map[string]*storage.Manifest{}
	var fulls []delta.FullInfo
	for _, m := range backups {
		f, ok := fullInfo(m)
		if !ok || f.Target != target || (name != "" && m.Name != name) {
			continue
		}
		fulls = append(fulls, f)
		fullByName[m.Name] = m
	}
	if len(fulls) == 0 {
		what := fmt.Sprintf("target %q", target)
		if name != "" {
			what = fmt.Sprintf("backup %q of target %q", name, target)
		}
		return nil, status.Errorf(codes.FailedPrecondition,
			"%s: location %q holds no full backup of %s that a delta chain can start from (one the server's agent took, with the revision read from its snapshot); see `kubectl etcdbackup list --target %s`",
			op, locName, what, target)
	}
	segByName := map[string]*storage.Manifest{}
	chains := map[string][]delta.SegmentInfo{}
	for chain, segs := range storage.Chains(segments) {
		if fullByName[chain] == nil {
			continue
		}
		for _, m := range segs {
			segByName[m.Name] = m
			chains[chain] = append(chains[chain], segmentInfo(m))
		}
	}
	plan, err := delta.Plan(fulls, chains, point)
	if err != nil {
		return nil, status.Errorf(codes.FailedPrecondition, "%s: %v; nothing was changed", op, err)
	}
	out := &pointPlan{full: fullByName[plan.Full.Name], toRevision: plan.ToRevision, replay: plan.ReplayPoint(), warnings: plan.Warnings}
	for _, si := range plan.Segments {
		out.segments = append(out.segments, segByName[si.Name])
	}
	if _, err := jobs.EncodeSegments(out.pins()); errors.Is(err, jobs.ErrTooManySegments) {
		return nil, status.Errorf(codes.FailedPrecondition,
			"%s needs %d delta segments after backup %q: %v. Take a new full backup of the target (`kubectl etcdbackup backup --target %s --wait`) so that later points need fewer, or restore each member with `kubectl etcdbackup restore --local --to-revision/--to-time`",
			op, len(out.segments), plan.Full.Name, err, target)
	}
	return out, nil
}

// fullInfo is m as the start of a chain: a backup the server's agent
// took whose revision was read from the snapshot itself.
func fullInfo(m *storage.Manifest) (delta.FullInfo, bool) {
	// An upload is never a chain's base: nothing says which history it
	// holds or that a chain follows it.
	if m.IsSegment() || m.Source.Kind != ebv1.SourceAgent || m.Etcd == nil || !m.Etcd.SnapshotStatus || m.Etcd.Revision <= 0 {
		return delta.FullInfo{}, false
	}
	t := m.Source.StartTime
	if t.IsZero() {
		t = m.CreateTime
	}
	return delta.FullInfo{Name: m.Name, SHA256: m.SHA256, Revision: m.Etcd.Revision, Time: t, Target: m.Source.Target, AuthRevision: m.Etcd.AuthRevision}, true
}

// segmentInfo is a stored segment as delta.Plan reads it.
func segmentInfo(m *storage.Manifest) delta.SegmentInfo {
	d := m.Delta
	return delta.SegmentInfo{
		Name: m.Name, SHA256: m.SHA256, Chain: d.Chain, Epoch: d.Epoch,
		FirstRevision: d.FirstRevision, LastRevision: d.LastRevision,
		FirstTime: d.FirstTime, LastTime: d.LastTime, Events: d.Events, EndReason: d.EndReason,
		HistoryBreak: d.HistoryBreak, ClockOffset: d.ClockOffset, AuthRevision: d.AuthRevision,
	}
}
