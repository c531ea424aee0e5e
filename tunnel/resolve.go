package tunnel

import (
	"context"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/intstr"
)

// DefaultPortName is the name of the server container's user API port.
// That port listens on the pod's loopback only, where port-forward
// connections arrive, so it is not in the Service: the Service only leads
// to the pods.
const DefaultPortName = "grpc"

// Target names the server to reach.
type Target struct {
	Namespace string
	Service   string
	// PortName is the container port to forward to (or, for servers
	// installed before the user API left the Service, the Service port).
	PortName string
}

// Endpoint is the pod and port a tunnel leads to.
type Endpoint struct {
	Pod  *corev1.Pod
	Port int32
}

func (e *Endpoint) String() string {
	return fmt.Sprintf("pod %s/%s port %d", e.Pod.Namespace, e.Pod.Name, e.Port)
}

// ServerLabels are the labels the manifests give the server's pods and
// its Service selects by. Resolve lists the pods they select while it gets
// the Service, so the two lookups cost one round trip, not two; a Service
// that selects otherwise costs a second list.
var ServerLabels = map[string]string{"app.kubernetes.io/name": "etcdbackup-server"}

// Resolve finds a Running and Ready pod behind the Service and its
// container port named PortName.
func (d *Dialer) Resolve(ctx context.Context) (*Endpoint, error) {
	t := d.target
	guess := labels.SelectorFromSet(ServerLabels).String()
	// The guessed list runs beside the Service lookup, on a goroutine this
	// call waits for before it returns.
	lctx, cancel := context.WithCancel(ctx)
	var guessed *corev1.PodList
	var guessErr error
	listed := make(chan struct{})
	go func() {
		defer close(listed)
		guessed, guessErr = d.client.CoreV1().Pods(t.Namespace).List(lctx, metav1.ListOptions{LabelSelector: guess})
		d.trace("resolve: pods listed")
	}()
	defer func() {
		cancel()
		<-listed
	}()

	svc, err := d.client.CoreV1().Services(t.Namespace).Get(ctx, t.Service, metav1.GetOptions{})
	d.trace("resolve: service got")
	if apierrors.IsNotFound(err) {
		return nil, &NotInstalledError{Namespace: t.Namespace, Service: t.Service}
	}
	if err != nil {
		return nil, apiError(d.config.Host, fmt.Sprintf("get service %s/%s", t.Namespace, t.Service), err)
	}
	if len(svc.Spec.Selector) == 0 {
		return nil, fmt.Errorf("service %s/%s has no selector, so no server pod can be found behind it", t.Namespace, t.Service)
	}
	var pods *corev1.PodList
	if selector := labels.SelectorFromSet(svc.Spec.Selector).String(); selector == guess {
		<-listed
		pods, err = guessed, guessErr
	} else {
		pods, err = d.client.CoreV1().Pods(t.Namespace).List(ctx, metav1.ListOptions{LabelSelector: selector})
	}
	if err != nil {
		return nil, apiError(d.config.Host, fmt.Sprintf("list pods of service %s/%s", t.Namespace, t.Service), err)
	}
	var ready []*corev1.Pod
	var notReady []corev1.Pod
	for i := range pods.Items {
		p := &pods.Items[i]
		if p.DeletionTimestamp != nil {
			continue
		}
		if p.Status.Phase == corev1.PodRunning && podReady(p) {
			ready = append(ready, p)
			continue
		}
		notReady = append(notReady, *p)
	}
	if len(ready) == 0 {
		return nil, &NotReadyError{Namespace: t.Namespace, Service: t.Service, Pods: notReady}
	}
	p := d.pick(ready)
	port, err := userPort(p, svc, t.PortName)
	if err != nil {
		return nil, err
	}
	return &Endpoint{Pod: p, Port: port}, nil
}

// userPort is p's container port named name or, failing that, what the
// Service's port of that name leads to.
func userPort(p *corev1.Pod, svc *corev1.Service, name string) (int32, error) {
	if port, ok := namedContainerPort(p, name); ok {
		return port, nil
	}
	svcPort, err := servicePort(svc, name)
	if err != nil {
		return 0, fmt.Errorf("pod %s/%s has no container port named %q and %w", p.Namespace, p.Name, name, err)
	}
	return containerPort(p, svcPort.TargetPort, svcPort.Port)
}

func namedContainerPort(p *corev1.Pod, name string) (int32, bool) {
	for _, c := range p.Spec.Containers {
		for _, cp := range c.Ports {
			if cp.Name == name {
				return cp.ContainerPort, true
			}
		}
	}
	return 0, false
}

// servicePort picks the Service port named name, or the Service's only
// port when it has one and that one is unnamed.
func servicePort(svc *corev1.Service, name string) (*corev1.ServicePort, error) {
	for i := range svc.Spec.Ports {
		if svc.Spec.Ports[i].Name == name {
			return &svc.Spec.Ports[i], nil
		}
	}
	if len(svc.Spec.Ports) == 1 && svc.Spec.Ports[0].Name == "" {
		return &svc.Spec.Ports[0], nil
	}
	return nil, fmt.Errorf("service %s/%s has no port named %q either; is it the etcdbackup server's Service?", svc.Namespace, svc.Name, name)
}

// containerPort resolves a Service targetPort against the pod, as the
// endpoints controller does.
func containerPort(p *corev1.Pod, target intstr.IntOrString, servicePort int32) (int32, error) {
	switch {
	case target.Type == intstr.String && target.StrVal != "":
		if port, ok := namedContainerPort(p, target.StrVal); ok {
			return port, nil
		}
		return 0, fmt.Errorf("pod %s/%s has no container port named %q", p.Namespace, p.Name, target.StrVal)
	case target.Type == intstr.Int && target.IntVal != 0:
		return target.IntVal, nil
	}
	return servicePort, nil
}

func podReady(p *corev1.Pod) bool {
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}
