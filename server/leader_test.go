package server_test

import (
	"context"
	"net"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/server"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/server/config"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/server/jobs"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/server/leader"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/storage/filesystem"
)

// replica is a server serving with an election, and its metrics.
type replica struct {
	reg  *prometheus.Registry
	stop context.CancelFunc
	done chan error
}

func startReplica(t *testing.T, cs *fake.Clientset, id string) *replica {
	t.Helper()
	l, err := jobs.New(cs, "etcdbackup-system", config.Agents{Image: "agent:dev"})
	if err != nil {
		t.Fatal(err)
	}
	if err := l.Start(t.Context(), nil); err != nil {
		t.Fatal(err)
	}
	e, err := leader.New(leader.Config{Client: cs, Namespace: "etcdbackup-system", Identity: id,
		LeaseDuration: 5 * time.Second, RenewDeadline: time.Second, RetryPeriod: 200 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	loc, err := filesystem.New(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	r := &replica{reg: prometheus.NewRegistry(), done: make(chan error, 1)}
	srv, err := server.New(server.Config{Locations: []server.NamedLocation{{Name: "default", Location: loc}},
		Agents: l, Leader: e, Registerer: r.reg})
	if err != nil {
		t.Fatal(err)
	}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(t.Context())
	r.stop = cancel
	go func() { r.done <- srv.Serve(ctx, server.Listeners{Users: lis}, time.Second) }()
	t.Cleanup(func() { cancel(); <-r.done })
	return r
}

// leads reads etcdbackup_controller_leader.
func (r *replica) leads(t *testing.T) bool {
	t.Helper()
	mfs, err := r.reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == "etcdbackup_controller_leader" {
			return mf.GetMetric()[0].GetGauge().GetValue() == 1
		}
	}
	t.Fatal("no etcdbackup_controller_leader")
	return false
}

// TestOneReplicaRunsTheController: of two servers on one cluster one
// runs the controller; when it shuts down, the other takes over at once
// (the Lease is released, not left to expire).
func TestOneReplicaRunsTheController(t *testing.T) {
	cs := fake.NewClientset()
	a, b := startReplica(t, cs, "a"), startReplica(t, cs, "b")
	var first, second *replica
	err := wait.PollUntilContextTimeout(t.Context(), 20*time.Millisecond, 10*time.Second, true, func(context.Context) (bool, error) {
		switch la, lb := a.leads(t), b.leads(t); {
		case la && lb:
			t.Fatal("both replicas run the controller")
		case la:
			first, second = a, b
		case lb:
			first, second = b, a
		}
		return first != nil, nil
	})
	if err != nil {
		t.Fatal("no replica runs the controller")
	}
	stopped := time.Now()
	first.stop()
	if err := <-first.done; err != nil {
		t.Fatalf("Serve: %v", err)
	}
	first.done <- nil // for the cleanup
	if first.leads(t) {
		t.Error("a stopped replica still reports leading")
	}
	ctx, cancel := context.WithDeadline(t.Context(), stopped.Add(4*time.Second)) // the Lease lasts 5 s
	defer cancel()
	err = wait.PollUntilContextCancel(ctx, 20*time.Millisecond, true, func(context.Context) (bool, error) {
		return second.leads(t), nil
	})
	if err != nil {
		t.Fatal("the other replica did not take over within the Lease's duration: the Lease was not released")
	}
}
