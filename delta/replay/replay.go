// Package replay rebuilds an etcd keyspace at a point in time: it serves
// a full backup's snapshot in a throwaway loopback etcd, writes the
// chain's delta segments into it one source revision per transaction, up
// to the point, and saves that etcd's snapshot. Because the replay etcd
// gives each transaction exactly one revision, as the source did, every
// key ends with the source's create and mod revisions and version; each
// transaction's revision is checked, so a replay that drifted fails
// instead of producing a snapshot that looks right and is not.
package replay

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/mvccpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	clientsnapshot "go.etcd.io/etcd/client/v3/snapshot"
	"go.uber.org/zap"

	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/delta"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/internal/loopetcd"
)

// Options say what to replay and where.
type Options struct {
	// BasePath is the plain etcd snapshot of the chain's full backup;
	// BaseRevision its revision, checked against what etcd serves.
	BasePath     string
	BaseRevision int64
	// Segments are plain segment files, in chain order.
	Segments []string
	// Point is where replay stops: after Point.Revision, or before the
	// first revision after Point.MinRevision seen after Point.Time, or
	// at the end of the segments when neither is set.
	Point delta.Point
	// WorkDir is scratch space for the replay etcd; it is emptied when
	// Build returns.
	WorkDir string
	// OutPath receives the resulting plain etcd snapshot (with etcd's
	// SHA-256 trailer).
	OutPath      string
	StartTimeout time.Duration
	// AllowLeaseLoss is kept for callers of earlier versions: keys whose
	// lease was gone when the delta agent read it are always restored,
	// with a stand-in lease (Result.LostLeases).
	AllowLeaseLoss bool
}

// Result is what a replay did.
type Result struct {
	// Revision is the revision of the resulting snapshot; Time when the
	// last replayed revision was seen (zero when none was replayed).
	Revision int64
	Time     time.Time
	// Revisions and Events are what was replayed.
	Revisions, Events int64
	// LeasesGranted counts the leases created from lease frames.
	LeasesGranted int
	// LostLeases are leases some key holds at the point whose TTL could
	// not be read: the lease was gone (expired, revoked) by the time the
	// delta agent asked, so it was about to end at the point too. They
	// were granted a stand-in TTL (the one recorded, DefaultLostLeaseTTL
	// when none), after which their keys go as they did in the source.
	LostLeases []int64
}

// DefaultLostLeaseTTL is the TTL, in seconds, of a lease granted for one
// that was gone and whose TTL is unknown.
const DefaultLostLeaseTTL = 60

// Limits of the replay etcd: a revision is one transaction, which can
// hold as many operations as the source's largest (a lease revoked with
// all its keys, a deleted prefix).
const (
	maxTxnOps       = 1 << 20
	maxRequestBytes = 256 << 20
)

// Build replays o.Segments onto o.BasePath up to o.Point and writes the
// resulting snapshot to o.OutPath.
func Build(ctx context.Context, o Options) (Result, error) {
	if o.BasePath == "" || o.OutPath == "" || o.WorkDir == "" {
		return Result{}, errors.New("replay needs a base snapshot, an output path and a work directory")
	}
	if o.Point.Revision > 0 && !o.Point.Time.IsZero() {
		return Result{}, errors.New("replay to a revision or to a time, not both")
	}
	if o.Point.Revision > 0 && o.Point.Revision < o.BaseRevision {
		return Result{}, fmt.Errorf("revision %d is before the full backup's revision %d: replay only moves forward from a full backup; pick an older full", o.Point.Revision, o.BaseRevision)
	}
	if err := os.MkdirAll(o.WorkDir, 0o700); err != nil {
		return Result{}, fmt.Errorf("replay work directory: %w", err)
	}
	defer empty(o.WorkDir)
	dataDir := filepath.Join(o.WorkDir, "replay-member")
	if err := os.RemoveAll(dataDir); err != nil {
		return Result{}, fmt.Errorf("replay work directory: %w", err)
	}
	quota, err := replayQuota(o)
	if err != nil {
		return Result{}, err
	}
	m, err := loopetcd.Start(ctx, loopetcd.Options{
		Snapshot: o.BasePath, DataDir: dataDir, StartTimeout: o.StartTimeout,
		MaxTxnOps: maxTxnOps, MaxRequestBytes: maxRequestBytes, QuotaBackendBytes: quota,
	})
	if err != nil {
		return Result{}, fmt.Errorf("serve the full backup for replay: %w", err)
	}
	defer m.Close()
	// The member's own TLS client: it authenticates as etcd's root user,
	// which a backup of an etcd with authentication enabled needs.
	cfg := m.Config()
	cfg.Context = ctx
	c, err := clientv3.New(cfg)
	if err != nil {
		return Result{}, fmt.Errorf("connect to the replay etcd: %w", err)
	}
	defer c.Close()
	r := &replayer{o: o, c: c, leases: pb.NewLeaseClient(c.ActiveConnection()), present: map[int64]bool{}, lost: map[int64]bool{}}
	kctx, stopKeepAlive := context.WithCancel(ctx)
	r.keepCtx = kctx
	defer func() { stopKeepAlive(); r.wg.Wait() }()
	res, err := r.run(ctx)
	if err != nil {
		return res, err
	}
	// The leases' TTLs are what etcd stores; their remaining time is not
	// in a snapshot (a restored member grants every lease its full TTL).
	stopKeepAlive()
	if _, err := clientsnapshot.SaveWithVersion(ctx, zap.NewNop(), cfg, o.OutPath); err != nil {
		return res, fmt.Errorf("save the replayed keyspace to %s: %w", o.OutPath, err)
	}
	return res, nil
}

// replayQuota is the replay member's backend quota: room for the base
// and every segment's events (their plain size bounds what they add).
func replayQuota(o Options) (int64, error) {
	base, err := os.Stat(o.BasePath)
	if err != nil {
		return 0, fmt.Errorf("replay: %w", err)
	}
	var deltas int64
	for _, p := range o.Segments {
		st, err := os.Stat(p)
		if err != nil {
			return 0, fmt.Errorf("replay: %w", err)
		}
		deltas += st.Size()
	}
	q, err := loopetcd.Quota(base.Size(), deltas)
	if err != nil {
		return 0, fmt.Errorf("replay: %w", err)
	}
	return q, nil
}

// empty removes dir's contents, keeping dir.
func empty(dir string) {
	entries, _ := os.ReadDir(dir)
	for _, e := range entries {
		_ = os.RemoveAll(filepath.Join(dir, e.Name()))
	}
}

type replayer struct {
	o       Options
	c       *clientv3.Client
	leases  pb.LeaseClient
	present map[int64]bool
	// lost are leases granted with a stand-in TTL.
	lost    map[int64]bool
	keepCtx context.Context
	wg      sync.WaitGroup
	res     Result
}

func (r *replayer) run(ctx context.Context) (Result, error) {
	head, err := r.c.Get(ctx, "\x00", clientv3.WithCountOnly())
	if err != nil {
		return r.res, fmt.Errorf("read the replay etcd's revision: %w", err)
	}
	if got := head.Header.Revision; got != r.o.BaseRevision {
		return r.res, fmt.Errorf("the full backup's snapshot is at revision %d, its manifest says %d: the chain's segments start after the manifest's revision and cannot be replayed onto this snapshot", got, r.o.BaseRevision)
	}
	r.res.Revision = head.Header.Revision
	// Leases restored from the snapshot are kept alive as the ones
	// granted later: one expiring would delete its keys at a revision the
	// source did not have.
	ls, err := r.c.Leases(ctx)
	if err != nil {
		return r.res, fmt.Errorf("list the leases of the full backup: %w", err)
	}
	for _, l := range ls.Leases {
		r.present[int64(l.ID)] = true
		r.keepAlive(int64(l.ID))
	}
	stopped := false
	for _, path := range r.o.Segments {
		if stopped = r.reached(); stopped {
			break
		}
		if stopped, err = r.segment(ctx, path); err != nil {
			return r.res, err
		}
		if stopped {
			break
		}
	}
	if p := max(r.o.Point.Revision, r.o.Point.MinRevision); p > 0 && r.res.Revision < p {
		return r.res, fmt.Errorf("the segments end at revision %d, before revision %d: the chain does not reach the point", r.res.Revision, p)
	}
	if err := r.finishLeases(ctx); err != nil {
		return r.res, err
	}
	// What is saved must be the point: nothing above may have written.
	end, err := r.c.Get(ctx, "\x00", clientv3.WithCountOnly())
	if err != nil {
		return r.res, fmt.Errorf("read the replay etcd's revision: %w", err)
	}
	if end.Header.Revision != r.res.Revision {
		return r.res, fmt.Errorf("the replay etcd is at revision %d after replaying to %d: something wrote to it; nothing was restored", end.Header.Revision, r.res.Revision)
	}
	return r.res, nil
}

// reached says whether a revision point was replayed.
func (r *replayer) reached() bool {
	return r.o.Point.Revision > 0 && r.res.Revision >= r.o.Point.Revision
}

// segment replays one segment file; stopped says the point was reached
// inside it.
func (r *replayer) segment(ctx context.Context, path string) (stopped bool, err error) {
	f, err := os.Open(path)
	if err != nil {
		return false, fmt.Errorf("replay: %w", err)
	}
	defer f.Close()
	name := filepath.Base(path)
	sr, err := delta.NewReader(f)
	if err != nil {
		return false, fmt.Errorf("segment %s: %w", name, err)
	}
	if h := sr.Header(); h.FirstRevision != r.res.Revision+1 {
		return false, fmt.Errorf("segment %s starts at revision %d, the replay is at %d: the segments given are not one contiguous chain in order", name, h.FirstRevision, r.res.Revision)
	}
	for {
		rev, l, err := sr.Next()
		if errors.Is(err, io.EOF) {
			return false, nil
		}
		if err != nil {
			return false, fmt.Errorf("segment %s: %w", name, err)
		}
		if l != nil {
			if err := r.grant(ctx, *l); err != nil {
				return false, fmt.Errorf("segment %s: %w", name, err)
			}
			continue
		}
		if t := r.o.Point.Time; !t.IsZero() && rev.Time.After(t) && rev.Revision > r.o.Point.MinRevision {
			return true, nil
		}
		if err := r.apply(ctx, rev); err != nil {
			return false, fmt.Errorf("segment %s: %w", name, err)
		}
		if r.reached() {
			return true, nil
		}
	}
}

// grant creates a lease the segment's events use, with its ID: the keys'
// lease field must name it as the source's did.
func (r *replayer) grant(ctx context.Context, l delta.Lease) error {
	if r.present[l.ID] {
		return nil
	}
	ttl := l.TTL
	if l.Remaining < 0 {
		// Gone before the agent read it: whether that matters is known
		// at the point (checkLostLeases).
		r.lost[l.ID] = true
		if ttl <= 0 {
			ttl = DefaultLostLeaseTTL
		}
	}
	if ttl <= 0 {
		return fmt.Errorf("lease %d has no TTL recorded (%d): it cannot be granted", l.ID, l.TTL)
	}
	if _, err := r.leases.LeaseGrant(ctx, &pb.LeaseGrantRequest{ID: l.ID, TTL: ttl}); err != nil {
		return fmt.Errorf("grant lease %d (TTL %ds) in the replay etcd: %w", l.ID, ttl, err)
	}
	r.present[l.ID] = true
	r.res.LeasesGranted++
	r.keepAlive(l.ID)
	return nil
}

// keepAlive keeps a lease of the replay etcd from expiring until the
// replay ends: an expiry would write a revision the source did not.
func (r *replayer) keepAlive(id int64) {
	ch, err := r.c.KeepAlive(r.keepCtx, clientv3.LeaseID(id))
	if err != nil {
		// Only a cancelled context fails here; the revision check
		// catches an expiry anyway.
		return
	}
	r.wg.Go(func() {
		for range ch {
		}
	})
}

// apply writes one source revision as one transaction and checks it got
// the same revision.
func (r *replayer) apply(ctx context.Context, rev *delta.Revision) error {
	ops := make([]clientv3.Op, 0, len(rev.Events))
	for _, ev := range rev.Events {
		switch ev.Type {
		case mvccpb.Event_PUT:
			var opts []clientv3.OpOption
			if ev.Kv.Lease != 0 {
				opts = append(opts, clientv3.WithLease(clientv3.LeaseID(ev.Kv.Lease)))
			}
			ops = append(ops, clientv3.OpPut(string(ev.Kv.Key), string(ev.Kv.Value), opts...))
		case mvccpb.Event_DELETE:
			ops = append(ops, clientv3.OpDelete(string(ev.Kv.Key)))
		default:
			return fmt.Errorf("revision %d: event type %v is neither a put nor a delete", rev.Revision, ev.Type)
		}
	}
	resp, err := r.c.Txn(ctx).Then(ops...).Commit()
	if err != nil {
		return fmt.Errorf("replay revision %d (%d events): %w", rev.Revision, len(rev.Events), err)
	}
	if got := resp.Header.Revision; got != rev.Revision {
		return fmt.Errorf("replaying revision %d made the replay etcd's revision %d: revisions are no longer aligned, so keys would get wrong create and mod revisions. "+
			"Something else wrote to the replay etcd (a lease expiring during replay deletes its keys at a revision of its own), or the chain does not start at the full's revision; nothing was restored", rev.Revision, got)
	}
	r.res.Revision, r.res.Time = rev.Revision, rev.Time
	r.res.Revisions++
	r.res.Events += int64(len(rev.Events))
	return nil
}

// finishLeases leaves in the replay etcd only the leases some key holds
// at the point: one revoked or expired in the source after the full
// (neither is in the watch stream, only its keys' deletes are) holds no
// key there and is revoked, which writes no revision. The lost ones that
// keys still hold are reported.
func (r *replayer) finishLeases(ctx context.Context) error {
	var lost []int64
	for id := range r.present {
		ttl, err := r.c.TimeToLive(ctx, clientv3.LeaseID(id), clientv3.WithAttachedKeys())
		if err != nil {
			return fmt.Errorf("read lease %d of the replay etcd: %w", id, err)
		}
		if len(ttl.Keys) > 0 {
			if r.lost[id] {
				lost = append(lost, id)
			}
			continue
		}
		if _, err := r.c.Revoke(ctx, clientv3.LeaseID(id)); err != nil && !errors.Is(err, rpctypes.ErrLeaseNotFound) {
			return fmt.Errorf("revoke lease %d, which no key holds at the point: %w", id, err)
		}
	}
	slices.Sort(lost)
	r.res.LostLeases = lost
	return nil
}
