package plugin

import (
	"context"
	"fmt"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	agentdelta "github.com/kubectl-etcdbackup/kubectl-etcdbackup/agents/delta"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/server/config"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/server/servertest"
)

// alternatingStore stores each segment through the next of its stores in
// turn, as an agent does whose uploads a Service spreads over replicas,
// and keeps the first error a store returned.
type alternatingStore struct {
	stores []agentdelta.Store
	mu     sync.Mutex
	n      int
	err    error
}

func (a *alternatingStore) State(ctx context.Context) (agentdelta.ChainState, error) {
	a.mu.Lock()
	s := a.stores[a.n%len(a.stores)]
	a.mu.Unlock()
	return s.State(ctx)
}

func (a *alternatingStore) Put(ctx context.Context, seg agentdelta.Segment) error {
	a.mu.Lock()
	s := a.stores[a.n%len(a.stores)]
	a.n++
	a.mu.Unlock()
	err := s.Put(ctx, seg)
	if err != nil {
		a.mu.Lock()
		if a.err == nil {
			a.err = fmt.Errorf("segment %s: %w", seg.Name, err)
		}
		a.mu.Unlock()
	}
	return err
}

func (a *alternatingStore) firstErr() (int, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.n, a.err
}

// Two data-server replicas on one location take the segments of one
// chain in turn: neither refuses a segment because what it remembers of
// the chain's end is stale, and the chain restores exactly.
func TestReplicasTakeOneChainInTurn(t *testing.T) {
	w := newCaptureWorld(t)
	other := servertest.StartWith(t, servertest.Options{
		Dir:        w.srv.Dir,
		Targets:    []config.Target{{Name: "cp", Endpoints: []string{"http://127.0.0.1:1"}, InsecurePlaintext: true, Deltas: &config.Deltas{}}},
		AgentGuard: w.agent, DeltaFence: w.fence,
	})
	store := &alternatingStore{stores: []agentdelta.Store{w.store, &agentdelta.ServerStore{Client: other.AgentClient, Chain: "cp-full", Target: "cp"}}}
	stop, done := w.captureTo(t, store, 50*time.Millisecond)
	var newest int64
	for i := 0; ; i++ {
		newest = w.put(t, fmt.Sprintf("/registry/r/%d", i%7), fmt.Sprint(i))
		if n, _ := store.firstErr(); n >= 6 {
			break
		}
		if i > 20000 {
			t.Fatal("the agent stored fewer than 6 segments")
		}
	}
	w.waitStored(t, newest, 30*time.Second)
	stop()
	if err := <-done; err != nil {
		t.Fatalf("delta agent: %v", err)
	}
	done <- nil
	if n, err := store.firstErr(); err != nil {
		t.Fatalf("of %d segments stored through two replicas in turn, one was refused: %v", n, err)
	}
	restored := restoreLocal(t, w, "--to-revision", fmt.Sprint(newest))
	sameKeyspace(t, w.etcd, restored, newest)
}

// When the delta Lease is re-created (its transitions start again at 0),
// the next writer's epoch does not go back: its segments are stored and
// restores use them, and a writer in an older epoch is still refused.
func TestEpochsDoNotGoBackWhenTheLeaseIsRecreated(t *testing.T) {
	w := newCaptureWorld(t)
	stop, done := w.capture(t, 50*time.Millisecond)
	before := w.put(t, "/registry/e/1", "before")
	w.waitStored(t, before, 30*time.Second)
	stop()
	if err := <-done; err != nil {
		t.Fatalf("delta agent: %v", err)
	}
	done <- nil

	w.fence.transitions.Store(0) // the Lease deleted and created again
	stop, done = w.capture(t, 50*time.Millisecond)
	after := w.put(t, "/registry/e/2", "after")
	w.waitStored(t, after, 30*time.Second)
	stop()
	if err := <-done; err != nil {
		t.Fatalf("delta agent after the Lease was re-created: %v", err)
	}
	done <- nil

	addr := "--server-address=" + w.srv.Addr
	r := mustRun(t, addr, "list", "--target", "cp")
	if !strings.Contains(r.out, fmt.Sprintf("to revision %d", after)) {
		t.Fatalf("the window does not reach revision %d, stored after the Lease was re-created:\n%s", after, r.out)
	}
	restored := restoreLocal(t, w, "--to-revision", fmt.Sprint(after))
	sameKeyspace(t, w.etcd, restored, after)
}

// restoreLocal restores target cp of w with restore --local to point and
// starts the restored member.
func restoreLocal(t *testing.T, w *captureWorld, point ...string) *clientv3.Client {
	t.Helper()
	dataDir := filepath.Join(t.TempDir(), "etcd")
	peer := freeURL(t)
	mustRun(t, append([]string{"--server-address=" + w.srv.Addr, "restore", "--local", "--target", "cp", "--data-dir", dataDir, "--member-name", "m1",
		"--initial-cluster", "m1=" + peer.String(), "--initial-advertise-peer-urls", peer.String()}, point...)...)
	return startEtcd(t, dataDir, "m1", peer)
}
