//go:build linux

package nodeagent

import (
	"context"
	"fmt"
	"maps"
	"math"
	"slices"
	"strconv"
	"strings"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation"
)

// configError is a container configuration problem (a missing Secret key, a
// bad fieldRef): the kubelet reports it as CreateContainerConfigError and
// tries again later.
type configError struct{ msg string }

func (e *configError) Error() string { return e.msg }

func configErrorf(format string, args ...any) error {
	return &configError{msg: fmt.Sprintf(format, args...)}
}

// podInfo is what the downward API can read about a Pod.
type podInfo struct {
	pod    *corev1.Pod
	podIP  string
	hostIP string
	// allocatable is the node's, the default of unset resource limits.
	allocatable corev1.ResourceList
}

// fieldValue resolves a downward API fieldRef, as the kubelet's
// podFieldSelectorRuntimeValue and fieldpath.ExtractFieldPathAsString do.
func (p *podInfo) fieldValue(fs *corev1.ObjectFieldSelector) (string, error) {
	pod := p.pod
	path := fs.FieldPath
	if path == "metadata.labels" {
		return formatMap(pod.Labels), nil
	}
	if path == "metadata.annotations" {
		return formatMap(pod.Annotations), nil
	}
	if key, ok := subscript(path, "metadata.labels"); ok {
		return pod.Labels[key], nil
	}
	if key, ok := subscript(path, "metadata.annotations"); ok {
		return pod.Annotations[key], nil
	}
	switch path {
	case "metadata.name":
		return pod.Name, nil
	case "metadata.namespace":
		return pod.Namespace, nil
	case "metadata.uid":
		return string(pod.UID), nil
	case "spec.nodeName":
		return pod.Spec.NodeName, nil
	case "spec.serviceAccountName":
		return pod.Spec.ServiceAccountName, nil
	case "status.hostIP", "status.hostIPs":
		return p.hostIP, nil
	case "status.podIP", "status.podIPs":
		return p.podIP, nil
	}
	return "", configErrorf("unsupported fieldRef %q", path)
}

// subscript parses `prefix['key']`.
func subscript(path, prefix string) (string, bool) {
	rest, ok := strings.CutPrefix(path, prefix+"['")
	if !ok {
		return "", false
	}
	return strings.CutSuffix(rest, "']")
}

// formatMap is the downward API's rendering of labels and annotations.
func formatMap(m map[string]string) string {
	var b strings.Builder
	for _, k := range slices.Sorted(maps.Keys(m)) {
		fmt.Fprintf(&b, "%s=%q\n", k, m[k])
	}
	return strings.TrimSuffix(b.String(), "\n")
}

// resourceValue resolves a resourceFieldRef for container c; an unset limit
// reads as the node's allocatable amount, as on a real node.
func (p *podInfo) resourceValue(rf *corev1.ResourceFieldSelector, c *corev1.Container) (string, error) {
	if rf.ContainerName != "" && rf.ContainerName != c.Name {
		found := false
		for i := range p.pod.Spec.Containers {
			if p.pod.Spec.Containers[i].Name == rf.ContainerName {
				c = &p.pod.Spec.Containers[i]
				found = true
			}
		}
		if !found {
			return "", configErrorf("resourceFieldRef names unknown container %q", rf.ContainerName)
		}
	}
	kind, name, ok := strings.Cut(rf.Resource, ".")
	if !ok {
		return "", configErrorf("unsupported resourceFieldRef %q", rf.Resource)
	}
	var list corev1.ResourceList
	switch kind {
	case "limits":
		list = c.Resources.Limits
	case "requests":
		list = c.Resources.Requests
	default:
		return "", configErrorf("unsupported resourceFieldRef %q", rf.Resource)
	}
	q, ok := list[corev1.ResourceName(name)]
	if !ok {
		if kind == "requests" {
			q = resource.Quantity{}
		} else {
			q = p.allocatable[corev1.ResourceName(name)]
		}
	}
	divisor := rf.Divisor
	if divisor.IsZero() {
		divisor = resource.MustParse("1")
	}
	if name == "cpu" {
		return strconv.FormatInt(int64(math.Ceil(float64(q.MilliValue())/float64(divisor.MilliValue()))), 10), nil
	}
	return strconv.FormatInt(int64(math.Ceil(float64(q.Value())/float64(divisor.Value()))), 10), nil
}

// buildEnv computes a container's environment the way the kubelet's
// makeEnvironmentVariables does: Service links first, then envFrom, then
// env with $(VAR) expansion, later ones winning.
func (w *podWorker) buildEnv(ctx context.Context, info *podInfo, c *corev1.Container) (map[string]string, error) {
	pod := info.pod
	env := map[string]string{}
	if pod.Spec.EnableServiceLinks == nil || *pod.Spec.EnableServiceLinks {
		maps.Copy(env, w.a.serviceEnv(pod.Namespace, true))
	} else {
		maps.Copy(env, w.a.serviceEnv(pod.Namespace, false))
	}
	for _, from := range c.EnvFrom {
		var data map[string]string
		switch {
		case from.ConfigMapRef != nil:
			cm, err := w.a.client.CoreV1().ConfigMaps(pod.Namespace).Get(ctx, from.ConfigMapRef.Name, metav1.GetOptions{})
			if err != nil {
				if apierrors.IsNotFound(err) && from.ConfigMapRef.Optional != nil && *from.ConfigMapRef.Optional {
					continue
				}
				return nil, configErrorf("configmap %q not found", from.ConfigMapRef.Name)
			}
			data = cm.Data
		case from.SecretRef != nil:
			s, err := w.a.client.CoreV1().Secrets(pod.Namespace).Get(ctx, from.SecretRef.Name, metav1.GetOptions{})
			if err != nil {
				if apierrors.IsNotFound(err) && from.SecretRef.Optional != nil && *from.SecretRef.Optional {
					continue
				}
				return nil, configErrorf("secret %q not found", from.SecretRef.Name)
			}
			data = map[string]string{}
			for k, v := range s.Data {
				data[k] = string(v)
			}
		}
		for k, v := range data {
			name := from.Prefix + k
			// The kubelet skips keys that are not valid variable names.
			if len(validation.IsEnvVarName(name)) == 0 {
				env[name] = v
			}
		}
	}
	// $(VAR) refers to variables defined before, and the Service links.
	for _, e := range c.Env {
		if e.ValueFrom == nil {
			env[e.Name] = expand(e.Value, lookupIn(env))
			continue
		}
		v, skip, err := w.envSource(ctx, info, c, e.ValueFrom)
		if err != nil {
			return nil, err
		}
		if !skip {
			env[e.Name] = v
		}
	}
	return env, nil
}

// envSource resolves an env var's valueFrom. skip is true for an optional
// reference that is missing.
func (w *podWorker) envSource(ctx context.Context, info *podInfo, c *corev1.Container, src *corev1.EnvVarSource) (v string, skip bool, err error) {
	ns := info.pod.Namespace
	switch {
	case src.FieldRef != nil:
		v, err := info.fieldValue(src.FieldRef)
		return v, false, err
	case src.ResourceFieldRef != nil:
		v, err := info.resourceValue(src.ResourceFieldRef, c)
		return v, false, err
	case src.ConfigMapKeyRef != nil:
		ref := src.ConfigMapKeyRef
		optional := ref.Optional != nil && *ref.Optional
		cm, err := w.a.client.CoreV1().ConfigMaps(ns).Get(ctx, ref.Name, metav1.GetOptions{})
		if err != nil {
			if apierrors.IsNotFound(err) && optional {
				return "", true, nil
			}
			return "", false, configErrorf("configmap %q not found", ref.Name)
		}
		if v, ok := cm.Data[ref.Key]; ok {
			return v, false, nil
		}
		if optional {
			return "", true, nil
		}
		return "", false, configErrorf("couldn't find key %s in ConfigMap %s/%s", ref.Key, ns, ref.Name)
	case src.SecretKeyRef != nil:
		ref := src.SecretKeyRef
		optional := ref.Optional != nil && *ref.Optional
		s, err := w.a.client.CoreV1().Secrets(ns).Get(ctx, ref.Name, metav1.GetOptions{})
		if err != nil {
			if apierrors.IsNotFound(err) && optional {
				return "", true, nil
			}
			return "", false, configErrorf("secret %q not found", ref.Name)
		}
		if v, ok := s.Data[ref.Key]; ok {
			return string(v), false, nil
		}
		if optional {
			return "", true, nil
		}
		return "", false, configErrorf("couldn't find key %s in Secret %s/%s", ref.Key, ns, ref.Name)
	}
	return "", false, configErrorf("unsupported env valueFrom")
}

func lookupIn(m map[string]string) func(string) (string, bool) {
	return func(k string) (string, bool) {
		v, ok := m[k]
		return v, ok
	}
}

// expand replaces $(VAR) references as Kubernetes does in env values,
// command and args: an unknown $(VAR) stays as written, $$ is a literal $.
func expand(s string, lookup func(string) (string, bool)) string {
	if !strings.Contains(s, "$") {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] != '$' || i+1 >= len(s) {
			b.WriteByte(s[i])
			continue
		}
		switch s[i+1] {
		case '$':
			b.WriteByte('$')
			i++
		case '(':
			end := strings.IndexByte(s[i+2:], ')')
			if end < 0 {
				b.WriteString(s[i:])
				return b.String()
			}
			name := s[i+2 : i+2+end]
			if v, ok := lookup(name); ok {
				b.WriteString(v)
			} else {
				b.WriteString(s[i : i+3+end])
			}
			i += 2 + end
		default:
			b.WriteByte('$')
		}
	}
	return b.String()
}

// serviceEnvVars are the docker-links style variables of one Service, as
// the kubelet's envvars.FromServices makes them.
func serviceEnvVars(svc *corev1.Service) map[string]string {
	env := map[string]string{}
	if svc.Spec.ClusterIP == "" || svc.Spec.ClusterIP == corev1.ClusterIPNone || len(svc.Spec.Ports) == 0 {
		return env
	}
	name := strings.ToUpper(strings.ReplaceAll(svc.Name, "-", "_"))
	ip := svc.Spec.ClusterIP
	first := svc.Spec.Ports[0]
	env[name+"_SERVICE_HOST"] = ip
	env[name+"_SERVICE_PORT"] = strconv.Itoa(int(first.Port))
	for _, p := range svc.Spec.Ports {
		if p.Name != "" {
			env[name+"_SERVICE_PORT_"+strings.ToUpper(strings.ReplaceAll(p.Name, "-", "_"))] = strconv.Itoa(int(p.Port))
		}
	}
	proto := strings.ToLower(string(first.Protocol))
	if proto == "" {
		proto = "tcp"
	}
	env[name+"_PORT"] = fmt.Sprintf("%s://%s:%d", proto, ip, first.Port)
	for _, p := range svc.Spec.Ports {
		pr := strings.ToLower(string(p.Protocol))
		if pr == "" {
			pr = "tcp"
		}
		prefix := fmt.Sprintf("%s_PORT_%d_%s", name, p.Port, strings.ToUpper(pr))
		env[prefix] = fmt.Sprintf("%s://%s:%d", pr, ip, p.Port)
		env[prefix+"_PROTO"] = pr
		env[prefix+"_PORT"] = strconv.Itoa(int(p.Port))
		env[prefix+"_ADDR"] = ip
	}
	return env
}
