package delta

import (
	"context"
	"encoding/json"
	"fmt"
	"sync"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	coordinationv1 "k8s.io/api/coordination/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/leaderelection/resourcelock"

	ebv1 "github.com/kubectl-etcdbackup/kubectl-etcdbackup/api/etcdbackup/v1"
)

// ServerLock is client-go's leader election lock on a target's delta
// Lease, held through the data server (AgentService) rather than the API
// server: the agent needs no Kubernetes access, and the server writes
// only this agent's own target's Lease. Lease names the Lease in
// messages; the server knows which one it is from the caller.
type ServerLock struct {
	Client   ebv1.AgentServiceClient
	Lease    string
	identity string

	mu sync.Mutex
	// version is the Lease's resourceVersion as last read or written:
	// an update from an older view is refused (ABORTED), as the API
	// server refuses a LeaseLock's.
	version string
}

var _ resourcelock.Interface = (*ServerLock)(nil)

// NewServerLock returns the lock of the Lease named lease (for messages)
// for the elector identity.
func NewServerLock(c ebv1.AgentServiceClient, lease, identity string) *ServerLock {
	return &ServerLock{Client: c, Lease: lease, identity: identity}
}

// leaseResource is what a missing Lease is reported as: the elector
// creates the Lease only on a NotFound error of the API's kind.
var leaseResource = coordinationv1.Resource("leases")

// Get implements resourcelock.Interface.
func (l *ServerLock) Get(ctx context.Context) (*resourcelock.LeaderElectionRecord, []byte, error) {
	r, err := l.Client.GetDeltaLease(ctx, &ebv1.GetDeltaLeaseRequest{})
	if status.Code(err) == codes.NotFound {
		return nil, nil, apierrors.NewNotFound(leaseResource, l.Lease)
	}
	if err != nil {
		return nil, nil, fmt.Errorf("read delta Lease %s through the server: %w", l.Lease, err)
	}
	return l.record(r.GetLease())
}

// Create implements resourcelock.Interface.
func (l *ServerLock) Create(ctx context.Context, ler resourcelock.LeaderElectionRecord) error {
	return l.put(ctx, ler, "")
}

// Update implements resourcelock.Interface.
func (l *ServerLock) Update(ctx context.Context, ler resourcelock.LeaderElectionRecord) error {
	l.mu.Lock()
	v := l.version
	l.mu.Unlock()
	if v == "" {
		return fmt.Errorf("delta Lease %s: update before it was read", l.Lease)
	}
	return l.put(ctx, ler, v)
}

func (l *ServerLock) put(ctx context.Context, ler resourcelock.LeaderElectionRecord, version string) error {
	r, err := l.Client.PutDeltaLease(ctx, &ebv1.PutDeltaLeaseRequest{Lease: &ebv1.DeltaLease{
		HolderIdentity: ler.HolderIdentity, LeaseDurationSeconds: int32(ler.LeaseDurationSeconds),
		LeaseTransitions: int32(ler.LeaderTransitions), ResourceVersion: version,
	}})
	if err != nil {
		return fmt.Errorf("write delta Lease %s through the server: %w", l.Lease, err)
	}
	_, _, err = l.record(r.GetLease())
	return err
}

// record converts what the server answered and remembers its version.
func (l *ServerLock) record(p *ebv1.DeltaLease) (*resourcelock.LeaderElectionRecord, []byte, error) {
	if p == nil {
		return nil, nil, fmt.Errorf("delta Lease %s: the server answered without it", l.Lease)
	}
	l.mu.Lock()
	l.version = p.GetResourceVersion()
	l.mu.Unlock()
	r := &resourcelock.LeaderElectionRecord{
		HolderIdentity: p.GetHolderIdentity(), LeaseDurationSeconds: int(p.GetLeaseDurationSeconds()),
		LeaderTransitions: int(p.GetLeaseTransitions()),
	}
	if t := p.GetAcquireTime(); t != nil {
		r.AcquireTime = metav1.NewTime(t.AsTime())
	}
	if t := p.GetRenewTime(); t != nil {
		r.RenewTime = metav1.NewTime(t.AsTime())
	}
	raw, err := json.Marshal(r)
	if err != nil {
		return nil, nil, err
	}
	return r, raw, nil
}

// RecordEvent implements resourcelock.Interface: the agent's log says
// what the elector does; it may not write Events.
func (l *ServerLock) RecordEvent(string) {}

// Identity implements resourcelock.Interface.
func (l *ServerLock) Identity() string { return l.identity }

// Describe implements resourcelock.Interface.
func (l *ServerLock) Describe() string { return l.Lease }
