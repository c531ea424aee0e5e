package auth

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"time"

	"golang.org/x/sync/singleflight"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/kubernetes"
	batchv1listers "k8s.io/client-go/listers/batch/v1"
	corev1listers "k8s.io/client-go/listers/core/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/util/flowcontrol"

	ebv1 "github.com/kubectl-etcdbackup/kubectl-etcdbackup/api/etcdbackup/v1"
)

// PodLister reads agent pods from a cache the server keeps current (an
// informer's store); client-go's corev1listers.PodLister is one, and
// InformerListers makes one from per-namespace informers. It must hold
// every pod an agent Job's template makes (the Launcher's informers,
// which select the managed-by label the templates carry, do).
//
// A Get error for which apierrors.IsNotFound holds says the cache has no
// such pod: the guard takes that as final and refuses the token without
// a review. Any other error says the cache cannot tell (not filled yet,
// namespace not watched): the guard then reviews the token in the slots
// of unverified pods and reads the pod from the API server, within
// AgentLookups' bounds.
type PodLister interface {
	Pods(namespace string) corev1listers.PodNamespaceLister
}

// JobLister reads agent Jobs from a cache, as PodLister pods; client-go's
// batchv1listers.JobLister is one. A Job it does not have is read from
// the API server, within AgentLookups' bounds, as is one whose cached
// copy fails a check a newer copy might pass (not signed yet, another
// UID): a Job is signed just after it is created, and the cache may be
// that moment behind.
type JobLister interface {
	Jobs(namespace string) batchv1listers.JobNamespaceLister
}

// InformerListers returns a PodLister and a JobLister over the informers
// informers returns for a namespace (the agent pods' and Jobs', as
// jobs.Launcher keeps them; nil for a namespace not watched). A
// namespace whose informer is missing or has not filled its store yet
// answers that it cannot tell, never that a pod does not exist.
func InformerListers(informers func(namespace string) (pods, jobs cache.SharedIndexInformer)) (PodLister, JobLister) {
	return informerPods(informers), informerJobs(informers)
}

type informerPods func(string) (cache.SharedIndexInformer, cache.SharedIndexInformer)

func (f informerPods) Pods(namespace string) corev1listers.PodNamespaceLister {
	pods, _ := f(namespace)
	if pods == nil || !pods.HasSynced() {
		return notCached[*corev1.Pod]{what: "pods", namespace: namespace}
	}
	return corev1listers.NewPodLister(pods.GetIndexer()).Pods(namespace)
}

type informerJobs func(string) (cache.SharedIndexInformer, cache.SharedIndexInformer)

func (f informerJobs) Jobs(namespace string) batchv1listers.JobNamespaceLister {
	_, jobs := f(namespace)
	if jobs == nil || !jobs.HasSynced() {
		return notCached[*batchv1.Job]{what: "jobs", namespace: namespace}
	}
	return batchv1listers.NewJobLister(jobs.GetIndexer()).Jobs(namespace)
}

// errNotCached: the cache cannot tell.
var errNotCached = errors.New("not in a filled cache")

// notCached is the lister of a namespace whose cache cannot answer.
type notCached[T any] struct{ what, namespace string }

func (n notCached[T]) List(labels.Selector) ([]T, error) {
	return nil, fmt.Errorf("agent %s in namespace %s: %w", n.what, n.namespace, errNotCached)
}

func (n notCached[T]) Get(name string) (T, error) {
	var zero T
	return zero, fmt.Errorf("agent %s %s/%s: %w", n.what, n.namespace, name, errNotCached)
}

// Bounds of the agent guard's reads of pods and Jobs from the API
// server, which it makes only where its caches (AgentGuardConfig.Pods,
// Jobs) cannot answer, or there are none. Defaults of AgentLookups.
const (
	// DefaultLookupCacheTTL is how long a pod or Job read from the API
	// server is reused: a pod that floods calls costs at most one read
	// of each per TTL, and an answer is at most this stale (a pod
	// deleted, a Job finished that long ago may still be admitted).
	DefaultLookupCacheTTL = 2 * time.Second
	// DefaultLookupCacheSize bounds that cache (least recently used out).
	DefaultLookupCacheSize = 1024
	// DefaultLookupQPS and DefaultLookupBurst bound all those reads
	// together, at half the main client's 10 per second, so that the
	// other half stays for leader election, coordination Leases and Job
	// writes whatever agent calls arrive; a read that cannot start
	// within DefaultLookupWait is refused Unavailable, which agents
	// retry.
	DefaultLookupQPS   = 5
	DefaultLookupBurst = 10
	DefaultLookupWait  = time.Second
)

// AgentLookups bounds the agent guard's reads of pods and Jobs from the
// API server; zero fields take the defaults above.
type AgentLookups struct {
	// Client reads them; nil uses AgentGuardConfig.Client. A client of
	// its own keeps even these bounded reads off the main client's rate
	// limiter.
	Client kubernetes.Interface
	// CacheTTL and CacheSize bound the cache of what was read; a
	// negative CacheTTL keeps nothing (every call reads: for tests that
	// edit a Job and look at the next call).
	CacheTTL  time.Duration
	CacheSize int
	// QPS and Burst bound the reads; a read waits at most Wait to start.
	QPS   float32
	Burst int
	Wait  time.Duration
}

// agentObjects is where the agent guard reads pods and Jobs: the caches
// if it has them, else the API server within bounds.
type agentObjects struct {
	pods    PodLister
	jobs    JobLister
	client  kubernetes.Interface
	limit   flowcontrol.RateLimiter
	wait    time.Duration
	ttl     time.Duration
	timeout time.Duration
	now     func() time.Time
	read    *lru[string, readResult]
	flight  singleflight.Group
}

type readResult struct {
	obj any
	err error
}

func newAgentObjects(cfg AgentGuardConfig, now func() time.Time) *agentObjects {
	o := cfg.Lookups
	client := o.Client
	if client == nil {
		client = cfg.Client
	}
	return &agentObjects{
		pods:    cfg.Pods,
		jobs:    cfg.Jobs,
		client:  client,
		limit:   flowcontrol.NewTokenBucketRateLimiter(cmp.Or(o.QPS, DefaultLookupQPS), cmp.Or(o.Burst, DefaultLookupBurst)),
		wait:    cmp.Or(o.Wait, DefaultLookupWait),
		ttl:     cmp.Or(o.CacheTTL, DefaultLookupCacheTTL),
		timeout: DefaultReviewTimeout,
		now:     now,
		read:    newLRU[string, readResult](cmp.Or(max(o.CacheSize, 0), DefaultLookupCacheSize)),
	}
}

// cachedPod returns pod namespace/name from the pod cache; ok says the
// cache could tell (pod nil: it has no such pod).
func (o *agentObjects) cachedPod(namespace, name string) (pod *corev1.Pod, ok bool) {
	if o.pods == nil {
		return nil, false
	}
	p, err := o.pods.Pods(namespace).Get(name)
	switch {
	case err == nil && p != nil:
		return p, true
	case apierrors.IsNotFound(err):
		return nil, true
	}
	return nil, false
}

// cachedJob is cachedPod's for Jobs.
func (o *agentObjects) cachedJob(namespace, name string) (job *batchv1.Job, ok bool) {
	if o.jobs == nil {
		return nil, false
	}
	j, err := o.jobs.Jobs(namespace).Get(name)
	switch {
	case err == nil && j != nil:
		return j, true
	case apierrors.IsNotFound(err):
		return nil, true
	}
	return nil, false
}

// getPod reads pod namespace/name from the API server, within bounds.
// A pod that does not exist is an error apierrors.IsNotFound says.
func (o *agentObjects) getPod(ctx context.Context, namespace, name string) (*corev1.Pod, error) {
	v, err := o.get(ctx, "pods/"+namespace+"/"+name, func(ctx context.Context) (any, error) {
		return o.client.CoreV1().Pods(namespace).Get(ctx, name, metav1.GetOptions{})
	})
	if err != nil {
		return nil, err
	}
	return v.(*corev1.Pod), nil
}

// getJob is getPod's for Jobs.
func (o *agentObjects) getJob(ctx context.Context, namespace, name string) (*batchv1.Job, error) {
	v, err := o.get(ctx, "jobs/"+namespace+"/"+name, func(ctx context.Context) (any, error) {
		return o.client.BatchV1().Jobs(namespace).Get(ctx, name, metav1.GetOptions{})
	})
	if err != nil {
		return nil, err
	}
	return v.(*batchv1.Job), nil
}

// get reads key with read, reusing what was read within ttl (a thing
// that does not exist too), sharing one read among concurrent callers,
// and starting at most limit's reads per second.
func (o *agentObjects) get(ctx context.Context, key string, read func(context.Context) (any, error)) (any, error) {
	if r, ok := o.read.get(key, o.now()); ok {
		return r.obj, r.err
	}
	v, err := shared(ctx, &o.flight, key, func(ctx context.Context) any {
		if r, ok := o.read.get(key, o.now()); ok {
			return r
		}
		wctx, cancel := context.WithTimeout(ctx, o.wait)
		err := o.limit.Wait(wctx)
		cancel()
		if err != nil && ctx.Err() != nil {
			return readResult{err: status.FromContextError(ctx.Err()).Err()}
		}
		if err != nil {
			return readResult{err: ebv1.ServerErrorf(codes.Unavailable,
				"too many agent calls need a pod or Job read from the API server (at most %g per second); try again", o.limit.QPS())}
		}
		rctx, cancel := context.WithTimeout(ctx, o.timeout)
		defer cancel()
		obj, err := read(rctx)
		r := readResult{obj: obj, err: err}
		if o.ttl > 0 && (err == nil || apierrors.IsNotFound(err)) {
			o.read.put(key, r, o.now().Add(o.ttl))
		}
		return r
	})
	if err != nil {
		return nil, err
	}
	r := v.(readResult)
	return r.obj, r.err
}
