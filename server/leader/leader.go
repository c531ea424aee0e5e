// Package leader elects the one replica of the data server that runs the
// background controller (server/controller): scheduled backups, run
// observation, retention, drills, delta agents and folds must each
// happen once, however many replicas serve the user and agent APIs.
//
// It is client-go's leader election (tools/leaderelection) on a
// coordination.k8s.io Lease in the server's namespace, with two
// additions: the leader's context ends as soon as the Lease has gone
// unrenewed for RenewDeadline, without waiting for client-go to give the
// Lease back (which can take another RenewDeadline when the API server
// is unreachable, by when another replica may lead); and at shutdown the
// controller stops before the Lease is released, so that another replica
// can take over at once but never runs beside it.
package leader

import (
	"cmp"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"log/slog"
	"sync"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/leaderelection"
	"k8s.io/client-go/tools/leaderelection/resourcelock"
)

// LeaseName is the Lease the replicas compete for.
const LeaseName = "etcdbackup-controller"

// The election's timing: a leader that cannot renew stops leading after
// RenewDeadline, and another replica takes the Lease once it has gone
// unrenewed for LeaseDuration, so that between the two there are at
// least 5 s in which nobody leads. Replicas check every RetryPeriod.
const (
	DefaultLeaseDuration = 15 * time.Second
	DefaultRenewDeadline = 10 * time.Second
	DefaultRetryPeriod   = 2 * time.Second
)

// Config is what an Elector needs.
type Config struct {
	Client kubernetes.Interface
	// Namespace holds the Lease: the server's own.
	Namespace string
	// Name is the Lease's; "" is LeaseName.
	Name string
	// Identity names this replica in the Lease (NewIdentity); each
	// replica, and each start of one, needs its own.
	Identity string
	// LeaseDuration, RenewDeadline and RetryPeriod: zero takes the
	// Default ones.
	LeaseDuration, RenewDeadline, RetryPeriod time.Duration
	// Logger nil logs nothing.
	Logger *slog.Logger
}

// Elector runs a function on the one replica that holds the Lease (Run).
type Elector struct {
	cfg Config
	log *slog.Logger
}

// NewIdentity is a replica's identity: its pod's name, which tells an
// operator reading the Lease which pod leads, and random hex, so that a
// restarted container with the same pod name does not take its earlier
// self's Lease for its own while that one may still be running.
func NewIdentity(podName string) (string, error) {
	b := make([]byte, 8)
	if _, err := rand.Read(b); err != nil {
		return "", err
	}
	return podName + "_" + hex.EncodeToString(b), nil
}

// New checks cfg and returns its Elector.
func New(cfg Config) (*Elector, error) {
	switch {
	case cfg.Client == nil:
		return nil, errors.New("leader election needs a Kubernetes client")
	case cfg.Namespace == "":
		return nil, errors.New("leader election needs the server's namespace: set --namespace or POD_NAMESPACE")
	case cfg.Identity == "":
		return nil, errors.New("leader election needs an identity for this replica (leader.NewIdentity)")
	}
	cfg.Name = cmp.Or(cfg.Name, LeaseName)
	cfg.LeaseDuration = cmp.Or(cfg.LeaseDuration, DefaultLeaseDuration)
	cfg.RenewDeadline = cmp.Or(cfg.RenewDeadline, DefaultRenewDeadline)
	cfg.RetryPeriod = cmp.Or(cfg.RetryPeriod, DefaultRetryPeriod)
	e := &Elector{cfg: cfg, log: cmp.Or(cfg.Logger, slog.New(slog.DiscardHandler))}
	// client-go checks the timing; check it now rather than at Run.
	if _, err := leaderelection.NewLeaderElector(e.electionConfig(e.lock(nil), func(context.Context) {}, nil)); err != nil {
		return nil, err
	}
	return e, nil
}

// Run runs lead while this replica holds the Lease, and campaigns again
// each time it loses it, until ctx ends. lead's context ends when the
// Lease is lost or ctx ends; Run returns once lead has returned and,
// if this replica held the Lease, client-go has tried to release it.
func (e *Elector) Run(ctx context.Context, lead func(context.Context)) {
	for ctx.Err() == nil {
		e.term(ctx, lead)
	}
}

// term is one campaign: it returns when ctx ends, or when this replica
// led and lost the Lease, in both cases after lead has returned.
func (e *Elector) term(ctx context.Context, lead func(context.Context)) {
	// The election outlives ctx until lead has returned: client-go
	// releases the Lease (ReleaseOnCancel) as soon as its context ends,
	// and another replica must not lead while this one's lead runs.
	electCtx, stopElection := context.WithCancel(context.WithoutCancel(ctx))
	defer stopElection()
	leadCtx, cancelLead := context.WithCancel(ctx)
	defer cancelLead()
	c := &campaign{e: e, lead: lead, leadCtx: leadCtx, cancelLead: cancelLead, stopElection: stopElection, led: make(chan struct{})}

	// At shutdown lead stops first, then the election: releasing the
	// Lease hands the controller to another replica at once.
	defer context.AfterFunc(ctx, c.stepDown)()

	le, err := leaderelection.NewLeaderElector(e.electionConfig(e.lock(c.renewed), c.startedLeading, c.newLeader))
	if err != nil {
		panic(err) // New checked this configuration
	}
	le.Run(electCtx)
	// The Lease is lost, or ctx ended: lead must be over before the
	// next campaign, which may start it again.
	c.stepDown()
	if ctx.Err() == nil {
		e.log.Warn("stopped leading; campaigning again", "lease", e.lease())
	}
}

// campaign is the state of one term: whether lead has started, may
// still start, and when the term ends if renewals stop.
type campaign struct {
	e            *Elector
	lead         func(context.Context)
	leadCtx      context.Context
	cancelLead   context.CancelFunc
	stopElection context.CancelFunc
	led          chan struct{} // closed when lead has returned

	mu       sync.Mutex
	deadline *time.Timer // while leading: ends the term when renewals stop
	closed   bool        // lead may no longer start
	started  bool
}

// stepDown ends lead and, once it has returned, the election.
func (c *campaign) stepDown() {
	c.mu.Lock()
	c.closed = true
	wasStarted := c.started
	c.mu.Unlock()
	if wasStarted {
		c.cancelLead()
		<-c.led
	}
	c.stopElection()
}

// renewed pushes the deadline back: the lock calls it on every
// successful write of the Lease naming this replica.
func (c *campaign) renewed() {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.deadline != nil {
		c.deadline.Reset(c.e.cfg.RenewDeadline)
	}
}

// startedLeading runs lead, unless the term is already over; client-go
// calls it when this replica has won the Lease.
func (c *campaign) startedLeading(electionCtx context.Context) {
	e := c.e
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return
	}
	c.started = true
	// Renewals stopped for RenewDeadline: step down now. client-go
	// would too, but only after trying to release the Lease, which
	// with the API server out of reach takes another RenewDeadline,
	// by when another replica may lead.
	c.deadline = time.AfterFunc(e.cfg.RenewDeadline, func() {
		e.log.Warn("stepping down: the controller's Lease could not be renewed", "lease", e.lease(), "for", e.cfg.RenewDeadline)
		go c.stepDown()
	})
	c.mu.Unlock()
	defer close(c.led)
	defer context.AfterFunc(electionCtx, c.cancelLead)()
	e.log.Info("leading: this replica runs the controller", "lease", e.lease(), "identity", e.cfg.Identity)
	c.lead(c.leadCtx)
	c.mu.Lock()
	c.deadline.Stop()
	c.deadline = nil
	c.mu.Unlock()
}

// newLeader logs another replica's win.
func (c *campaign) newLeader(id string) {
	if id != c.e.cfg.Identity {
		c.e.log.Info("another replica runs the controller", "lease", c.e.lease(), "leader", id)
	}
}

func (e *Elector) lease() string { return e.cfg.Namespace + "/" + e.cfg.Name }

// lock is the Lease, with renewed called after each successful write
// that names this replica (nil: none).
func (e *Elector) lock(renewed func()) resourcelock.Interface {
	l := &resourcelock.LeaseLock{
		LeaseMeta:  metav1.ObjectMeta{Namespace: e.cfg.Namespace, Name: e.cfg.Name},
		Client:     e.cfg.Client.CoordinationV1(),
		LockConfig: resourcelock.ResourceLockConfig{Identity: e.cfg.Identity},
		Labels:     map[string]string{"app.kubernetes.io/name": "etcdbackup-server"},
	}
	if renewed == nil {
		return l
	}
	return &watchedLock{Interface: l, renewed: renewed}
}

func (e *Elector) electionConfig(lock resourcelock.Interface, started func(context.Context), newLeader func(string)) leaderelection.LeaderElectionConfig {
	return leaderelection.LeaderElectionConfig{
		Lock:            lock,
		Name:            e.cfg.Name,
		LeaseDuration:   e.cfg.LeaseDuration,
		RenewDeadline:   e.cfg.RenewDeadline,
		RetryPeriod:     e.cfg.RetryPeriod,
		ReleaseOnCancel: true,
		Callbacks: leaderelection.LeaderCallbacks{
			OnStartedLeading: started,
			OnStoppedLeading: func() {},
			OnNewLeader:      newLeader,
		},
	}
}

// watchedLock tells of the writes that keep this replica the leader:
// acquiring the Lease (Create, or Update of an expired one) and renewing
// it (Update). Releasing it writes an empty holder, which does not count.
type watchedLock struct {
	resourcelock.Interface
	renewed func()
}

var _ resourcelock.Interface = &watchedLock{}

func (l *watchedLock) Create(ctx context.Context, r resourcelock.LeaderElectionRecord) error {
	err := l.Interface.Create(ctx, r)
	if err == nil && r.HolderIdentity == l.Identity() {
		l.renewed()
	}
	return err
}

func (l *watchedLock) Update(ctx context.Context, r resourcelock.LeaderElectionRecord) error {
	err := l.Interface.Update(ctx, r)
	if err == nil && r.HolderIdentity == l.Identity() {
		l.renewed()
	}
	return err
}
