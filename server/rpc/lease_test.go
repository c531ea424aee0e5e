package rpc_test

import (
	"context"
	"strings"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/api/agentjob"
	ebv1 "github.com/kubectl-etcdbackup/kubectl-etcdbackup/api/etcdbackup/v1"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/server/auth"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/server/config"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/server/jobs"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/server/servertest"
)

// Only a delta agent holds a delta Lease, and only its own target's: the
// server picks the Lease from the caller, so no request can name another
// (issue 37 #6). Users and other agents are refused.
func TestDeltaLeaseOnlyForItsDeltaAgent(t *testing.T) {
	ctx := t.Context()
	cs := fake.NewClientset()
	launcher, err := jobs.New(cs, "etcdbackup", config.Agents{Image: "agent:test"})
	if err != nil {
		t.Fatal(err)
	}
	start := func(a auth.Agent) *servertest.Server {
		return servertest.StartWith(t, servertest.Options{Agents: launcher, AgentGuard: servertest.AsAgent(a)})
	}
	delta := start(auth.Agent{Kind: agentjob.Delta, Target: "app", Pod: "delta-app-x", JobNamespace: "etcdbackup", JobName: "delta-app"})
	put, err := delta.AgentClient.Agents.PutDeltaLease(ctx, &ebv1.PutDeltaLeaseRequest{Lease: &ebv1.DeltaLease{HolderIdentity: "delta-app-x_1", LeaseDurationSeconds: 15}})
	if err != nil {
		t.Fatal(err)
	}
	if put.GetLease().GetHolderIdentity() != "delta-app-x_1" || put.GetLease().GetRenewTime() == nil {
		t.Fatalf("PutDeltaLease: %v", put)
	}
	leases, err := cs.CoordinationV1().Leases("etcdbackup").List(ctx, metav1.ListOptions{})
	if err != nil || len(leases.Items) != 1 || leases.Items[0].Name != jobs.DeltaLeaseName("app") {
		t.Fatalf("Leases after the app agent's PutDeltaLease: %v, %v", leases, err)
	}
	got, err := delta.AgentClient.Agents.GetDeltaLease(ctx, &ebv1.GetDeltaLeaseRequest{})
	if err != nil || got.GetLease().GetHolderIdentity() != "delta-app-x_1" {
		t.Fatalf("GetDeltaLease: %v, %v", got, err)
	}
	// Another pod's holder, even of the same target, is refused.
	_, err = delta.AgentClient.Agents.PutDeltaLease(ctx, &ebv1.PutDeltaLeaseRequest{Lease: &ebv1.DeltaLease{
		HolderIdentity: "etcdbackup-server-0_1", LeaseDurationSeconds: 15, LeaseTransitions: 1, ResourceVersion: got.GetLease().GetResourceVersion()}})
	if status.Code(err) != codes.FailedPrecondition {
		t.Fatalf("PutDeltaLease naming another pod: %v", err)
	}
	// Another target's delta agent reads its own (missing) Lease, not app's.
	other := start(auth.Agent{Kind: agentjob.Delta, Target: "other", Pod: "delta-other-y"})
	if _, err := other.AgentClient.Agents.GetDeltaLease(ctx, &ebv1.GetDeltaLeaseRequest{}); status.Code(err) != codes.NotFound {
		t.Fatalf("GetDeltaLease of target other: %v, want NotFound", err)
	}
	for _, a := range []auth.Agent{{Kind: agentjob.Backup, Target: "app", Pod: "backup-app-z"}, {Kind: agentjob.Fold, Target: "app", Pod: "fold-app-z"}} {
		s := start(a)
		if _, err := s.AgentClient.Agents.GetDeltaLease(ctx, &ebv1.GetDeltaLeaseRequest{}); status.Code(err) != codes.PermissionDenied {
			t.Errorf("a %s agent's GetDeltaLease: %v", a.Kind, err)
		}
		if _, err := s.AgentClient.Agents.PutDeltaLease(ctx, &ebv1.PutDeltaLeaseRequest{Lease: &ebv1.DeltaLease{HolderIdentity: "backup-app-z_1", LeaseDurationSeconds: 15}}); status.Code(err) != codes.PermissionDenied {
			t.Errorf("a %s agent's PutDeltaLease: %v", a.Kind, err)
		}
	}
	// The user port: never.
	if _, err := delta.Client.Agents.GetDeltaLease(ctx, &ebv1.GetDeltaLeaseRequest{}); status.Code(err) != codes.PermissionDenied {
		t.Errorf("GetDeltaLease on the user port: %v", err)
	}
}

// podGuard admits each call as the delta agent of the pod its "pod"
// header names: several agents on one server.
type podGuard struct{}

func (podGuard) Admit(ctx context.Context, _ string) (context.Context, error) {
	md, _ := metadata.FromIncomingContext(ctx)
	pod := md.Get("pod")[0]
	return auth.WithAgent(ctx, &auth.Agent{Kind: agentjob.Delta, Target: strings.TrimPrefix(pod, "delta-"), Pod: pod}), nil
}

// A delta agent pod calling its Lease faster than any elector does is
// refused past a burst (ResourceExhausted), at no cost to the API server
// or to other pods (issue 37 #2).
func TestDeltaLeaseCallsAreBoundedPerPod(t *testing.T) {
	cs := fake.NewClientset()
	launcher, err := jobs.New(cs, "etcdbackup", config.Agents{Image: "agent:test"})
	if err != nil {
		t.Fatal(err)
	}
	srv := servertest.StartWith(t, servertest.Options{Agents: launcher, AgentGuard: podGuard{}})
	as := func(pod string) context.Context { return metadata.AppendToOutgoingContext(t.Context(), "pod", pod) }
	refused := 0
	for range 20 {
		if _, err := srv.AgentClient.Agents.GetDeltaLease(as("delta-app"), &ebv1.GetDeltaLeaseRequest{}); status.Code(err) == codes.ResourceExhausted {
			refused++
		}
	}
	if refused < 10 {
		t.Fatalf("%d of 20 calls at once refused; want all past the burst", refused)
	}
	reads := 0
	for _, a := range cs.Actions() {
		if a.GetVerb() == "get" {
			reads++
		}
	}
	if reads > 20-refused {
		t.Fatalf("%d Lease reads for %d admitted calls", reads, 20-refused)
	}
	if _, err := srv.AgentClient.Agents.GetDeltaLease(as("delta-other"), &ebv1.GetDeltaLeaseRequest{}); status.Code(err) != codes.NotFound {
		t.Fatalf("another pod's call during the flood: %v, want NotFound (its Lease does not exist)", err)
	}
}
