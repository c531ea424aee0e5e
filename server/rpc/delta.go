package rpc

import (
	"context"
	"errors"
	"sync"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/api/agentjob"
	ebv1 "github.com/kubectl-etcdbackup/kubectl-etcdbackup/api/etcdbackup/v1"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/delta"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/server/auth"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/server/rpc/internal/edge"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/storage"
)

// DeltaFence tells whether a delta agent may store segments now: it holds
// its target's delta Lease, in the epoch its segment records, which is
// the Lease's transitions or, when the Lease was re-created (its
// transitions back at 0), the epoch the chain already has: epochs never
// go back along a chain (jobs.Launcher.CheckDeltaWriter).
type DeltaFence interface {
	CheckDeltaWriter(ctx context.Context, target, pod string, epoch, chainEpoch int64) error
}

// chains remembers where each chain stored by this server ends, so that
// accepting a segment does not list the location. It is only a cache of
// what storage says: another replica may have stored segments since, so
// a segment that does not follow the cached end (or a cached end that
// says the chain ended) is checked against storage again before it is
// refused. A segment is accepted only when it starts where the chain
// ends, under the chain's lock.
type chains struct {
	mu    sync.Mutex
	locks map[string]*sync.Mutex
	ends  map[string]chainEnd
}

type chainEnd struct {
	next   int64
	reason string
	// epoch is the newest stored segment's writer epoch (0 for none).
	epoch int64
}

func (c *chains) lock(key string) func() {
	c.mu.Lock()
	if c.locks == nil {
		c.locks, c.ends = map[string]*sync.Mutex{}, map[string]chainEnd{}
	}
	l, ok := c.locks[key]
	if !ok {
		l = &sync.Mutex{}
		c.locks[key] = l
	}
	c.mu.Unlock()
	l.Lock()
	return l.Unlock
}

func (c *chains) get(key string) (chainEnd, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	e, ok := c.ends[key]
	return e, ok
}

func (c *chains) forget(key string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	delete(c.ends, key)
}

func (c *chains) set(key string, e chainEnd) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.ends[key] = e
}

// admitSegment holds a delta agent's upload to the one thing it may
// store: the next segment of its own chain, while it holds its target's
// delta Lease in the epoch the segment records. It returns what releases
// the chain's lock, which the caller holds until the segment is stored
// or dropped, so that two segments of a chain are never admitted at once.
func (s *Service) admitSegment(ctx context.Context, a *auth.Agent, h *ebv1.UploadHeader, locName string, loc storage.Location) (func(), error) {
	d := h.GetDelta()
	switch {
	case a == nil || a.Kind != agentjob.Delta:
		return nil, status.Error(codes.PermissionDenied, "only a target's delta agent stores delta segments")
	case d == nil:
		return nil, status.Errorf(codes.PermissionDenied, "%s may upload only delta segments (the header's delta)", a)
	case d.GetChain() != a.Backup || locName != a.Location:
		return nil, status.Errorf(codes.PermissionDenied, "%s may store segments of chain %q in location %q only, not of %q in %q", a, a.Backup, a.Location, d.GetChain(), locName)
	case d.GetFirstRevision() <= 0 || d.GetLastRevision() < d.GetFirstRevision()-1 || d.GetEvents() < 0 || d.GetEpoch() < 0:
		return nil, status.Errorf(codes.InvalidArgument, "delta segment of revisions %d..%d with %d events in epoch %d is not a segment any agent writes",
			d.GetFirstRevision(), d.GetLastRevision(), d.GetEvents(), d.GetEpoch())
	case h.GetName() != storage.SegmentName(d.GetChain(), d.GetFirstRevision()):
		return nil, status.Errorf(codes.InvalidArgument, "a delta segment of chain %q starting at revision %d is named %q, not %q",
			d.GetChain(), d.GetFirstRevision(), storage.SegmentName(d.GetChain(), d.GetFirstRevision()), h.GetName())
	case h.GetCompression() == ebv1.CompressionNone && h.GetEncryption() == ebv1.EncryptionNone:
		return nil, status.Error(codes.InvalidArgument, "a delta segment is stored compressed or encrypted, with its plain size and SHA-256 (raw_size, raw_sha256)")
	}
	if s.deltaFence == nil {
		return nil, status.Error(codes.FailedPrecondition, "this server runs no delta agents, so it stores no delta segments")
	}
	key := locName + "/" + d.GetChain()
	unlock := s.chains.lock(key)
	end, err := s.chainEnd(ctx, key, loc, d.GetChain())
	if err == nil && (end.reason != "" || d.GetFirstRevision() != end.next) {
		// The cache may be stale (another replica stored segments):
		// storage decides.
		s.chains.forget(key)
		end, err = s.chainEnd(ctx, key, loc, d.GetChain())
	}
	if err != nil {
		unlock()
		return nil, err
	}
	if err := s.deltaFence.CheckDeltaWriter(ctx, a.Target, a.Pod, d.GetEpoch(), end.epoch); err != nil {
		unlock()
		s.log.Warn("delta segment refused: not the writer", "chain", d.GetChain(), "segment", h.GetName(), "caller", a.String(), "error", err)
		return nil, status.Errorf(codes.FailedPrecondition, "delta segment %q refused: %v; only the agent holding the Lease stores segments, stop this one", h.GetName(), err)
	}
	s.recordClockOffset(a.Target, d)
	switch {
	case end.reason != "":
		unlock()
		return nil, status.Errorf(codes.FailedPrecondition, "chain %q ended (%s): it takes no more segments; a new full backup starts a new chain", d.GetChain(), end.reason)
	case d.GetFirstRevision() != end.next:
		unlock()
		return nil, status.Errorf(codes.FailedPrecondition, "delta segment %q starts at revision %d but chain %q ends at revision %d: out of order, the next segment starts at %d",
			h.GetName(), d.GetFirstRevision(), d.GetChain(), end.next-1, end.next)
	}
	return unlock, nil
}

// chainEnd is where chain (in loc, key) ends as stored: the revision its
// next segment starts at. The caller holds the chain's lock.
func (s *Service) chainEnd(ctx context.Context, key string, loc storage.Location, chain string) (chainEnd, error) {
	// The full, every time: a segment whose full was removed (retention,
	// delete) would be stored where nothing lists or removes it.
	full, err := loc.Stat(ctx, chain)
	if errors.Is(err, storage.ErrNotFound) {
		return chainEnd{}, status.Errorf(codes.FailedPrecondition, "chain %q: its full backup is not stored (removed?); a delta chain follows a stored full backup", chain)
	}
	if err != nil {
		return chainEnd{}, edge.StorageStatus("get", "", chain, err)
	}
	if e, ok := s.chains.get(key); ok {
		return e, nil
	}
	if full.Etcd == nil || !full.Etcd.SnapshotStatus || full.Etcd.Revision <= 0 {
		return chainEnd{}, status.Errorf(codes.FailedPrecondition, "backup %q records no revision read from its snapshot, so no chain can follow it; take a new backup", chain)
	}
	all, err := loc.List(ctx)
	if err != nil {
		return chainEnd{}, edge.StorageStatus("list", "", "", err)
	}
	_, segments := storage.SplitParts(all)
	sum := edge.ChainSummary(full, storage.Chains(segments)[chain])
	e := chainEnd{next: full.Etcd.Revision + 1, reason: ""}
	if sum != nil {
		e = chainEnd{next: sum.GetLastRevision() + 1, reason: sum.GetEndReason(), epoch: sum.GetEpoch()}
	}
	s.chains.set(key, e)
	return e, nil
}

// segmentStored moves the chain's end past a stored segment.
func (s *Service) segmentStored(locName string, m *storage.Manifest) {
	d := m.Delta
	s.chains.set(locName+"/"+d.Chain, chainEnd{next: d.LastRevision + 1, reason: d.EndReason, epoch: d.Epoch})
	s.metrics.DeltaStored(m.Source.Target, m.Size, d.LastTime, d.Events)
	if d.EndReason != "" {
		s.metrics.ChainEnds.WithLabelValues(m.Source.Target).Inc()
		s.log.Warn("delta chain ended", "chain", d.Chain, "target", m.Source.Target, "lastRevision", d.LastRevision, "reason", d.EndReason)
	}
}

// recordClockOffset records, in d and the metrics, the server's clock
// minus the agent's as the segment's upload arrives (transit included),
// and warns when it is more than a restore to a time can ignore.
func (s *Service) recordClockOffset(target string, d *ebv1.DeltaSegment) {
	sent := d.GetSentTime()
	if sent == nil {
		return
	}
	offset := s.now().Sub(sent.AsTime())
	d.ClockOffsetSeconds = offset.Seconds()
	s.metrics.ClockOffset.WithLabelValues(target).Set(offset.Seconds())
	if offset.Abs() > delta.MaxClockOffset {
		s.log.Warn("delta agent's clock is off the server's: the times it stamps on revisions, which restores to a time go by, are off as much; run NTP (chrony, systemd-timesyncd) on the node",
			"target", target, "chain", d.GetChain(), "offsetSeconds", offset.Seconds())
	}
}

// deltaFromHeader is the manifest's record of an admitted segment.
func deltaFromHeader(d *ebv1.DeltaSegment) *storage.Delta {
	out := &storage.Delta{
		Chain: d.GetChain(), Epoch: d.GetEpoch(), FirstRevision: d.GetFirstRevision(), LastRevision: d.GetLastRevision(),
		Events: d.GetEvents(), EndReason: d.GetEndReason(), HistoryBreak: d.GetHistoryBreak(),
		ClockOffset:  time.Duration(d.GetClockOffsetSeconds() * float64(time.Second)),
		AuthRevision: d.GetAuthRevision(),
	}
	if e := d.GetLastEvent(); e != nil {
		out.LastEvent = &storage.DeltaEvent{Key: e.GetKey(), Deleted: e.GetDeleted(), ValueSHA256: e.GetValueSha256()}
	}
	if t := d.GetFirstTime(); t != nil {
		out.FirstTime = t.AsTime()
	}
	if t := d.GetLastTime(); t != nil {
		out.LastTime = t.AsTime()
	}
	return out
}
