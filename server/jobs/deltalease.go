package jobs

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/ptr"
)

// A delta agent holds its target's delta Lease through the server
// (AgentService's GetDeltaLease and PutDeltaLease), not through the API
// server: the agents' ServiceAccount has no Kubernetes permission at
// all, so a compromised agent can neither take the controller's Lease
// nor fence another target's chain. The server writes only the caller's
// own target's Lease and refuses what client-go's elector never writes,
// so that even its own Lease changes hands only as leader election says.

// DeltaLease is a target's delta Lease as its agent reads and writes it.
type DeltaLease struct {
	// Holder is POD_RANDOM of the agent that holds it; "" once released.
	Holder          string
	DurationSeconds int32
	// AcquireTime and RenewTime are the server's clock's: what an agent
	// sends is ignored.
	AcquireTime, RenewTime time.Time
	// Transitions is the fencing epoch (WriterEpoch).
	Transitions     int32
	ResourceVersion string
}

var (
	// ErrNoDeltaLease: the target's delta Lease does not exist yet.
	ErrNoDeltaLease = errors.New("the delta Lease does not exist")
	// ErrDeltaLeaseChanged: the Lease changed since the agent read it
	// (or was created meanwhile); it reads it again.
	ErrDeltaLeaseChanged = errors.New("the delta Lease changed since it was read")
	// ErrDeltaLeaseRefused: a write no honest elector makes.
	ErrDeltaLeaseRefused = errors.New("delta Lease write refused")
)

// maxDeltaLeaseSeconds bounds a delta Lease's duration: a longer one
// would keep a dead agent's chain without a writer for that long.
const maxDeltaLeaseSeconds = 300

// deltaLeases is what the Launcher keeps for the delta Leases: the client
// they are read and written with (a rate limiter of their own, so that
// renewals neither wait on Job creation nor hold it up), and the Lease
// this server last wrote per target, so that a renewal from that version
// costs one update, not a read first.
type deltaLeases struct {
	client kubernetes.Interface
	mu     sync.Mutex
	last   map[string]*coordinationv1.Lease
}

// SetDeltaLeaseClient makes the Launcher read and write delta Leases
// (PutDeltaLease, GetDeltaLease, CheckDeltaWriter) with c instead of its
// main client.
func (l *Launcher) SetDeltaLeaseClient(c kubernetes.Interface) {
	l.leases.mu.Lock()
	defer l.leases.mu.Unlock()
	l.leases.client = c
}

func (l *Launcher) leaseClient() kubernetes.Interface {
	l.leases.mu.Lock()
	defer l.leases.mu.Unlock()
	if l.leases.client != nil {
		return l.leases.client
	}
	return l.client
}

// lastWritten is the Lease of target this server last wrote, if it is at
// version rv.
func (l *Launcher) lastWritten(target, rv string) *coordinationv1.Lease {
	l.leases.mu.Lock()
	defer l.leases.mu.Unlock()
	if w := l.leases.last[target]; w != nil && w.ResourceVersion == rv {
		return w.DeepCopy()
	}
	return nil
}

func (l *Launcher) wrote(target string, lease *coordinationv1.Lease) {
	l.leases.mu.Lock()
	defer l.leases.mu.Unlock()
	if l.leases.last == nil {
		l.leases.last = map[string]*coordinationv1.Lease{}
	}
	l.leases.last[target] = lease.DeepCopy()
}

// GetDeltaLease reads target's delta Lease from the API server.
func (l *Launcher) GetDeltaLease(ctx context.Context, target string) (DeltaLease, error) {
	name := DeltaLeaseName(target)
	lease, err := l.leaseClient().CoordinationV1().Leases(l.namespace).Get(ctx, name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return DeltaLease{}, fmt.Errorf("%w: Lease %s/%s", ErrNoDeltaLease, l.namespace, name)
	}
	if err != nil {
		return DeltaLease{}, fmt.Errorf("read Lease %s/%s: %w", l.namespace, name, err)
	}
	return deltaLeaseOf(lease), nil
}

// PutDeltaLease writes target's delta Lease for the agent in pod: it
// creates it when want has no ResourceVersion, else updates the Lease
// read at that version. It refuses (ErrDeltaLeaseRefused) a holder that
// is not pod's, a duration out of [1s, maxDeltaLeaseSeconds], taking a
// Lease whose holder renewed it within its duration, releasing one pod
// does not hold, and transitions other than client-go's elector writes:
// unchanged while the holder is, one more when it changes.
func (l *Launcher) PutDeltaLease(ctx context.Context, target, pod string, want DeltaLease) (DeltaLease, error) {
	name := DeltaLeaseName(target)
	refuse := func(format string, a ...any) (DeltaLease, error) {
		return DeltaLease{}, fmt.Errorf("%w: Lease %s/%s: %s", ErrDeltaLeaseRefused, l.namespace, name, fmt.Sprintf(format, a...))
	}
	switch {
	case pod == "":
		return refuse("the calling agent's pod is unknown")
	case want.Holder != "" && !heldBy(want.Holder, pod):
		return refuse("holder %q is not of the calling pod %s (POD_RANDOM)", want.Holder, pod)
	case want.DurationSeconds < 1 || want.DurationSeconds > maxDeltaLeaseSeconds:
		return refuse("a duration of %ds is outside 1..%ds", want.DurationSeconds, maxDeltaLeaseSeconds)
	}
	leases := l.leaseClient().CoordinationV1().Leases(l.namespace)
	now := metav1.NowMicro()
	if want.ResourceVersion == "" {
		if want.Holder == "" || want.Transitions != 0 {
			return refuse("a new Lease starts held, with 0 transitions (not held by %q with %d)", want.Holder, want.Transitions)
		}
		lease := &coordinationv1.Lease{
			ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: l.namespace, Labels: map[string]string{LabelManagedBy: managedBy, LabelComponent: ComponentDelta}},
			Spec: coordinationv1.LeaseSpec{HolderIdentity: ptr.To(want.Holder), LeaseDurationSeconds: ptr.To(want.DurationSeconds),
				AcquireTime: &now, RenewTime: &now, LeaseTransitions: ptr.To[int32](0)},
		}
		created, err := leases.Create(ctx, lease, metav1.CreateOptions{})
		if apierrors.IsAlreadyExists(err) {
			return DeltaLease{}, fmt.Errorf("%w: Lease %s/%s was created meanwhile", ErrDeltaLeaseChanged, l.namespace, name)
		}
		if err != nil {
			return DeltaLease{}, fmt.Errorf("create Lease %s/%s: %w", l.namespace, name, err)
		}
		l.wrote(target, created)
		return deltaLeaseOf(created), nil
	}
	// A renewal of what this server wrote last needs no read: at the same
	// version the Lease is what it wrote, and the update is refused
	// (Conflict) if it changed since.
	cur := l.lastWritten(target, want.ResourceVersion)
	if cur == nil {
		var err error
		cur, err = leases.Get(ctx, name, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return DeltaLease{}, fmt.Errorf("%w: Lease %s/%s was deleted since it was read", ErrDeltaLeaseChanged, l.namespace, name)
		}
		if err != nil {
			return DeltaLease{}, fmt.Errorf("read Lease %s/%s: %w", l.namespace, name, err)
		}
	}
	if cur.ResourceVersion != want.ResourceVersion {
		return DeltaLease{}, fmt.Errorf("%w: Lease %s/%s is at version %s, not %s", ErrDeltaLeaseChanged, l.namespace, name, cur.ResourceVersion, want.ResourceVersion)
	}
	s := cur.Spec
	holder, transitions := ptr.Deref(s.HolderIdentity, ""), ptr.Deref(s.LeaseTransitions, 0)
	acquired := s.AcquireTime
	switch {
	case want.Holder == "":
		if !heldBy(holder, pod) {
			return refuse("only its holder releases it, and %q holds it, not pod %s", holder, pod)
		}
		if want.Transitions != transitions {
			return refuse("a release keeps the transitions (%d), not %d", transitions, want.Transitions)
		}
	case want.Holder == holder:
		if want.Transitions != transitions {
			return refuse("a renewal keeps the transitions (%d), not %d", transitions, want.Transitions)
		}
	default:
		if until, valid := leaseValidUntil(s); holder != "" && valid && now.Time.Before(until) {
			return refuse("%q holds it until %s unless it renews; %q may take it only after", holder, until.UTC().Format(time.RFC3339), want.Holder)
		}
		if want.Transitions != transitions+1 {
			return refuse("taking it from %q raises the transitions to %d, not %d", holder, transitions+1, want.Transitions)
		}
		acquired = &now
	}
	next := cur.DeepCopy()
	next.Spec = coordinationv1.LeaseSpec{HolderIdentity: ptr.To(want.Holder), LeaseDurationSeconds: ptr.To(want.DurationSeconds),
		AcquireTime: acquired, RenewTime: &now, LeaseTransitions: ptr.To(want.Transitions)}
	updated, err := leases.Update(ctx, next, metav1.UpdateOptions{})
	if apierrors.IsConflict(err) || apierrors.IsNotFound(err) {
		return DeltaLease{}, fmt.Errorf("%w: %w", ErrDeltaLeaseChanged, err)
	}
	if err != nil {
		return DeltaLease{}, fmt.Errorf("update Lease %s/%s: %w", l.namespace, name, err)
	}
	l.wrote(target, updated)
	return deltaLeaseOf(updated), nil
}

// heldBy says whether a Lease holder identity is of pod: the agent's
// identity is POD_RANDOM (a restarted container is a new holder).
func heldBy(holder, pod string) bool {
	return strings.HasPrefix(holder, pod+"_") && len(holder) > len(pod)+1
}

// leaseValidUntil is when a Lease expires unless it is renewed.
func leaseValidUntil(s coordinationv1.LeaseSpec) (time.Time, bool) {
	if s.RenewTime == nil || s.LeaseDurationSeconds == nil {
		return time.Time{}, false
	}
	return s.RenewTime.Add(time.Duration(*s.LeaseDurationSeconds) * time.Second), true
}

func deltaLeaseOf(l *coordinationv1.Lease) DeltaLease {
	s := l.Spec
	d := DeltaLease{Holder: ptr.Deref(s.HolderIdentity, ""), DurationSeconds: ptr.Deref(s.LeaseDurationSeconds, 0),
		Transitions: ptr.Deref(s.LeaseTransitions, 0), ResourceVersion: l.ResourceVersion}
	if s.AcquireTime != nil {
		d.AcquireTime = s.AcquireTime.Time
	}
	if s.RenewTime != nil {
		d.RenewTime = s.RenewTime.Time
	}
	return d
}
