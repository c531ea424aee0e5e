//go:build linux

package nodeagent

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/scheme"
	typedcorev1 "k8s.io/client-go/kubernetes/typed/core/v1"
	corelisters "k8s.io/client-go/listers/core/v1"
	discoverylisters "k8s.io/client-go/listers/discovery/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/record"
	"k8s.io/utils/ptr"
)

// Agent is a running node agent. Its methods are safe for concurrent use.
type Agent struct {
	cfg       Config
	client    kubernetes.Interface
	ipam      *ipam
	rootfsDir string

	imagesMu sync.RWMutex
	images   map[string]string

	podFactory    informers.SharedInformerFactory
	proxyFactory  informers.SharedInformerFactory
	serviceLister corelisters.ServiceLister
	sliceLister   discoverylisters.EndpointSliceLister

	broadcaster record.EventBroadcaster
	recorder    record.EventRecorder

	ctx    context.Context // cancelled by Stop; every worker's and loop's parent
	cancel context.CancelFunc
	wg     sync.WaitGroup // workers, lease loop

	mu      sync.Mutex
	workers map[types.UID]*podWorker
	byName  map[types.NamespacedName]*podWorker
	byIP    map[netip.Addr]*podWorker
	runs    map[string]*containerRun // by container ID, for log following
	stopped bool

	stopOnce sync.Once
}

// New checks cfg and prepares the agent; Start runs it.
func New(cfg Config) (*Agent, error) {
	if cfg.NodeName == "" || cfg.Client == nil || cfg.ProxyClient == nil || cfg.StateDir == "" || cfg.NodeRoot == "" || cfg.APIServerAddr == "" {
		return nil, errors.New("nodeagent: NodeName, Client, ProxyClient, StateDir, NodeRoot and APIServerAddr are required")
	}
	if !cfg.ServiceCIDR.IsValid() || !cfg.ServiceCIDR.Addr().Is4() || !cfg.ServiceCIDR.Addr().IsLoopback() {
		return nil, fmt.Errorf("nodeagent: ServiceCIDR %v must be an IPv4 loopback range", cfg.ServiceCIDR)
	}
	if cfg.HostIP == "" {
		cfg.HostIP = "127.0.0.1"
	}
	if cfg.Logf == nil {
		cfg.Logf = func(string, ...any) {}
	}
	if _, err := os.Stat("/proc/self/ns/net"); err != nil {
		return nil, fmt.Errorf("nodeagent: network namespaces are needed: %w", err)
	}
	if os.Geteuid() != 0 {
		return nil, errors.New("nodeagent: must run as root (network and mount namespaces per Pod)")
	}
	a := &Agent{
		cfg:       cfg,
		client:    cfg.Client,
		ipam:      newIPAM(),
		rootfsDir: filepath.Join(cfg.StateDir, "rootfs"),
		images:    map[string]string{},
		workers:   map[types.UID]*podWorker{},
		byName:    map[types.NamespacedName]*podWorker{},
		byIP:      map[netip.Addr]*podWorker{},
		runs:      map[string]*containerRun{},
	}
	for image, bin := range cfg.Images {
		a.images[ImageName(image)] = bin
	}
	for _, d := range []string{a.rootfsDir, filepath.Join(cfg.StateDir, "pods"), filepath.Join(cfg.StateDir, "logs"), cfg.NodeRoot} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return nil, fmt.Errorf("nodeagent: %w", err)
		}
	}
	return a, nil
}

// Start starts watching the node's Pods and the cluster's Services, and
// returns once the caches are in sync. The agent runs until Stop.
func (a *Agent) Start(ctx context.Context) error {
	a.ctx, a.cancel = context.WithCancel(context.Background())
	a.broadcaster = record.NewBroadcaster(record.WithContext(a.ctx))
	a.broadcaster.StartRecordingToSink(&typedcorev1.EventSinkImpl{Interface: a.client.CoreV1().Events("")})
	a.recorder = a.broadcaster.NewRecorder(scheme.Scheme, corev1.EventSource{Component: "kubelet", Host: a.cfg.NodeName})

	a.podFactory = informers.NewSharedInformerFactoryWithOptions(a.client, 0,
		informers.WithTweakListOptions(func(o *metav1.ListOptions) {
			o.FieldSelector = "spec.nodeName=" + a.cfg.NodeName
		}))
	podInformer := a.podFactory.Core().V1().Pods()
	a.proxyFactory = informers.NewSharedInformerFactory(a.cfg.ProxyClient, 0)
	svcInformer := a.proxyFactory.Core().V1().Services()
	sliceInformer := a.proxyFactory.Discovery().V1().EndpointSlices()
	a.serviceLister = svcInformer.Lister()
	a.sliceLister = sliceInformer.Lister()

	if _, err := podInformer.Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(obj any) { a.podChanged(obj) },
		UpdateFunc: func(_, obj any) { a.podChanged(obj) },
		DeleteFunc: func(obj any) { a.podRemoved(obj) },
	}); err != nil {
		return fmt.Errorf("nodeagent: watch pods: %w", err)
	}
	// Services change hosts files; the proxy reads Services and
	// EndpointSlices when a connection arrives, so slices need no handler.
	if _, err := svcInformer.Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(any) { a.servicesChanged() },
		UpdateFunc: func(any, any) { a.servicesChanged() },
		DeleteFunc: func(any) { a.servicesChanged() },
	}); err != nil {
		return fmt.Errorf("nodeagent: watch services: %w", err)
	}
	_ = sliceInformer.Informer()

	a.proxyFactory.Start(a.ctx.Done())
	a.podFactory.Start(a.ctx.Done())
	for _, f := range []informers.SharedInformerFactory{a.proxyFactory, a.podFactory} {
		synced := f.WaitForCacheSync(ctx.Done())
		for typ, ok := range synced {
			if !ok {
				return fmt.Errorf("nodeagent: %v cache did not sync: %w", typ, ctx.Err())
			}
		}
	}
	a.wg.Add(1)
	go func() {
		defer a.wg.Done()
		a.leaseLoop()
	}()
	return nil
}

// Stop kills every container (SIGTERM, then SIGKILL after a second),
// releases every Pod network namespace and stops watching. It leaves Pods'
// API objects as they are, like a node that lost power.
func (a *Agent) Stop() {
	a.stopOnce.Do(func() {
		if a.cancel == nil {
			return
		}
		a.mu.Lock()
		a.stopped = true
		a.mu.Unlock()
		a.cancel()
		a.wg.Wait()
		a.podFactory.Shutdown()
		a.proxyFactory.Shutdown()
		a.broadcaster.Shutdown()
	})
}

// SetImage adds or replaces an image in the table; Pods waiting for it start.
func (a *Agent) SetImage(image, binary string) {
	a.imagesMu.Lock()
	a.images[ImageName(image)] = binary
	a.imagesMu.Unlock()
	a.broadcast(evResync{})
}

// Images returns a copy of the image table.
func (a *Agent) Images() map[string]string {
	a.imagesMu.RLock()
	defer a.imagesMu.RUnlock()
	return maps.Clone(a.images)
}

func (a *Agent) imageBinary(image string) (string, bool) {
	a.imagesMu.RLock()
	defer a.imagesMu.RUnlock()
	b, ok := a.images[ImageName(image)]
	return b, ok
}

// AllocateIP hands out a Pod IP (for hand-run Pods, which need one that
// EndpointSlices accept); ReleaseIP gives it back.
func (a *Agent) AllocateIP() (netip.Addr, error) { return a.ipam.allocate() }

// ReleaseIP returns an address from AllocateIP.
func (a *Agent) ReleaseIP(ip netip.Addr) { a.ipam.release(ip) }

// HasPod tells whether the agent runs the Pod, and its UID.
func (a *Agent) HasPod(ns, name string) (types.UID, bool) {
	w := a.workerByName(ns, name)
	if w == nil {
		return "", false
	}
	return w.uid, true
}

// DialPod connects to port on 127.0.0.1 inside the Pod's network namespace,
// which is what a container runtime does for port-forward.
func (a *Agent) DialPod(ctx context.Context, ns, name string, uid types.UID, port int32) (net.Conn, error) {
	w := a.workerByName(ns, name)
	if w == nil || (uid != "" && w.uid != uid) {
		return nil, fmt.Errorf("pod %s/%s (uid %s) is not running on this node", ns, name, uid)
	}
	netns := w.sandbox()
	if netns == nil {
		return nil, fmt.Errorf("pod %s/%s has no running sandbox", ns, name)
	}
	c, err := netns.Dial(ctx, "tcp", fmt.Sprintf("127.0.0.1:%d", port))
	if err != nil {
		return nil, fmt.Errorf("failed to connect to localhost:%d inside namespace of pod %s/%s: %w", port, ns, name, err)
	}
	return c, nil
}

// ContainerPIDs lists the process ids of the containers running now.
func (a *Agent) ContainerPIDs() []int {
	a.mu.Lock()
	defer a.mu.Unlock()
	var pids []int
	for _, r := range a.runs {
		if r.running() {
			pids = append(pids, r.pid)
		}
	}
	slices.Sort(pids)
	return pids
}

func (a *Agent) workerByName(ns, name string) *podWorker {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.byName[types.NamespacedName{Namespace: ns, Name: name}]
}

func (a *Agent) podChanged(obj any) {
	pod, ok := obj.(*corev1.Pod)
	if !ok || pod.Spec.NodeName != a.cfg.NodeName || pod.Annotations[HandRunAnnotation] == "true" {
		return
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.stopped {
		return
	}
	w, ok := a.workers[pod.UID]
	if !ok {
		w = newPodWorker(a, pod)
		a.workers[pod.UID] = w
		a.byName[types.NamespacedName{Namespace: pod.Namespace, Name: pod.Name}] = w
		a.wg.Add(1)
		go func() {
			defer a.wg.Done()
			w.run(a.ctx)
			a.forget(w)
		}()
		return
	}
	w.setPod(pod)
}

func (a *Agent) podRemoved(obj any) {
	if t, ok := obj.(cache.DeletedFinalStateUnknown); ok {
		obj = t.Obj
	}
	pod, ok := obj.(*corev1.Pod)
	if !ok {
		return
	}
	a.mu.Lock()
	w := a.workers[pod.UID]
	a.mu.Unlock()
	if w != nil {
		w.post(evRemoved{})
	}
}

// forget drops a finished worker from the tables.
func (a *Agent) forget(w *podWorker) {
	a.mu.Lock()
	defer a.mu.Unlock()
	delete(a.workers, w.uid)
	key := types.NamespacedName{Namespace: w.namespace, Name: w.name}
	if a.byName[key] == w {
		delete(a.byName, key)
	}
	for ip, x := range a.byIP {
		if x == w {
			delete(a.byIP, ip)
		}
	}
}

func (a *Agent) registerIP(ip netip.Addr, w *podWorker) {
	a.mu.Lock()
	a.byIP[ip] = w
	a.mu.Unlock()
}

func (a *Agent) registerRun(r *containerRun) {
	a.mu.Lock()
	a.runs[r.id] = r
	a.mu.Unlock()
}

func (a *Agent) unregisterRun(id string) {
	a.mu.Lock()
	delete(a.runs, id)
	a.mu.Unlock()
}

func (a *Agent) runByID(id string) *containerRun {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.runs[id]
}

// broadcast posts an event to every worker.
func (a *Agent) broadcast(e event) {
	a.mu.Lock()
	ws := slices.Collect(maps.Values(a.workers))
	a.mu.Unlock()
	for _, w := range ws {
		w.post(e)
	}
}

func (a *Agent) servicesChanged() { a.broadcast(evServices{}) }

// services lists every Service, sorted, for hosts files and proxies.
func (a *Agent) services() []*corev1.Service {
	svcs, err := a.serviceLister.List(labels.Everything())
	if err != nil {
		return nil
	}
	slices.SortFunc(svcs, func(x, y *corev1.Service) int {
		if c := cmpString(x.Namespace, y.Namespace); c != 0 {
			return c
		}
		return cmpString(x.Name, y.Name)
	})
	return svcs
}

func cmpString(a, b string) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

// serviceEnv is the Service-link environment of a Pod in ns: the Services
// of its namespace (when links are on) and always the `kubernetes` one.
func (a *Agent) serviceEnv(ns string, links bool) map[string]string {
	env := map[string]string{}
	for _, svc := range a.services() {
		if (links && svc.Namespace == ns) || (svc.Namespace == metav1.NamespaceDefault && svc.Name == "kubernetes") {
			maps.Copy(env, serviceEnvVars(svc))
		}
	}
	return env
}

// endpointsFor lists ready endpoint addresses and target ports of a
// Service port, from its EndpointSlices.
func (a *Agent) endpointsFor(svc *corev1.Service, port corev1.ServicePort) []netip.AddrPort {
	slices_, err := a.sliceLister.EndpointSlices(svc.Namespace).List(labels.SelectorFromSet(labels.Set{discoveryv1.LabelServiceName: svc.Name}))
	if err != nil {
		return nil
	}
	var out []netip.AddrPort
	for _, s := range slices_ {
		var target int32
		for _, p := range s.Ports {
			if ptr.Deref(p.Name, "") == port.Name && p.Port != nil {
				target = *p.Port
			}
		}
		if target == 0 {
			continue
		}
		for _, ep := range s.Endpoints {
			if ep.Conditions.Ready != nil && !*ep.Conditions.Ready {
				continue
			}
			for _, addr := range ep.Addresses {
				if ip, err := netip.ParseAddr(addr); err == nil {
					out = append(out, netip.AddrPortFrom(ip, uint16(target)))
				}
			}
		}
	}
	return out
}

// dialEndpoint connects to a Pod IP and port: inside the Pod's namespace
// for Pods the agent runs, at the hand-run process's address otherwise.
// Nothing is ever dialled on the host except loopback addresses.
func (a *Agent) dialEndpoint(ctx context.Context, ep netip.AddrPort) (net.Conn, error) {
	a.mu.Lock()
	w := a.byIP[ep.Addr()]
	a.mu.Unlock()
	if w != nil {
		ns := w.sandbox()
		if ns == nil {
			return nil, fmt.Errorf("pod %s/%s has no running sandbox", w.namespace, w.name)
		}
		return ns.Dial(ctx, "tcp", fmt.Sprintf("127.0.0.1:%d", ep.Port()))
	}
	if a.cfg.HandRunTarget != nil {
		if addr, ok := a.cfg.HandRunTarget(ep.Addr(), int32(ep.Port())); ok {
			return dialHostLoopback(ctx, addr)
		}
	}
	return nil, fmt.Errorf("no pod on this node has IP %s", ep.Addr())
}

// dialHostLoopback dials addr on the host, refusing anything but loopback.
func dialHostLoopback(ctx context.Context, addr string) (net.Conn, error) {
	ap, err := netip.ParseAddrPort(addr)
	if err != nil || !ap.Addr().IsLoopback() {
		return nil, fmt.Errorf("refusing to dial %q on the host: only loopback addresses are allowed", addr)
	}
	var d net.Dialer
	return d.DialContext(ctx, "tcp", addr)
}

// leaseLoop renews the node's Lease every 10 s, as the kubelet does; the
// node lifecycle controller takes a node without a fresh Lease for dead and
// evicts its Pods.
func (a *Agent) leaseLoop() {
	const renewEvery = 10 * time.Second
	leases := a.client.CoordinationV1().Leases(corev1.NamespaceNodeLease)
	for {
		if err := a.renewLease(leases); err != nil && a.ctx.Err() == nil {
			a.cfg.Logf("node lease: %v", err)
		}
		select {
		case <-a.ctx.Done():
			return
		case <-time.After(renewEvery):
		}
	}
}

func (a *Agent) renewLease(leases interface {
	Get(context.Context, string, metav1.GetOptions) (*coordinationv1.Lease, error)
	Create(context.Context, *coordinationv1.Lease, metav1.CreateOptions) (*coordinationv1.Lease, error)
	Update(context.Context, *coordinationv1.Lease, metav1.UpdateOptions) (*coordinationv1.Lease, error)
}) error {
	ctx, cancel := context.WithTimeout(a.ctx, 5*time.Second)
	defer cancel()
	now := metav1.NewMicroTime(time.Now())
	lease, err := leases.Get(ctx, a.cfg.NodeName, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		node, err := a.client.CoreV1().Nodes().Get(ctx, a.cfg.NodeName, metav1.GetOptions{})
		if err != nil {
			return fmt.Errorf("get node: %w", err)
		}
		_, err = leases.Create(ctx, &coordinationv1.Lease{
			ObjectMeta: metav1.ObjectMeta{
				Name:      a.cfg.NodeName,
				Namespace: corev1.NamespaceNodeLease,
				OwnerReferences: []metav1.OwnerReference{{
					APIVersion: "v1", Kind: "Node", Name: node.Name, UID: node.UID,
				}},
			},
			Spec: coordinationv1.LeaseSpec{
				HolderIdentity:       ptr.To(a.cfg.NodeName),
				LeaseDurationSeconds: ptr.To[int32](40),
				RenewTime:            &now,
			},
		}, metav1.CreateOptions{})
		if err != nil {
			return fmt.Errorf("create lease: %w", err)
		}
		return nil
	}
	if err != nil {
		return fmt.Errorf("get lease: %w", err)
	}
	lease.Spec.RenewTime = &now
	if _, err := leases.Update(ctx, lease, metav1.UpdateOptions{}); err != nil {
		return fmt.Errorf("renew lease: %w", err)
	}
	return nil
}
