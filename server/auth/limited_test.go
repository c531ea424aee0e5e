package auth_test

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	batchinformers "k8s.io/client-go/informers/batch/v1"
	coreinformers "k8s.io/client-go/informers/core/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/util/flowcontrol"

	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/server/auth"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/server/jobs"
)

// The clients of cmd/etcdbackup-server: the main one at 10 requests a
// second (burst 30), the reviews' at 10 (burst 20).
const (
	mainQPS, mainBurst     = 10, 30
	reviewQPS, reviewBurst = 10, 20
)

// limited puts every request of cs behind a real client-side token
// bucket (client-go's flowcontrol, as rest.Config's QPS and Burst make),
// and counts requests by "verb resource". The fake answers one request
// at a time, so a request behind a queue waits for the queue, as it
// would behind a drained bucket.
type limited struct {
	cs     *fake.Clientset
	mu     sync.Mutex
	counts map[string]int
}

func limit(cs *fake.Clientset, qps float32, burst int) *limited {
	l := &limited{cs: cs, counts: map[string]int{}}
	bucket := flowcontrol.NewTokenBucketRateLimiter(qps, burst)
	cs.PrependReactor("*", "*", func(a k8stesting.Action) (bool, runtime.Object, error) {
		bucket.Accept()
		l.mu.Lock()
		l.counts[a.GetVerb()+" "+a.GetResource().Resource]++
		l.mu.Unlock()
		return false, nil, nil
	})
	return l
}

func (l *limited) count(verbResource string) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.counts[verbResource]
}

// leaseRenewal is what the leader's elector does on the main client
// every few seconds (a Get and an Update of its Lease); it returns how
// long that took.
func leaseRenewal(t *testing.T, cs kubernetes.Interface) time.Duration {
	t.Helper()
	ctx := context.Background()
	start := time.Now()
	leases := cs.CoordinationV1().Leases(serverNS)
	l, err := leases.Get(ctx, "etcdbackup-controller", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	l.Spec.RenewTime = &metav1.MicroTime{Time: time.Now()}
	if _, err := leases.Update(ctx, l, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	return time.Since(start)
}

func createLease(t *testing.T, cs kubernetes.Interface) {
	t.Helper()
	holder := "replica-0"
	if _, err := cs.CoordinationV1().Leases(serverNS).Create(context.Background(), &coordinationv1.Lease{
		ObjectMeta: metav1.ObjectMeta{Name: "etcdbackup-controller", Namespace: serverNS},
		Spec:       coordinationv1.LeaseSpec{HolderIdentity: &holder},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
}

// agentCaches runs informers of the agent pods and Jobs of namespaces,
// selected as jobs.Launcher selects them, and returns listers over them.
func agentCaches(t *testing.T, cs kubernetes.Interface, namespaces ...string) (auth.PodLister, auth.JobLister) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	agents := func(o *metav1.ListOptions) { o.LabelSelector = jobs.LabelManagedBy + "=" + jobs.ManagedBy }
	byNS := cache.Indexers{cache.NamespaceIndex: cache.MetaNamespaceIndexFunc}
	type pair struct{ pods, jobs cache.SharedIndexInformer }
	informers := map[string]pair{}
	for _, ns := range namespaces {
		p := pair{
			pods: coreinformers.NewFilteredPodInformer(cs, ns, 0, byNS, agents),
			jobs: batchinformers.NewFilteredJobInformer(cs, ns, 0, byNS, agents),
		}
		go p.pods.RunWithContext(ctx)
		go p.jobs.RunWithContext(ctx)
		informers[ns] = p
	}
	for _, p := range informers {
		if !cache.WaitForCacheSync(ctx.Done(), p.pods.HasSynced, p.jobs.HasSynced) {
			t.Fatal("informers not synced")
		}
	}
	return auth.InformerListers(func(ns string) (cache.SharedIndexInformer, cache.SharedIndexInformer) {
		p, ok := informers[ns]
		if !ok {
			return nil, nil
		}
		return p.pods, p.jobs
	})
}

// inCache waits until the caches hold pod p and, if j is set, Job j.
func inCache(t *testing.T, pods auth.PodLister, jl auth.JobLister, p *corev1.Pod, j *batchv1.Job) {
	t.Helper()
	waitFor(t, func() bool {
		got, err := pods.Pods(p.Namespace).Get(p.Name)
		if err != nil || got.UID != p.UID {
			return false
		}
		if j == nil {
			return true
		}
		gotJ, err := jl.Jobs(j.Namespace).Get(j.Name)
		return err == nil && gotJ.Annotations[jobs.AnnotationSignature] != ""
	})
}

// flooder calls send from workers goroutines until stopped, counting the
// calls and keeping the first error of each kind send reports.
type flooder struct {
	calls  atomic.Int64
	stop   context.CancelFunc
	wg     sync.WaitGroup
	mu     sync.Mutex
	byCode map[string]error
}

// startFlood runs send(ctx, i) for i = 0, 1, ... from workers goroutines;
// send classifies its outcome ("" for none worth keeping).
func startFlood(workers int, send func(ctx context.Context, i int) (kind string, err error)) *flooder {
	ctx, cancel := context.WithCancel(context.Background())
	f := &flooder{stop: cancel, byCode: map[string]error{}}
	var next atomic.Int64
	for range workers {
		f.wg.Go(func() {
			for ctx.Err() == nil {
				kind, err := send(ctx, int(next.Add(1)))
				f.calls.Add(1)
				if kind == "" {
					continue
				}
				f.mu.Lock()
				if _, ok := f.byCode[kind]; !ok {
					f.byCode[kind] = err
				}
				f.mu.Unlock()
			}
		})
	}
	return f
}

// end stops the flood and returns what it saw, by kind.
func (f *flooder) end() map[string]error {
	f.stop()
	f.wg.Wait()
	return f.byCode
}

func (f *flooder) saw(kind string) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	_, ok := f.byCode[kind]
	return ok
}

// within runs call and fails t unless it returns nil within bound.
func within(t *testing.T, what string, bound time.Duration, call func() error) {
	t.Helper()
	start := time.Now()
	err := call()
	took := time.Since(start)
	if err != nil {
		t.Fatalf("%s during the flood: %v (after %v)", what, err, took)
	}
	if took > bound {
		t.Fatalf("%s during the flood took %v; want at most %v", what, took, bound)
	}
	t.Logf("%s during the flood: %v", what, took)
}
