package rpc

import (
	"context"
	"errors"
	"sync"

	"golang.org/x/time/rate"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/api/agentjob"
	ebv1 "github.com/kubectl-etcdbackup/kubectl-etcdbackup/api/etcdbackup/v1"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/server/auth"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/server/jobs"
)

// DeltaLeases reads and writes a target's delta Lease for its delta agent
// (jobs.Launcher): agents hold their Lease through the server, the only
// one with access to Leases.
type DeltaLeases interface {
	GetDeltaLease(ctx context.Context, target string) (jobs.DeltaLease, error)
	PutDeltaLease(ctx context.Context, target, pod string, want jobs.DeltaLease) (jobs.DeltaLease, error)
}

// Each delta agent pod's Lease calls are bounded: client-go's elector
// makes one every retry period (2 s), so a pod calling more often is not
// an honest elector, and its calls must not take the server's API budget
// (issue 37 #2: a caller's cost falls on that caller).
const (
	leaseCallsPerSecond = 2
	leaseCallBurst      = 6
	// leaseLimitPods bounds the limiters kept: past it they start anew.
	leaseLimitPods = 1024
)

// leaseLimits are the delta agent pods' limiters.
type leaseLimits struct {
	mu    sync.Mutex
	byPod map[string]*rate.Limiter
}

func (l *leaseLimits) allow(pod string) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.byPod == nil || len(l.byPod) >= leaseLimitPods {
		l.byPod = map[string]*rate.Limiter{}
	}
	lim, ok := l.byPod[pod]
	if !ok {
		lim = rate.NewLimiter(leaseCallsPerSecond, leaseCallBurst)
		l.byPod[pod] = lim
	}
	return lim.Allow()
}

// deltaAgent is the delta agent calling, or the error that refuses
// anyone else: users (the user port) and agents of other kinds, and a
// delta agent over its rate.
func (s *Service) deltaAgent(ctx context.Context, method string) (*auth.Agent, error) {
	a, ok := auth.AgentFrom(ctx)
	switch {
	case !ok:
		return nil, status.Errorf(codes.PermissionDenied, "%s is served to delta agents on the agent port only", method)
	case a.Kind != agentjob.Delta:
		return nil, status.Errorf(codes.PermissionDenied, "%s is a %s agent; only delta agents hold a delta Lease", a, a.Kind)
	case s.deltaLeases == nil:
		return nil, status.Error(codes.FailedPrecondition, "this server runs no delta agents, so it holds no delta Lease")
	case !s.leaseLimits.allow(a.Pod):
		return nil, status.Errorf(codes.ResourceExhausted, "%s calls its delta Lease more than %d times a second; leader election calls once every retry period (2 s)", a, leaseCallsPerSecond)
	}
	return a, nil
}

// GetDeltaLease implements ebv1.AgentServiceServer: the calling delta
// agent's own target's Lease, and no other.
func (s *Service) GetDeltaLease(ctx context.Context, _ *ebv1.GetDeltaLeaseRequest) (*ebv1.GetDeltaLeaseResponse, error) {
	a, err := s.deltaAgent(ctx, "GetDeltaLease")
	if err != nil {
		return nil, err
	}
	l, err := s.deltaLeases.GetDeltaLease(ctx, a.Target)
	if err != nil {
		return nil, s.deltaLeaseError(a, err)
	}
	return &ebv1.GetDeltaLeaseResponse{Lease: deltaLeaseProto(l)}, nil
}

// PutDeltaLease implements ebv1.AgentServiceServer.
func (s *Service) PutDeltaLease(ctx context.Context, req *ebv1.PutDeltaLeaseRequest) (*ebv1.PutDeltaLeaseResponse, error) {
	a, err := s.deltaAgent(ctx, "PutDeltaLease")
	if err != nil {
		return nil, err
	}
	w := req.GetLease()
	if w == nil {
		return nil, status.Error(codes.InvalidArgument, "PutDeltaLease needs the lease to write")
	}
	l, err := s.deltaLeases.PutDeltaLease(ctx, a.Target, a.Pod, jobs.DeltaLease{
		Holder: w.GetHolderIdentity(), DurationSeconds: w.GetLeaseDurationSeconds(), Transitions: w.GetLeaseTransitions(), ResourceVersion: w.GetResourceVersion(),
	})
	if err != nil {
		return nil, s.deltaLeaseError(a, err)
	}
	return &ebv1.PutDeltaLeaseResponse{Lease: deltaLeaseProto(l)}, nil
}

func (s *Service) deltaLeaseError(a *auth.Agent, err error) error {
	switch {
	case errors.Is(err, jobs.ErrNoDeltaLease):
		return status.Errorf(codes.NotFound, "%v", err)
	case errors.Is(err, jobs.ErrDeltaLeaseChanged):
		return status.Errorf(codes.Aborted, "%v; read it again", err)
	case errors.Is(err, jobs.ErrDeltaLeaseRefused):
		s.log.Warn("delta Lease write refused", "caller", a.String(), "target", a.Target, "error", err)
		return status.Errorf(codes.FailedPrecondition, "%v", err)
	case errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
		return status.FromContextError(err).Err()
	}
	s.log.Error("delta Lease", "caller", a.String(), "target", a.Target, "error", err)
	return status.Errorf(codes.Unavailable, "the server could not reach the API server for the delta Lease: %v", err)
}

func deltaLeaseProto(l jobs.DeltaLease) *ebv1.DeltaLease {
	p := &ebv1.DeltaLease{HolderIdentity: l.Holder, LeaseDurationSeconds: l.DurationSeconds, LeaseTransitions: l.Transitions, ResourceVersion: l.ResourceVersion}
	if !l.AcquireTime.IsZero() {
		p.AcquireTime = timestamppb.New(l.AcquireTime)
	}
	if !l.RenewTime.IsZero() {
		p.RenewTime = timestamppb.New(l.RenewTime)
	}
	return p
}
