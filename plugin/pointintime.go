package plugin

import (
	"context"
	"fmt"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/protobuf/types/known/timestamppb"

	ebv1 "github.com/kubectl-etcdbackup/kubectl-etcdbackup/api/etcdbackup/v1"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/delta"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/fetch"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/member"
)

// Restores to a point (--to-revision, --to-time) and recoverable windows
// (list --target) read the same thing: a target's full backups that can
// start a delta chain, and each one's chain as stored.

// targetChains is what one location holds for one target.
type targetChains struct {
	fulls  []delta.FullInfo
	chains map[string][]delta.SegmentInfo
	// backups are the fulls as listed, by name.
	backups map[string]*ebv1.Backup
}

// readTargetChains lists location's backups of target (only name, when
// set) and the chain of each that has one.
func readTargetChains(ctx context.Context, conn *Connection, location, target, name string) (*targetChains, error) {
	all, err := listLocation(ctx, conn, location, "")
	if err != nil {
		return nil, err
	}
	tc := &targetChains{chains: map[string][]delta.SegmentInfo{}, backups: map[string]*ebv1.Backup{}}
	for _, b := range all {
		f, ok := fullInfoOf(b)
		if !ok || (target != "" && f.Target != target) || (name != "" && b.GetName() != name) {
			continue
		}
		tc.fulls = append(tc.fulls, f)
		tc.backups[b.GetName()] = b
		if b.GetChain() == nil {
			continue
		}
		segs, err := listChainSegments(ctx, conn, location, b.GetName())
		if err != nil {
			return nil, fmt.Errorf("list the delta chain of %q: %w", b.GetName(), err)
		}
		tc.chains[b.GetName()] = segs
	}
	return tc, nil
}

// fullInfoOf is b as the start of a chain: a backup whose revision was
// read from its snapshot.
func fullInfoOf(b *ebv1.Backup) (delta.FullInfo, bool) {
	e := b.GetEtcd()
	// An upload is never a chain's base (as the server plans it).
	if b.GetDelta() != nil || b.GetSource().GetKind() != ebv1.SourceAgent || e == nil || e.GetRevision() <= 0 || !e.GetSnapshotStatus() {
		return delta.FullInfo{}, false
	}
	t := b.GetSource().GetStartTime().AsTime()
	if b.GetSource().GetStartTime() == nil {
		t = b.GetCreateTime().AsTime()
	}
	return delta.FullInfo{Name: b.GetName(), SHA256: b.GetSha256(), Revision: e.GetRevision(), Time: t, Target: b.GetSource().GetTarget(), AuthRevision: e.GetAuthRevision()}, true
}

// listChainSegments lists every segment of chain, every page.
func listChainSegments(ctx context.Context, conn *Connection, location, chain string) ([]delta.SegmentInfo, error) {
	var out []delta.SegmentInfo
	req := &ebv1.ListBackupsRequest{Location: location, Chain: chain}
	for {
		resp, err := conn.Backups.ListBackups(ctx, req, grpc.MaxCallRecvMsgSize(listMaxRecvBytes))
		if err != nil {
			return nil, err
		}
		for _, b := range resp.GetBackups() {
			d := b.GetDelta()
			if d == nil {
				continue
			}
			out = append(out, delta.SegmentInfo{
				Name: b.GetName(), SHA256: b.GetSha256(), Chain: d.GetChain(), Epoch: d.GetEpoch(),
				FirstRevision: d.GetFirstRevision(), LastRevision: d.GetLastRevision(),
				FirstTime: stampTime(d.GetFirstTime()), LastTime: stampTime(d.GetLastTime()),
				Events: d.GetEvents(), EndReason: d.GetEndReason(), HistoryBreak: d.GetHistoryBreak(),
				ClockOffset:  time.Duration(d.GetClockOffsetSeconds() * float64(time.Second)),
				AuthRevision: d.GetAuthRevision(),
			})
		}
		if resp.GetNextPageToken() == "" {
			return out, nil
		}
		req.PageToken = resp.GetNextPageToken()
	}
}

// stampTime is ts as a time, zero when unset.
func stampTime(ts *timestamppb.Timestamp) time.Time {
	if ts == nil {
		return time.Time{}
	}
	return ts.AsTime()
}

// planPoint picks the full backup and the delta segments a restore to
// o.point needs, among --target's backups in --location (the server's
// default without it), and names the full in o. With --dry-run it prints
// the plan.
func (o *RestoreOptions) planPoint(ctx context.Context, conn *Connection) (*member.Deltas, string, error) {
	op := "restore to " + o.point.String()
	tc, err := readTargetChains(ctx, conn, o.Location, o.Target, o.Name)
	if err != nil {
		return nil, "", conn.explain(op, err)
	}
	if len(tc.fulls) == 0 {
		what := fmt.Sprintf("target %q", o.Target)
		if o.Name != "" {
			what = fmt.Sprintf("backup %q", o.Name)
		}
		return nil, "", fmt.Errorf("%s: no full backup of %s that a delta chain can start from (one the server's agent took, with the revision read from its snapshot); see `kubectl etcdbackup list --target %s`", op, what, o.Target)
	}
	plan, err := delta.Plan(tc.fulls, tc.chains, o.point)
	if err != nil {
		return nil, "", fmt.Errorf("%s: %w; nothing was changed", op, err)
	}
	o.Name = plan.Full.Name
	for _, w := range plan.Warnings {
		fmt.Fprintf(o.ErrOut, "warning: %s\n", w)
	}
	d := &member.Deltas{Point: plan.ReplayPoint(), AllowLeaseLoss: o.AllowLeaseLoss}
	for _, s := range plan.Segments {
		d.Segments = append(d.Segments, fetch.Pin{Name: s.Name, SHA256: s.SHA256})
	}
	if o.DryRun {
		fmt.Fprintf(o.Out, "would restore %s: full backup %q (revision %d) and %d delta segments replayed up to it, into %s for member %q\n",
			o.point, plan.Full.Name, plan.Full.Revision, len(plan.Segments), o.Member.DataDir, o.Member.Name)
		fmt.Fprintf(o.Out, "after restoring: %s\n", bumpSummary(o.Member.RevisionBump()))
	}
	return d, plan.Full.SHA256, nil
}

// seenAt says when a replayed revision was seen, if known.
func seenAt(t time.Time) string {
	if t.IsZero() {
		return ""
	}
	return " (seen " + t.UTC().Format(time.RFC3339) + ")"
}

// ofTarget keeps the backups of target: those its agents stored (fulls,
// folds, delta segments). An upload that names the target is only its
// uploader's word, whatever the server it came from recorded.
func ofTarget(bs []*ebv1.Backup, target string) []*ebv1.Backup {
	var out []*ebv1.Backup
	for _, b := range bs {
		src := b.GetSource()
		if ebv1.OfTarget(src.GetKind(), src.GetTarget(), target) || (src.GetKind() == ebv1.SourceDelta && src.GetTarget() == target) {
			out = append(out, b)
		}
	}
	return out
}

// printWindow prints the recoverable window of --target: from its oldest
// full backup to the newest event its delta chains hold.
func (o *ListOptions) printWindow(ctx context.Context, conn *Connection) error {
	tc, err := readTargetChains(ctx, conn, o.Location, o.Target, "")
	if err != nil {
		return conn.explain("list the delta chains of target "+quote(o.Target), err)
	}
	earliest, latest, ok := delta.Window(tc.fulls, tc.chains)
	if !ok {
		fmt.Fprintf(o.Out, "\nTarget %q has no full backup a restore to a point can start from.\n", o.Target)
		return nil
	}
	segments := 0
	for _, c := range tc.chains {
		segments += len(c)
	}
	fmt.Fprintf(o.Out, "\nRecoverable window of target %q: revision %d%s to revision %d%s (%d full backups, %d delta segments)\n",
		o.Target, earliest.Revision, seenAt(earliest.Time), latest.Revision, seenAt(latest.Time), len(tc.fulls), segments)
	return nil
}
