// Package delta is the delta agent: it watches the whole etcd keyspace
// from where a chain ends and stores what it sees as delta segments
// (package delta's format), cut every period or when a segment reaches
// its size bound, compressed and encrypted as backups are, through a
// Store (the data server). It holds at most one segment being uploaded and
// one being filled: when both are full it stops watching until the upload
// finished, so memory stays bounded however fast etcd is written. A gap in
// the revisions or a compaction past its position ends the chain; a
// refused upload (deposed writer) stops it at once. Leader election
// (which agent may write) is its command's job.
package delta

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	ebv1 "github.com/kubectl-etcdbackup/kubectl-etcdbackup/api/etcdbackup/v1"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/crypt"
	deltafmt "github.com/kubectl-etcdbackup/kubectl-etcdbackup/delta"
)

// Options say what to capture and where to.
type Options struct {
	// Etcd is watched and asked about leases.
	Etcd *clientv3.Client
	// Store holds the chain.
	Store Store
	// Chain is the full backup the chain starts from.
	Chain string
	// Epoch returns the writer's current fencing epoch, recorded in each
	// segment's header (the server refuses a stale one).
	Epoch func() int64
	// Period is the longest a segment spans from its first revision; 0 is
	// DefaultPeriod.
	Period time.Duration
	// MaxBytes bounds a plain segment: it is cut once it reaches this size
	// (a single revision may exceed it); 0 is DefaultMaxBytes.
	MaxBytes int64
	// Compression is one of ebv1.Compressions.
	Compression string
	// AgeRecipients, when set, are the age public keys every segment is
	// encrypted to, after compression.
	AgeRecipients []string
	// Now is the clock whose time is recorded with each revision; nil is
	// time.Now.
	Now func() time.Time
	// FlushTimeout bounds storing what is pending once ctx is done; 0 is
	// DefaultFlushTimeout.
	FlushTimeout time.Duration
	// Log receives progress; nil discards it.
	Log *slog.Logger
}

// Defaults of Options.
const (
	DefaultPeriod       = time.Minute
	DefaultMaxBytes     = 16 << 20
	DefaultFlushTimeout = 20 * time.Second
)

// ErrNotLeader, as the cause of Run's context, says the agent lost its
// leadership: Run stops without storing anything more, since another
// agent may be writing the chain already.
var ErrNotLeader = errors.New("lost leadership of the delta Lease")

// ErrDeposed is wrapped by Run's error when the store refused a segment
// as FailedPrecondition: this agent may not write the chain (it lost the
// Lease, its epoch is stale, or the chain moved on without it).
var ErrDeposed = errors.New("the server refused the delta segment: this agent may no longer write the chain")

// Result is what one Run did.
type Result struct {
	// ChainEnded says why the chain ended ("" when capture stopped with
	// ctx and the chain goes on).
	ChainEnded string
	// Segments is how many segments Run stored; LastRevision is the last
	// revision they hold (0 if none).
	Segments     int
	LastRevision int64
	// PeakHeldBytes is the most segment bytes (being filled plus being
	// uploaded) Run held at once.
	PeakHeldBytes int64
}

// Run captures until ctx is done (it then stores what it holds, within
// FlushTimeout, unless ctx's cause is ErrNotLeader), the chain ends, or a
// segment cannot be stored.
func Run(ctx context.Context, o Options) (Result, error) {
	c, err := newCapture(o)
	if err != nil {
		return Result{}, err
	}
	// No upload goroutine outlives Run.
	defer c.abandon()
	for {
		if c.next == 0 {
			st, err := c.o.Store.State(ctx)
			switch {
			case ctx.Err() != nil:
				return c.res, nil
			case err != nil:
				return c.res, err
			case st.Ended != "":
				c.res.ChainEnded = st.Ended
				c.log.Info("delta chain already ended", "chain", o.Chain, "reason", st.Ended)
				return c.res, nil
			}
			c.next, c.clusterID, c.stored = st.Next, st.ClusterID, st.LastEvent
			if st.LastEvent != nil {
				c.marks = []mark{{rev: st.Next - 1, ev: st.LastEvent, size: len(st.LastEvent.Key)}}
			}
			// Epochs only grow along a chain: a Lease re-created (its
			// transitions back at 0) must not make this writer's segments
			// look older than those stored before it.
			c.epoch = max(o.Epoch(), st.Epoch)
			c.log.Info("delta capture starting", "chain", o.Chain, "revision", st.Next, "epoch", c.epoch)
		}
		err := c.session(ctx)
		var end chainEnd
		switch {
		case errors.Is(err, errRewatch):
			continue
		case errors.Is(err, errReposition):
			c.discard()
			continue
		case errors.As(err, &end):
			return c.end(ctx, end)
		case ctx.Err() != nil && errors.Is(context.Cause(ctx), ErrNotLeader):
			return c.res, ErrNotLeader
		case ctx.Err() != nil:
			return c.res, c.flush(ctx)
		default:
			return c.res, err
		}
	}
}

var (
	// errRewatch: watch again from c.next.
	errRewatch = errors.New("watch again")
	// errReposition: drop what is held, ask the store where the chain is.
	errReposition = errors.New("ask the chain's position again")
)

// chainEnd is why the chain ends.
type chainEnd struct {
	reason string
	// historyBreak: etcd's history is no longer the chain's.
	historyBreak bool
}

func (e chainEnd) Error() string { return e.reason }

// capture is one Run's state, used by its goroutine only (uploads report
// through upload.done).
type capture struct {
	o   Options
	log *slog.Logger
	enc encoder
	res Result

	// next is the revision the watch must deliver next.
	next int64
	// epoch is this writer's fencing epoch, recorded in every segment.
	epoch int64
	// clusterID is the etcd cluster the chain's full was taken of (0
	// unknown).
	clusterID uint64
	// stored is the first event of revision next-1 as stored, and last
	// the same event once capture added it (it supersedes stored): what
	// etcd must still hold at next-1 for the chain to go on.
	stored *Event
	last   *mvccpb.Event
	// marks are writes etcd must still hold, each at its revision, for
	// what the filling segment holds to be one history: the chain's
	// stored end and the last write of every watch response since. A
	// watch resumed by etcd's client after etcd was restored without a
	// revision bump shows nothing else: its responses follow on as if
	// nothing happened, while a response before the restore holds a
	// write the new history does not (checked as the segment is cut).
	marks []mark
	// fill is the segment being filled; nil until a revision arrives.
	fill *filling
	// cutC fires when fill's period is over.
	cutTimer *time.Timer
	cutC     <-chan time.Time
	// cutDue: fill's period ended while an upload was in flight.
	cutDue bool
	// up is the segment being uploaded, nil if none.
	up *upload
	// upCtx is the uploads' context: not cancelled with Run's ctx, so
	// that a segment in flight at shutdown is still stored.
	upCtx    context.Context
	upCancel context.CancelFunc
	// watchRetries counts watches that failed in a row.
	watchRetries int
}

type upload struct {
	seg    Segment
	done   chan error
	cancel context.CancelFunc
}

func newCapture(o Options) (*capture, error) {
	switch {
	case o.Etcd == nil || o.Store == nil:
		return nil, errors.New("delta capture needs an etcd client and a store")
	case o.Chain == "":
		return nil, errors.New("delta capture needs the chain's name (its full backup)")
	case o.Epoch == nil:
		return nil, errors.New("delta capture needs the fencing epoch")
	}
	if err := ebv1.ValidateCompression(o.Compression); err != nil {
		return nil, err
	}
	if o.Period <= 0 {
		o.Period = DefaultPeriod
	}
	if o.MaxBytes <= 0 {
		o.MaxBytes = DefaultMaxBytes
	}
	if o.FlushTimeout <= 0 {
		o.FlushTimeout = DefaultFlushTimeout
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	if o.Log == nil {
		o.Log = slog.New(slog.DiscardHandler)
	}
	enc := encoder{chain: o.Chain, compression: o.Compression}
	if len(o.AgeRecipients) > 0 {
		rs, err := crypt.ParseRecipients(o.AgeRecipients)
		if err != nil {
			return nil, fmt.Errorf("encryption: %w", err)
		}
		enc.recipients, enc.ageRecipients = rs, o.AgeRecipients
	}
	c := &capture{o: o, log: o.Log, enc: enc}
	c.upCtx, c.upCancel = context.WithCancel(context.Background())
	return c, nil
}

// session watches from c.next until the watch must be started again, the
// chain ends, ctx is done, or storing fails.
func (c *capture) session(ctx context.Context) error {
	if err := c.checkHistory(ctx); err != nil {
		var end chainEnd
		if errors.As(err, &end) || ctx.Err() != nil {
			return err
		}
		return c.watchFailed(ctx, err)
	}
	wctx, cancelWatch := context.WithCancel(ctx)
	defer cancelWatch()
	// WithRequireLeader: a member cut off from its cluster ends the watch
	// rather than go silent, and the agent watches again.
	wch := c.o.Etcd.Watch(clientv3.WithRequireLeader(wctx), "", clientv3.WithPrefix(), clientv3.WithRev(c.next),
		clientv3.WithProgressNotify())
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-c.cutC:
			c.cutC = nil
			if c.up != nil {
				c.cutDue = true
				continue
			}
			if err := c.cut(ctx); err != nil {
				return err
			}
		case err := <-c.upDone():
			if err := c.uploaded(ctx, err); err != nil {
				return err
			}
		case wr, ok := <-wch:
			if !ok {
				if ctx.Err() != nil {
					return ctx.Err()
				}
				return c.watchFailed(ctx, errors.New("watch closed"))
			}
			if wr.CompactRevision != 0 || errors.Is(wr.Err(), rpctypes.ErrCompacted) {
				return chainEnd{reason: fmt.Sprintf("etcd compacted revision %d past the agent's position %d", wr.CompactRevision, c.next)}
			}
			if err := wr.Err(); err != nil {
				return c.watchFailed(ctx, err)
			}
			if err := c.checkHeader(ctx, wr.Header.ClusterId, wr.Header.Revision); err != nil {
				return err
			}
			if len(wr.Events) == 0 {
				continue // created, progress notification
			}
			c.watchRetries = 0
			blocked, err := c.events(ctx, wr.Events, cancelWatch)
			if err != nil {
				return err
			}
			c.mark()
			if blocked {
				// The watch was cancelled to stop etcd's client from
				// buffering while the agent could not take more.
				return errRewatch
			}
		}
	}
}

// watchFailed waits before watching again, longer each time in a row.
func (c *capture) watchFailed(ctx context.Context, err error) error {
	c.watchRetries++
	wait := min(time.Duration(c.watchRetries)*time.Second, 10*time.Second)
	c.log.Warn("etcd watch failed; watching again", "chain", c.o.Chain, "revision", c.next, "retryIn", wait.String(), "error", err.Error())
	t := time.NewTimer(wait)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case err := <-c.upDone():
			if err := c.uploaded(ctx, err); err != nil {
				return err
			}
		case <-t.C:
			return errRewatch
		}
	}
}

// events adds a watch response's events, revision by revision. When the
// segment being filled is full while another is being uploaded, it
// cancels the watch (blocked) and waits for the upload: the rest of this
// response is all that is held beyond the two segments.
func (c *capture) events(ctx context.Context, evs []*clientv3.Event, cancelWatch context.CancelFunc) (blocked bool, err error) {
	for i := 0; i < len(evs); {
		rev := evs[i].Kv.ModRevision
		j := i
		for j < len(evs) && evs[j].Kv.ModRevision == rev {
			j++
		}
		if rev != c.next {
			return blocked, chainEnd{reason: fmt.Sprintf("the etcd watch jumped from revision %d to %d: revisions were missed, the chain cannot go on", c.next-1, rev)}
		}
		batch := make([]*mvccpb.Event, 0, j-i)
		for _, ev := range evs[i:j] {
			batch = append(batch, (*mvccpb.Event)(ev))
		}
		if err := c.add(ctx, rev, batch); err != nil {
			return blocked, err
		}
		i = j
		if c.fill.size() < c.o.MaxBytes {
			continue
		}
		if c.up != nil {
			if !blocked {
				cancelWatch()
				blocked = true
				c.log.Info("delta segment full while the previous one uploads: pausing the watch", "chain", c.o.Chain, "revision", rev)
			}
			if err := c.waitUpload(ctx); err != nil {
				return blocked, err
			}
			if c.fill == nil {
				continue // a due cut took it
			}
		}
		if err := c.cut(ctx); err != nil {
			return blocked, err
		}
		if c.fill != nil {
			// Full, and etcd did not confirm it: take no more until it
			// does.
			return blocked, c.watchFailed(ctx, errors.New("etcd did not confirm the held revisions"))
		}
	}
	return blocked, nil
}

// add records one revision in the filling segment, with the leases its
// events use that the segment does not hold yet.
func (c *capture) add(ctx context.Context, rev int64, evs []*mvccpb.Event) error {
	now := c.o.Now()
	if c.fill == nil {
		f, err := newFilling(deltafmt.Header{Chain: c.o.Chain, Epoch: c.epoch, FirstRevision: rev})
		if err != nil {
			return err
		}
		c.fill = f
		c.cutTimer = time.NewTimer(c.o.Period)
		c.cutC = c.cutTimer.C
	}
	for _, ev := range evs {
		id := ev.Kv.Lease
		if id == 0 || c.fill.leases[id] {
			continue
		}
		l, err := c.lease(ctx, id)
		if err != nil {
			return err
		}
		if err := c.fill.w.AddLease(l); err != nil {
			return err
		}
		c.fill.leases[id] = true
	}
	if err := c.fill.w.AddRevision(deltafmt.Revision{Revision: rev, Time: now, Events: evs}); err != nil {
		if errors.Is(err, deltafmt.ErrRevisionTooLarge) {
			// Stored, it would make every later point and every fold
			// fail: the chain ends before it, and a full backup (which
			// holds its result) starts the next one.
			return chainEnd{reason: fmt.Sprintf("%v; the chain ends before it and a full backup starts a new one", err)}
		}
		return err
	}
	m := markEvent(evs)
	c.next, c.last, c.fill.last = rev+1, m, m
	c.held()
	return nil
}

// lease reads a lease as it is now; one already gone has Remaining -1.
func (c *capture) lease(ctx context.Context, id int64) (deltafmt.Lease, error) {
	r, err := c.o.Etcd.TimeToLive(ctx, clientv3.LeaseID(id))
	if errors.Is(err, rpctypes.ErrLeaseNotFound) {
		return deltafmt.Lease{ID: id, Remaining: -1}, nil
	}
	if err != nil {
		return deltafmt.Lease{}, fmt.Errorf("read etcd lease %x used at revision %d: %w", id, c.next, err)
	}
	if r.TTL < 0 {
		return deltafmt.Lease{ID: id, TTL: r.GrantedTTL, Remaining: -1}, nil
	}
	return deltafmt.Lease{ID: id, TTL: r.GrantedTTL, Remaining: r.TTL}, nil
}

// held records the bytes held now.
func (c *capture) held() {
	var n int64
	if c.fill != nil {
		n += c.fill.size()
	}
	if c.up != nil {
		n += int64(len(c.up.seg.Body))
	}
	c.res.PeakHeldBytes = max(c.res.PeakHeldBytes, n)
}

// cut ends the filling segment and starts its upload; no upload may be
// in flight. What it holds is checked against etcd first: a history
// break drops it and ends the chain where it was stored last; when etcd
// cannot answer, the segment is kept and cut again shortly.
func (c *capture) cut(ctx context.Context) error {
	if c.fill == nil {
		return nil
	}
	if err := c.verify(ctx); err != nil {
		var end chainEnd
		switch {
		case errors.As(err, &end):
			c.dropFill()
			return end
		case ctx.Err() != nil:
			return ctx.Err()
		}
		c.log.Warn("could not check the held revisions against etcd; keeping them and trying again", "chain", c.o.Chain,
			"firstRevision", c.fill.first, "lastRevision", c.next-1, "error", err.Error())
		c.stopTimer()
		c.cutTimer = time.NewTimer(min(c.o.Period, verifyRetry))
		c.cutC = c.cutTimer.C
		return nil
	}
	seg, err := c.enc.encode(ctx, c.fill, "")
	if err != nil {
		return err
	}
	held := c.fill.size()
	if c.enc.copies() {
		held += int64(len(seg.Body))
	}
	c.res.PeakHeldBytes = max(c.res.PeakHeldBytes, held)
	c.stopTimer()
	c.marks = []mark{markOf(c.next-1, c.fill.last)}
	c.fill, c.cutDue = nil, false
	c.startUpload(seg)
	return nil
}

// verifyRetry is how soon a segment whose check etcd did not answer is
// cut again.
const verifyRetry = 5 * time.Second

// mark is a write etcd must hold at rev.
type mark struct {
	rev  int64
	ev   *Event
	size int
}

func markOf(rev int64, ev *mvccpb.Event) mark {
	return mark{rev: rev, ev: eventOf(ev), size: len(ev.Kv.Key) + len(ev.Kv.Value)}
}

// mark records the newest write received, once per revision.
func (c *capture) mark() {
	if c.last == nil {
		return
	}
	rev := c.next - 1
	if n := len(c.marks); n > 0 && c.marks[n-1].rev == rev {
		return
	}
	c.marks = append(c.marks, markOf(rev, c.last))
}

// Bounds of one check's transaction: etcd refuses more than 128
// operations by default (--max-txn-ops), and the answer carries values.
const (
	verifyOps   = 64
	verifyBytes = 4 << 20
)

// markEvent is the event of one revision that best proves it: a put
// (its value is checked) before a delete (only its key's absence and
// presence just before are).
func markEvent(evs []*mvccpb.Event) *mvccpb.Event {
	for _, ev := range evs {
		if ev.Type == mvccpb.Event_PUT {
			return ev
		}
	}
	return evs[0]
}

// checkOps are the reads that prove etcd holds m: a put's key at m.rev;
// a delete's key at m.rev and, counted, at m.rev-1. Absence alone would
// hold in any history without the key at m.rev (seen: etcd restored in
// place under a chain whose last stored revision was a delete went on
// as if nothing changed); a delete is proven by the key being there
// just before.
func checkOps(m mark) []clientv3.Op {
	ops := []clientv3.Op{clientv3.OpGet(string(m.ev.Key), clientv3.WithRev(m.rev))}
	if m.ev.Deleted {
		ops = append(ops, clientv3.OpGet(string(m.ev.Key), clientv3.WithRev(m.rev-1), clientv3.WithCountOnly()))
	}
	return ops
}

// verify checks that etcd still holds every mark and the filling
// segment's newest write: a linearizable read-only transaction per batch.
func (c *capture) verify(ctx context.Context) error {
	checks := append(c.marks[:len(c.marks):len(c.marks)], markOf(c.next-1, c.fill.last))
	for len(checks) > 0 {
		var ops []clientv3.Op
		n, size := 0, 0
		for n < len(checks) && len(ops)+2 <= verifyOps && (n == 0 || size+checks[n].size <= verifyBytes) {
			size += checks[n].size
			ops = append(ops, checkOps(checks[n])...)
			n++
		}
		batch := checks[:n]
		checks = checks[n:]
		resp, err := c.o.Etcd.Txn(ctx).Then(ops...).Commit()
		if errors.Is(err, rpctypes.ErrCompacted) || errors.Is(err, rpctypes.ErrFutureRev) {
			// One of them is out of etcd's range: ask one by one.
			for _, m := range batch {
				if err := c.verifyOne(ctx, m); err != nil {
					return err
				}
			}
			continue
		}
		if err != nil {
			return fmt.Errorf("check the held revisions %d-%d against etcd: %w", batch[0].rev, batch[len(batch)-1].rev, err)
		}
		if err := c.checkCluster(resp.Header.ClusterId); err != nil {
			return err
		}
		i := 0
		for _, m := range batch {
			ok := holds(resp.Responses[i].GetResponseRange().GetKvs(), m.ev, m.rev)
			i++
			if m.ev.Deleted {
				ok = ok && resp.Responses[i].GetResponseRange().GetCount() == 1
				i++
			}
			if !ok {
				return c.changedUnder(m)
			}
		}
	}
	return nil
}

// verifyOne checks one mark; one etcd compacted away cannot be checked.
func (c *capture) verifyOne(ctx context.Context, m mark) error {
	resp, err := c.o.Etcd.Get(ctx, string(m.ev.Key), clientv3.WithRev(m.rev))
	switch {
	case errors.Is(err, rpctypes.ErrCompacted):
		return nil
	case errors.Is(err, rpctypes.ErrFutureRev):
		return c.wentBack(ctx, m.rev)
	case err != nil:
		return fmt.Errorf("check held revision %d against etcd: %w", m.rev, err)
	}
	if err := c.checkCluster(resp.Header.ClusterId); err != nil {
		return err
	}
	if !holds(resp.Kvs, m.ev, m.rev) {
		return c.changedUnder(m)
	}
	if there, err := c.thereBefore(ctx, m.ev, m.rev); err != nil || !there {
		if err != nil {
			return err
		}
		return c.changedUnder(m)
	}
	return nil
}

// thereBefore says whether a deleted key was there just before the
// revision that deleted it (see checkOps); a put, or a revision etcd
// compacted away, cannot say otherwise.
func (c *capture) thereBefore(ctx context.Context, ev *Event, rev int64) (bool, error) {
	if !ev.Deleted {
		return true, nil
	}
	resp, err := c.o.Etcd.Get(ctx, string(ev.Key), clientv3.WithRev(rev-1), clientv3.WithCountOnly())
	switch {
	case errors.Is(err, rpctypes.ErrCompacted):
		return true, nil
	case err != nil:
		return false, fmt.Errorf("check held revision %d against etcd: %w", rev, err)
	}
	return resp.Count == 1, nil
}

// holds says whether kvs, etcd's answer for ev's key at rev, is ev.
func holds(kvs []*mvccpb.KeyValue, ev *Event, rev int64) bool {
	if ev.Deleted {
		return len(kvs) == 0
	}
	return len(kvs) == 1 && kvs[0].ModRevision == rev && eventOf(&mvccpb.Event{Kv: kvs[0]}).ValueSHA256 == ev.ValueSHA256
}

func (c *capture) changedUnder(m mark) error {
	return chainEnd{historyBreak: true, reason: fmt.Sprintf("etcd holds another write at revision %d than the agent received there (key %q): etcd's history changed under the running agent (restored without a revision bump, or re-created); the chain ends at revision %d, where it was last stored, and a full backup starts a new one",
		m.rev, m.ev.Key, c.stored0())}
}

// stored0 is the revision the chain was last stored at: where a dropped
// filling segment starts, less one.
func (c *capture) stored0() int64 {
	if c.fill != nil {
		return c.fill.first - 1
	}
	return c.next - 1
}

// dropFill drops the filling segment: capture goes on (or the chain
// ends) where the chain was last stored.
func (c *capture) dropFill() {
	if c.fill == nil {
		return
	}
	c.log.Warn("dropping the revisions held since the chain was last stored: etcd's history changed under them",
		"chain", c.o.Chain, "firstRevision", c.fill.first, "lastRevision", c.next-1)
	c.next, c.last = c.fill.first, nil
	c.stopTimer()
	c.fill, c.cutDue, c.marks = nil, false, nil
}

func (c *capture) stopTimer() {
	if c.cutTimer != nil {
		c.cutTimer.Stop()
	}
	c.cutTimer, c.cutC = nil, nil
}

func (c *capture) startUpload(seg Segment) {
	ctx, cancel := context.WithCancel(c.upCtx)
	u := &upload{seg: seg, done: make(chan error, 1), cancel: cancel}
	c.up = u
	go func() {
		seg.AuthRevision = c.authRevision(ctx)
		u.done <- c.put(ctx, seg)
	}()
}

// put stores seg, trying again while the error may pass (the server or
// its storage unavailable a while).
func (c *capture) put(ctx context.Context, seg Segment) error {
	for wait := time.Second; ; wait = min(2*wait, 30*time.Second) {
		err := c.o.Store.Put(ctx, seg)
		if err == nil || !transient(err) || ctx.Err() != nil {
			return err
		}
		c.log.Warn("storing delta segment failed; trying again", "segment", seg.Name, "retryIn", wait.String(), "error", err.Error())
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return err
		case <-t.C:
		}
	}
}

func transient(err error) bool {
	switch status.Code(err) {
	case codes.Unavailable, codes.DeadlineExceeded, codes.ResourceExhausted, codes.Aborted, codes.Internal, codes.Unknown:
		return true
	}
	return false
}

// upDone is the in-flight upload's result channel; nil (never ready)
// when none is.
func (c *capture) upDone() <-chan error {
	if c.up == nil {
		return nil
	}
	return c.up.done
}

// waitUpload waits for the in-flight upload and handles its result.
func (c *capture) waitUpload(ctx context.Context) error {
	if c.up == nil {
		return nil
	}
	select {
	case <-ctx.Done():
		return ctx.Err()
	case err := <-c.up.done:
		return c.uploaded(ctx, err)
	}
}

// uploaded handles the in-flight upload's result.
func (c *capture) uploaded(ctx context.Context, err error) error {
	u := c.up
	c.up = nil
	u.cancel()
	sum := u.seg.Summary
	switch {
	case err == nil:
		c.res.Segments++
		c.res.LastRevision = sum.LastRevision
		c.log.Info("delta segment stored", "segment", u.seg.Name, "firstRevision", sum.FirstRevision, "lastRevision", sum.LastRevision,
			"events", sum.Events, "size", len(u.seg.Body), "rawSize", u.seg.RawSize, "endReason", sum.EndReason)
	case status.Code(err) == codes.FailedPrecondition:
		return fmt.Errorf("%w: %w; capture stopped (another agent may hold the Lease now)", ErrDeposed, err)
	case status.Code(err) == codes.AlreadyExists:
		c.log.Warn("delta segment already stored: asking the server where the chain ends", "segment", u.seg.Name, "error", err.Error())
		return errReposition
	default:
		return fmt.Errorf("store delta segment %s (revisions %d-%d): %w", u.seg.Name, sum.FirstRevision, sum.LastRevision, err)
	}
	if c.cutDue {
		return c.cut(ctx)
	}
	return nil
}

// discard drops what is held, to start again from the store's position.
func (c *capture) discard() {
	c.abandon()
	c.stopTimer()
	c.fill, c.cutDue, c.next, c.stored, c.last, c.marks = nil, false, 0, nil, nil, nil
}

// abandon cancels the in-flight upload and waits for its goroutine.
func (c *capture) abandon() {
	if c.up != nil {
		c.up.cancel()
		<-c.up.done
		c.up = nil
	}
}

// flush stores what is held once ctx is done, within FlushTimeout.
func (c *capture) flush(ctx context.Context) error {
	fctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), c.o.FlushTimeout)
	defer cancel()
	stop := context.AfterFunc(fctx, c.upCancel)
	defer stop()
	if err := c.waitUpload(fctx); err != nil {
		return c.flushErr(err)
	}
	if c.fill == nil {
		c.log.Info("delta capture stopped", "chain", c.o.Chain, "lastRevision", c.res.LastRevision)
		return nil
	}
	if err := c.cut(fctx); err != nil {
		var brk chainEnd
		if errors.As(err, &brk) {
			_, err := c.end(ctx, brk)
			return err
		}
		return c.flushErr(err)
	}
	if c.fill != nil {
		// Nothing is lost: etcd still holds them for the next agent.
		c.log.Warn("delta capture stopped; pending revisions not stored, etcd did not confirm them (the next agent reads them again)",
			"chain", c.o.Chain, "firstRevision", c.fill.first, "lastRevision", c.next-1)
		return nil
	}
	if err := c.waitUpload(fctx); err != nil {
		return c.flushErr(err)
	}
	c.log.Info("delta capture stopped; pending revisions stored", "chain", c.o.Chain, "lastRevision", c.res.LastRevision)
	return nil
}

func (c *capture) flushErr(err error) error {
	if errors.Is(err, errReposition) {
		// Someone stored it already: nothing is lost.
		return nil
	}
	return fmt.Errorf("store the pending delta segment on shutdown (revisions from %d): %w", c.next, err)
}

// end stores the chain's last segment, saying why it ends: the pending
// revisions, or none (first revision c.next, last c.next-1).
func (c *capture) end(ctx context.Context, e chainEnd) (Result, error) {
	reason := e.reason
	if errors.Is(context.Cause(ctx), ErrNotLeader) {
		return c.res, ErrNotLeader
	}
	c.log.Warn("delta chain ends", "chain", c.o.Chain, "reason", reason)
	fctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), c.o.FlushTimeout)
	defer cancel()
	if err := c.waitUpload(fctx); err != nil {
		return c.res, fmt.Errorf("delta chain ends (%s), but a segment before the end could not be stored: %w", reason, err)
	}
	if c.fill != nil {
		// What is held goes into the end segment only if etcd still
		// holds it.
		if err := c.verifyRetrying(fctx); err != nil {
			var brk chainEnd
			if errors.As(err, &brk) {
				e, reason = brk, brk.reason
			} else {
				c.log.Warn("could not check the held revisions against etcd; the chain ends where it was last stored", "chain", c.o.Chain, "error", err.Error())
			}
			c.dropFill()
		}
	}
	f := c.fill
	if f == nil {
		var err error
		if f, err = newFilling(deltafmt.Header{Chain: c.o.Chain, Epoch: c.epoch, FirstRevision: c.next}); err != nil {
			return c.res, err
		}
	}
	seg, err := c.enc.encode(fctx, f, reason)
	if err != nil {
		return c.res, err
	}
	seg.HistoryBreak = e.historyBreak
	c.stopTimer()
	c.fill = nil
	c.startUpload(seg)
	if err := c.waitUpload(fctx); err != nil {
		return c.res, fmt.Errorf("delta chain ends (%s), but its end segment could not be stored: %w", reason, err)
	}
	c.res.ChainEnded = reason
	return c.res, nil
}

// verifyRetrying is verify, tried again while etcd does not answer and
// ctx lasts.
func (c *capture) verifyRetrying(ctx context.Context) error {
	for {
		err := c.verify(ctx)
		var brk chainEnd
		if err == nil || errors.As(err, &brk) || ctx.Err() != nil {
			return err
		}
		t := time.NewTimer(time.Second)
		select {
		case <-ctx.Done():
			t.Stop()
			return err
		case <-t.C:
		}
	}
}

// checkHistory makes sure etcd's history is still the one the chain
// holds before capture goes on from c.next: etcd's revision is not
// below the chain's (an etcd restored without a revision bump, or
// re-created, starts lower), its cluster is the full backup's, and the
// newest revision the chain holds is the same write in etcd (a history
// that has meanwhile grown past the chain's end holds other writes
// there). Any of these ends the chain as a history break, so that
// another history is never appended to it. When etcd compacted that
// write away, only the cluster and revision are checked and the watch
// says how far etcd compacted; other errors are etcd's and pass.
func (c *capture) checkHistory(ctx context.Context) error {
	held := c.next - 1
	ev := c.stored
	if c.last != nil {
		ev = eventOf(c.last)
	}
	// A linearizable read (clientv3's default): a member that lags its
	// leader answers once it caught up.
	key, opts := "\x00", []clientv3.OpOption{clientv3.WithRev(held), clientv3.WithCountOnly()}
	if ev != nil {
		key, opts = string(ev.Key), []clientv3.OpOption{clientv3.WithRev(held)}
	}
	resp, err := c.o.Etcd.Get(ctx, key, opts...)
	switch {
	case errors.Is(err, rpctypes.ErrCompacted):
		// The write at held is gone, so only etcd's cluster and
		// revision can be checked; the watch then says how far etcd
		// compacted (or goes on, compacted exactly to c.next).
		now, err := c.o.Etcd.Get(ctx, "\x00", clientv3.WithCountOnly())
		if err != nil {
			return fmt.Errorf("read etcd's revision: %w", err)
		}
		return c.checkHeader(ctx, now.Header.ClusterId, now.Header.Revision)
	case errors.Is(err, rpctypes.ErrFutureRev):
		return c.wentBack(ctx, held)
	case err != nil:
		return fmt.Errorf("read etcd at revision %d, where the chain ends: %w", held, err)
	}
	if err := c.checkCluster(resp.Header.ClusterId); err != nil {
		return err
	}
	if ev == nil {
		return nil
	}
	there := false
	if holds(resp.Kvs, ev, held) {
		if there, err = c.thereBefore(ctx, ev, held); err != nil {
			return err
		}
	}
	if !there {
		return chainEnd{historyBreak: true, reason: fmt.Sprintf("etcd holds another write at revision %d than the chain does (key %q): its history changed under the chain (restored without a revision bump, or re-created); the chain ends here and a full backup starts a new one", held, ev.Key)}
	}
	return nil
}

// checkHeader checks a watch response's header: etcd's revision never
// below the chain's, the cluster the full's.
func (c *capture) checkHeader(ctx context.Context, clusterID uint64, rev int64) error {
	if err := c.checkCluster(clusterID); err != nil {
		return err
	}
	if rev == 0 || rev >= c.next-1 {
		return nil
	}
	// The member answering may lag its leader: ask linearizably before
	// calling it a break.
	resp, err := c.o.Etcd.Get(ctx, "\x00", clientv3.WithCountOnly())
	if err != nil {
		return c.watchFailed(ctx, fmt.Errorf("confirm etcd's revision %d, below the chain's %d: %w", rev, c.next-1, err))
	}
	if resp.Header.Revision >= c.next-1 {
		return nil
	}
	return c.wentBack(ctx, c.next-1)
}

// wentBack ends the chain: etcd is at a revision below held.
func (c *capture) wentBack(ctx context.Context, held int64) error {
	now := "an earlier one"
	if resp, err := c.o.Etcd.Get(ctx, "\x00", clientv3.WithCountOnly()); err == nil {
		now = fmt.Sprint(resp.Header.Revision)
	}
	return chainEnd{historyBreak: true, reason: fmt.Sprintf("etcd's revision went back: the chain holds revisions up to %d, etcd is at %s (restored without a revision bump, or re-created); the chain ends here and a full backup starts a new one", held, now)}
}

// authRevision is etcd's auth revision now, 0 when etcd does not say
// (it is only a hint for a restore's warning).
func (c *capture) authRevision(ctx context.Context) uint64 {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	st, err := c.o.Etcd.AuthStatus(ctx)
	if err != nil {
		return 0
	}
	return st.AuthRevision
}

// checkCluster ends the chain when etcd is another cluster than the one
// the full was taken of.
func (c *capture) checkCluster(id uint64) error {
	if c.clusterID == 0 || id == 0 || id == c.clusterID {
		return nil
	}
	return chainEnd{historyBreak: true, reason: fmt.Sprintf("etcd is cluster %x, the chain's full backup was taken of cluster %x: another etcd answers under the target's name; the chain ends here and a full backup starts a new one", id, c.clusterID)}
}
