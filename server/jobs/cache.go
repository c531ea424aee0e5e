package jobs

import (
	"context"
	"errors"
	"fmt"
	"regexp"
	"sort"
	"strings"
	"sync"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	apiequality "k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/watch"
	batchinformers "k8s.io/client-go/informers/batch/v1"
	coreinformers "k8s.io/client-go/informers/core/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"

	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/api/agentjob"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/server/config"
)

// The Launcher reads agent Jobs, their pods and their events from
// client-go informers, one set per namespace agents run in (the server's
// own and the restore namespaces of the targets given to Start): a List
// of the Jobs of 500 backups, the phase of each, describe's events and a
// scheduler round cost no API request once the caches are filled. Writes
// (create, delete, patch), pod logs and the checks that decide a write
// (StartBackup's and StartRestore's "is one running", ForgetBackup's "has
// it finished") go to the API.
//
// What is held: Jobs and pods labelled managed-by=etcdbackup-server
// (label-selected by the API server), and of the namespace's events only
// those about agent Jobs and pods (kept by name, see agentObject: events
// carry no labels, and a field selector can name one object, not "a Job
// or Pod called backup-…"; so every event of the namespace crosses the
// watch, and the others are dropped before the store). Memory grows with
// the agent runs the cluster still keeps (ttlAfterFinished, a day by
// default; events an hour), not with what else the namespaces hold.

// Index names of the caches.
const (
	byJobName  = "job-name"        // pods by their Job's name
	byInvolved = "involved-object" // events by KIND/NAME of their object
)

// agentObjectName matches the names of agent Jobs of every kind
// (agentjob.Kind.JobName) and of their pods (the Job's name and a suffix
// the Job controller adds).
var agentObjectName = func() *regexp.Regexp {
	kinds := make([]string, 0, len(agentjob.Kinds))
	for _, k := range agentjob.Kinds {
		kinds = append(kinds, regexp.QuoteMeta(string(k.Kind)))
	}
	return regexp.MustCompile(`^(?:` + strings.Join(kinds, "|") + `)-[a-z0-9-]*-[0-9a-f]{10}(?:-[a-z0-9]+)?$`)
}()

// agentObject says whether an event is about an agent Job or pod.
func agentObject(o corev1.ObjectReference) bool {
	return (o.Kind == "Job" || o.Kind == "Pod") && agentObjectName.MatchString(o.Name)
}

// agentSelector selects what the server's agent Jobs and their pods carry.
var agentSelector = labels.SelectorFromSet(labels.Set{LabelManagedBy: managedBy})

// caches are the informers of every watched namespace.
type caches struct {
	byNS map[string]*nsCache
	// changed is closed, and replaced, whenever an informer delivers a
	// change: writers wait on it for their change to arrive.
	mu      sync.Mutex
	changed chan struct{}
	// stopped is closed when the informers stop (Start's context): the
	// caches change no more.
	stopped <-chan struct{}
}

func (c *caches) notify() {
	c.mu.Lock()
	close(c.changed)
	c.changed = make(chan struct{})
	c.mu.Unlock()
}

func (c *caches) changes() <-chan struct{} {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.changed
}

// nsCache is one namespace's informers. They are built one by one, not
// from client-go's SharedInformerFactory: the factory links the typed
// informers of every API group, about 10 MB of the plugin's binary
// (which links the server for break-glass access) for three resources.
type nsCache struct {
	namespace          string
	jobs, pods, events cache.SharedIndexInformer
	mu                 sync.Mutex
	lastErr            map[cache.SharedIndexInformer]error
	resourceOf         map[cache.SharedIndexInformer]string
	all                []cache.SharedIndexInformer
}

func newNSCache(client kubernetes.Interface, namespace string, notify func()) (*nsCache, error) {
	// No resync: nothing here reconciles on a timer; reads look at the
	// store, which the watch keeps current.
	agents := func(o *metav1.ListOptions) { o.LabelSelector = agentSelector.String() }
	byNamespace := cache.Indexers{cache.NamespaceIndex: cache.MetaNamespaceIndexFunc}
	c := &nsCache{namespace: namespace, lastErr: map[cache.SharedIndexInformer]error{}, resourceOf: map[cache.SharedIndexInformer]string{}}
	c.jobs = batchinformers.NewFilteredJobInformer(client, namespace, 0, byNamespace, agents)
	c.pods = coreinformers.NewFilteredPodInformer(client, namespace, 0, byNamespace, agents)
	c.events = newAgentEventInformer(client, namespace, 0)
	if err := c.pods.AddIndexers(cache.Indexers{byJobName: func(obj any) ([]string, error) {
		if p, ok := obj.(*corev1.Pod); ok && p.Labels[batchv1.JobNameLabel] != "" {
			return []string{p.Labels[batchv1.JobNameLabel]}, nil
		}
		return nil, nil
	}}); err != nil {
		return nil, err
	}
	if err := c.events.AddIndexers(cache.Indexers{byInvolved: func(obj any) ([]string, error) {
		if e, ok := obj.(*corev1.Event); ok {
			return []string{e.InvolvedObject.Kind + "/" + e.InvolvedObject.Name}, nil
		}
		return nil, nil
	}}); err != nil {
		return nil, err
	}
	changed := cache.ResourceEventHandlerFuncs{
		AddFunc:    func(any) { notify() },
		UpdateFunc: func(any, any) { notify() },
		DeleteFunc: func(any) { notify() },
	}
	for inf, resource := range map[cache.SharedIndexInformer]string{c.jobs: "jobs", c.pods: "pods", c.events: "events"} {
		c.resourceOf[inf] = resource
		if err := inf.SetTransform(stripManagedFields); err != nil {
			return nil, err
		}
		if err := inf.SetWatchErrorHandlerWithContext(func(ctx context.Context, r *cache.Reflector, err error) {
			c.mu.Lock()
			c.lastErr[inf] = err
			c.mu.Unlock()
			cache.DefaultWatchErrorHandler(ctx, r, err)
		}); err != nil {
			return nil, err
		}
		if _, err := inf.AddEventHandler(changed); err != nil {
			return nil, err
		}
	}
	c.all = []cache.SharedIndexInformer{c.jobs, c.pods, c.events}
	return c, nil
}

// stripManagedFields drops what the caches need not hold: they are read,
// never written back, so the field managers' bookkeeping (a good part of
// a Job's size) is only memory. It strips a copy: client-go's fake hands
// informers some of its own objects.
func stripManagedFields(obj any) (any, error) {
	if m, ok := obj.(metav1.Object); ok && len(m.GetManagedFields()) > 0 {
		c := obj.(runtime.Object).DeepCopyObject()
		c.(metav1.Object).SetManagedFields(nil)
		return c, nil
	}
	return obj, nil
}

// newAgentEventInformer watches the namespace's events and keeps those
// about agent Jobs and pods (agentObject): the API server cannot select
// them, so the filter runs here, before the store.
func newAgentEventInformer(client kubernetes.Interface, namespace string, resync time.Duration) cache.SharedIndexInformer {
	keep := func(e watch.Event) (watch.Event, bool) {
		ev, ok := e.Object.(*corev1.Event)
		if !ok || e.Type == watch.Bookmark || e.Type == watch.Error {
			return e, true
		}
		return e, agentObject(ev.InvolvedObject)
	}
	lw := &cache.ListWatch{
		ListWithContextFunc: func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) {
			list, err := client.CoreV1().Events(namespace).List(ctx, o)
			if err != nil {
				return nil, err
			}
			items := list.Items[:0]
			for _, e := range list.Items {
				if agentObject(e.InvolvedObject) {
					items = append(items, e)
				}
			}
			list.Items = items
			return list, nil
		},
		WatchFuncWithContext: func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
			w, err := client.CoreV1().Events(namespace).Watch(ctx, o)
			if err != nil {
				return nil, err
			}
			return watch.Filter(w, keep), nil
		},
	}
	return cache.NewSharedIndexInformer(cache.ToListWatcherWithWatchListSemantics(lw, client), &corev1.Event{}, resync,
		cache.Indexers{cache.NamespaceIndex: cache.MetaNamespaceIndexFunc})
}

// synced says whether inf has filled its store; if not, why (its last
// list or watch error), or nil while it is still listing.
func (c *nsCache) synced(inf cache.SharedIndexInformer) (bool, error) {
	if inf.HasSynced() {
		return true, nil
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	return false, c.lastErr[inf]
}

// unreadable is the error of a read from an informer that has not filled
// its store.
func (c *nsCache) unreadable(inf cache.SharedIndexInformer) error {
	_, err := c.synced(inf)
	why := "still listing"
	if err != nil {
		why = err.Error()
	}
	return fmt.Errorf("agent %s in namespace %s are not readable yet (%s); the server needs get, list and watch on jobs, pods and events there",
		c.resourceOf[inf], c.namespace, why)
}

// jobList returns the namespace's agent Jobs that sel selects, by name.
func (c *nsCache) jobList(sel labels.Selector) ([]*batchv1.Job, error) {
	if ok, _ := c.synced(c.jobs); !ok {
		return nil, c.unreadable(c.jobs)
	}
	var out []*batchv1.Job
	err := cache.ListAllByNamespace(c.jobs.GetIndexer(), c.namespace, sel, func(obj any) {
		out = append(out, obj.(*batchv1.Job))
	})
	sort.Slice(out, func(a, b int) bool { return out[a].Name < out[b].Name })
	return out, err
}

// job returns the Job called name, nil if the cache has none.
func (c *nsCache) job(name string) (*batchv1.Job, error) {
	if ok, _ := c.synced(c.jobs); !ok {
		return nil, c.unreadable(c.jobs)
	}
	obj, ok, err := c.jobs.GetIndexer().GetByKey(c.namespace + "/" + name)
	if err != nil || !ok {
		return nil, err
	}
	j, _ := obj.(*batchv1.Job)
	return j, nil
}

// podsOf returns the pods of Job name, newest first (none while the pod
// cache is not filled).
func (c *nsCache) podsOf(name string) []*corev1.Pod {
	if ok, _ := c.synced(c.pods); !ok {
		return nil
	}
	objs, _ := c.pods.GetIndexer().ByIndex(byJobName, name)
	pods := make([]*corev1.Pod, 0, len(objs))
	for _, o := range objs {
		if p, ok := o.(*corev1.Pod); ok && p.Namespace == c.namespace {
			pods = append(pods, p)
		}
	}
	sort.Slice(pods, func(a, b int) bool { return pods[b].CreationTimestamp.Before(&pods[a].CreationTimestamp) })
	return pods
}

// eventsOf returns the events about the object kind/name (none while
// the event cache is not filled).
func (c *nsCache) eventsOf(kind, name string) []*corev1.Event {
	if ok, _ := c.synced(c.events); !ok {
		return nil
	}
	objs, _ := c.events.GetIndexer().ByIndex(byInvolved, kind+"/"+name)
	out := make([]*corev1.Event, 0, len(objs))
	for _, o := range objs {
		if e, ok := o.(*corev1.Event); ok {
			out = append(out, e)
		}
	}
	return out
}

// errNotStarted is what reads return before Start.
var errNotStarted = errors.New("agent jobs: not watched yet (the server calls Launcher.Start before serving)")

// Start watches the agents' Jobs, pods and events in the server's
// namespace and in the restore namespaces of targets, and returns once
// the caches are filled, so that the server serves nothing from empty
// caches. The informers run until ctx ends. Start fails if the server's
// own namespace cannot be watched (forbidden: its Role lacks list or
// watch); a restore namespace that cannot be watched (its Role is the
// user's, or the namespace does not exist yet) does not hold up the
// server: reads there fail, naming what is missing, until its informers
// fill (they keep retrying). Start is called once.
func (l *Launcher) Start(ctx context.Context, targets []config.Target) error {
	l.startMu.Lock()
	defer l.startMu.Unlock()
	if l.caches.Load() != nil {
		return errors.New("agent jobs: Start called twice")
	}
	c := &caches{byNS: map[string]*nsCache{}, changed: make(chan struct{}), stopped: ctx.Done()}
	var synced []cache.InformerSynced
	for _, ns := range append([]string{l.namespace}, l.RestoreNamespaces(targets)...) {
		if c.byNS[ns] != nil {
			continue
		}
		nc, err := newNSCache(l.client, ns, c.notify)
		if err != nil {
			return fmt.Errorf("agent jobs: watch namespace %s: %w", ns, err)
		}
		c.byNS[ns] = nc
		own := ns == l.namespace
		for _, inf := range nc.all {
			synced = append(synced, func() bool {
				ok, err := nc.synced(inf)
				// The server's namespace is waited for unless the API
				// forbids it; a restore namespace until it fills or fails.
				return ok || (err != nil && (!own || apierrors.IsForbidden(err) || apierrors.IsUnauthorized(err)))
			})
		}
	}
	// The informers run until ctx, Start's, ends.
	for _, nc := range c.byNS {
		for _, inf := range nc.all {
			go inf.RunWithContext(ctx)
		}
	}
	l.caches.Store(c)
	if !cache.WaitForCacheSync(ctx.Done(), synced...) {
		return fmt.Errorf("agent jobs: caches not filled: %w", context.Cause(ctx))
	}
	own := c.byNS[l.namespace]
	for _, inf := range own.all {
		if ok, _ := own.synced(inf); !ok {
			return own.unreadable(inf)
		}
	}
	return nil
}

// watched returns the caches of namespace ns.
func (l *Launcher) watched(ns string) (*nsCache, error) {
	c := l.caches.Load()
	if c == nil {
		return nil, errNotStarted
	}
	nc := c.byNS[ns]
	if nc == nil {
		return nil, fmt.Errorf("agent jobs: namespace %s is not watched (no target given to Launcher.Start runs agents there)", ns)
	}
	return nc, nil
}

// AgentInformers returns the informers of the agent pods and Jobs of
// namespace ns (nil, nil before Start or for a namespace not watched):
// the agent guard checks callers against them (auth.InformerListers),
// which treats an informer that has not synced as unable to tell.
func (l *Launcher) AgentInformers(ns string) (pods, jobs cache.SharedIndexInformer) {
	nc, err := l.watched(ns)
	if err != nil {
		return nil, nil
	}
	return nc.pods, nc.jobs
}

// ownWriteWait bounds how long a write waits to see its change in the
// caches; past it, reads catch up by themselves.
const ownWriteWait = 10 * time.Second

// await waits until the Job cache of namespace ns shows a write of the
// Launcher (done), so that a read right after it — the scheduler's next
// round after StartBackup, a listing after ForgetBackup — sees it. It
// gives up after ownWriteWait or when ctx ends, silently: the write
// itself succeeded. Without caches (not started, or ns not watched)
// there is nothing to wait for.
func (l *Launcher) await(ctx context.Context, ns, name string, done func(j *batchv1.Job) bool) {
	c := l.caches.Load()
	if c == nil || c.byNS[ns] == nil {
		return
	}
	nc := c.byNS[ns]
	ctx, cancel := context.WithTimeout(ctx, ownWriteWait)
	defer cancel()
	for {
		changed := c.changes()
		if ok, _ := nc.synced(nc.jobs); !ok {
			return
		}
		if j, err := nc.job(name); err == nil && done(j) {
			return
		}
		select {
		case <-changed:
		case <-c.stopped:
			return
		case <-ctx.Done():
			return
		}
	}
}

// gone is the await condition of deleting j: the cache no longer has it,
// or has it being deleted, or has another Job of that name.
func gone(j *batchv1.Job) func(*batchv1.Job) bool {
	return func(c *batchv1.Job) bool { return c == nil || c.DeletionTimestamp != nil || c.UID != j.UID }
}

// Sync waits until the caches hold every agent Job, pod and event the
// API server holds now, as it holds them. The server never needs it
// (its own writes wait for their change, and what the cluster does
// arrives by the watch); it is for tests, and tools, that change agent
// objects through another client and then read through the Launcher.
// It lists from the API at each try.
func (l *Launcher) Sync(ctx context.Context) error {
	c := l.caches.Load()
	if c == nil {
		return errNotStarted
	}
	for {
		changed := c.changes()
		same, err := l.cachesMatchAPI(ctx, c)
		if err != nil || same {
			return err
		}
		select {
		case <-changed:
		case <-c.stopped:
			return errors.New("agent jobs: the informers stopped")
		case <-ctx.Done():
			return fmt.Errorf("agent jobs: caches not in step with the API: %w", context.Cause(ctx))
		}
	}
}

func (l *Launcher) cachesMatchAPI(ctx context.Context, c *caches) (bool, error) {
	for ns, nc := range c.byNS {
		opts := metav1.ListOptions{LabelSelector: agentSelector.String()}
		jobs, err := l.client.BatchV1().Jobs(ns).List(ctx, opts)
		if err != nil {
			return false, err
		}
		pods, err := l.client.CoreV1().Pods(ns).List(ctx, opts)
		if err != nil {
			return false, err
		}
		events, err := l.client.CoreV1().Events(ns).List(ctx, metav1.ListOptions{})
		if err != nil {
			return false, err
		}
		var want []metav1.Object
		for i := range jobs.Items {
			want = append(want, &jobs.Items[i])
		}
		if !sameObjects(nc, nc.jobs, want, agentSelector) {
			return false, nil
		}
		want = want[:0]
		for i := range pods.Items {
			want = append(want, &pods.Items[i])
		}
		if !sameObjects(nc, nc.pods, want, agentSelector) {
			return false, nil
		}
		want = want[:0]
		for i := range events.Items {
			if agentObject(events.Items[i].InvolvedObject) {
				want = append(want, &events.Items[i])
			}
		}
		if !sameObjects(nc, nc.events, want, labels.Everything()) {
			return false, nil
		}
	}
	return true, nil
}

// sameObjects says whether inf's store holds exactly want (of those sel
// selects: a fake clientset's watch does not select by label), each as
// the API holds it: the same resource version, or where the API sets
// none (client-go's fake) the same content.
func sameObjects(nc *nsCache, inf cache.SharedIndexInformer, want []metav1.Object, sel labels.Selector) bool {
	if ok, _ := nc.synced(inf); !ok {
		return false
	}
	have := map[string]metav1.Object{}
	_ = cache.ListAllByNamespace(inf.GetIndexer(), nc.namespace, sel, func(obj any) {
		if m, ok := obj.(metav1.Object); ok {
			have[m.GetName()] = m
		}
	})
	if len(have) != len(want) {
		return false
	}
	for _, w := range want {
		h, ok := have[w.GetName()]
		if !ok || h.GetUID() != w.GetUID() || h.GetResourceVersion() != w.GetResourceVersion() {
			return false
		}
		if w.GetResourceVersion() == "" && !sameContent(h, w) {
			return false
		}
	}
	return true
}

// sameContent compares two objects but for their type meta and managed
// fields (the caches strip those).
func sameContent(a, b metav1.Object) bool {
	strip := func(o metav1.Object) runtime.Object {
		c := o.(runtime.Object).DeepCopyObject()
		c.(metav1.Object).SetManagedFields(nil)
		c.GetObjectKind().SetGroupVersionKind(schema.GroupVersionKind{})
		return c
	}
	return apiequality.Semantic.DeepEqual(strip(a), strip(b))
}
