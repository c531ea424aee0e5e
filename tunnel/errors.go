package tunnel

import (
	"errors"
	"fmt"
	"io"
	"net"
	"strings"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
)

// NotInstalledError: the namespace has no server Service.
type NotInstalledError struct {
	Namespace, Service string
}

func (e *NotInstalledError) Error() string {
	return fmt.Sprintf("no etcdbackup server is installed in namespace %q (service %q not found); "+
		"install it (kubectl apply -k manifests/) or point at the right install with -n NAMESPACE or --server-service NAME",
		e.Namespace, e.Service)
}

// NotReadyError: the Service has no Running and Ready pod.
type NotReadyError struct {
	Namespace, Service string
	Pods               []corev1.Pod
}

func (e *NotReadyError) Error() string {
	if len(e.Pods) == 0 {
		return fmt.Sprintf("the etcdbackup server in namespace %q has no pods (service %q selects none); "+
			"check its Deployment with `kubectl -n %s get deploy,rs,pods`", e.Namespace, e.Service, e.Namespace)
	}
	var states []string
	for _, p := range e.Pods {
		states = append(states, fmt.Sprintf("%s is %s", p.Name, podState(&p)))
	}
	return fmt.Sprintf("the etcdbackup server in namespace %q is not ready: %s; see `kubectl -n %s describe pod %s`",
		e.Namespace, strings.Join(states, ", "), e.Namespace, e.Pods[0].Name)
}

func podState(p *corev1.Pod) string {
	s := string(p.Status.Phase)
	if s == "" {
		s = "Pending"
	}
	if p.Status.Phase == corev1.PodRunning {
		s += " but not Ready"
	}
	for _, c := range p.Status.ContainerStatuses {
		if w := c.State.Waiting; w != nil && w.Reason != "" {
			return s + " (" + w.Reason + ")"
		}
	}
	if p.Status.Reason != "" {
		s += " (" + p.Status.Reason + ")"
	}
	return s
}

// ForbiddenError: RBAC denies something the tunnel needs.
type ForbiddenError struct {
	Action string
	// Verb, Resource and Namespace name the missing permission when known.
	Verb, Resource, Namespace string
	Err                       error
}

func (e *ForbiddenError) Error() string {
	if e.Verb != "" {
		// `kubectl auth can-i create pods/portforward` asks about a pod
		// named portforward; a subresource needs --subresource.
		check := e.Resource
		if res, sub, ok := strings.Cut(e.Resource, "/"); ok {
			check = res + " --subresource=" + sub
		}
		return fmt.Sprintf("%s: forbidden: you may not %q %q in namespace %q; ask an administrator for a Role granting verb %q on resource %q in namespace %q "+
			"(check with `kubectl auth can-i %s %s -n %s`)",
			e.Action, e.Verb, e.Resource, e.Namespace, e.Verb, e.Resource, e.Namespace, e.Verb, check, e.Namespace)
	}
	return fmt.Sprintf("%s: %v", e.Action, e.Err)
}

func (e *ForbiddenError) Unwrap() error { return e.Err }

// newPortForwardForbidden is the ForbiddenError for a port-forward to ep
// that RBAC denies: it names the verb, resource and namespace to grant.
func newPortForwardForbidden(ep *Endpoint, err error) *ForbiddenError {
	return &ForbiddenError{Action: "port-forward to " + ep.String(), Verb: "create", Resource: "pods/portforward", Namespace: ep.Pod.Namespace, Err: err}
}

// UnreachableError: the API server could not be reached at all.
type UnreachableError struct {
	Host string
	Err  error
}

func (e *UnreachableError) Error() string {
	return fmt.Sprintf("cannot reach the Kubernetes API server at %s (%v); check your kubeconfig, --context and network: `kubectl get pods` must work", e.Host, e.Err)
}

func (e *UnreachableError) Unwrap() error { return e.Err }

// apiError turns a failed API call (what) against the API server at host
// into the typed error that says what to do.
func apiError(host, what string, err error) error {
	switch {
	case apierrors.IsForbidden(err):
		return &ForbiddenError{Action: what, Err: err}
	case apierrors.IsUnauthorized(err):
		return fmt.Errorf("%s: the API server did not accept your credentials (%v); check your kubeconfig with `kubectl auth whoami`", what, err)
	}
	var netErr net.Error
	var opErr *net.OpError
	if errors.As(err, &opErr) || errors.As(err, &netErr) || errors.Is(err, io.EOF) {
		return &UnreachableError{Host: host, Err: err}
	}
	return fmt.Errorf("%s: %w", what, err)
}
