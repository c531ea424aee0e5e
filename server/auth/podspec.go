package auth

import (
	"fmt"
	"slices"
	"strings"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	apiequality "k8s.io/apimachinery/pkg/api/equality"
)

// The labels the Job controller's selector puts on a Job's pods.
const (
	labelControllerUID       = "batch.kubernetes.io/controller-uid"
	labelLegacyControllerUID = "controller-uid"
	// ServiceAccount admission adds a projected volume of this prefix,
	// and its mount to every container.
	kubeAPIAccessPrefix = "kube-api-access-"
)

// podFromTemplate says how pod differs from what job's template would run,
// or nil. A signed Job is not enough: anyone who may create Pods in the
// Job's namespace can make one with the agents' ServiceAccount and an
// ownerReference to a real running Job, and a command of their own.
//
// Compared are the fields that decide what runs, with which credentials,
// which names resolve where, and what host access: the ServiceAccount
// and automountServiceAccountToken; the containers and init containers
// (count, order, name, image, command, args, env, envFrom, volume mounts,
// privileged, added capabilities, allowPrivilegeEscalation, and what
// runs in them besides: exec probes and lifecycle hooks); the volumes by
// name and source (so an extra hostPath, or a Secret projected under a
// kube-api-access-* name, is refused); hostNetwork, hostPID, hostIPC;
// hostAliases, dnsPolicy and dnsConfig (which decide where the agent's
// connections to the server and etcd go); no ephemeral containers; the
// digests the kubelet reports running, where the spec pins one (an image
// swapped in the pod's spec after it started runs until the kubelet
// restarts the container). A
// controller-uid label, if present, must be the Job's UID.
//
// Ignored is what the API server and admission legitimately add to the
// pods the Job controller creates: defaults (imagePullPolicy,
// terminationMessage*, a dnsPolicy of ClusterFirst, restartPolicy,
// schedulerName, pod securityContext, enableServiceLinks, priority,
// preemptionPolicy), tolerations, nodeName, resources (LimitRanges),
// ServiceAccount admission's kube-api-access-* volume and mounts (only
// for a template that does not turn them off: the server's all do), and
// the pod's name and labels: a copy of the pod made by hand outside the
// Job's selector (the delta e2e's second agent) runs the same thing and
// is admitted. The label is not required because it proves nothing:
// whoever makes a pod sets it.
//
// The env comparison assumes NonIndexed Jobs, as the server makes: the Job
// controller adds JOB_COMPLETION_INDEX to the pods of Indexed ones
// (jobRunsOnePod refuses those).
func podFromTemplate(pod *corev1.Pod, job *batchv1.Job) error {
	tmpl := job.Spec.Template.Spec
	for _, l := range []string{labelControllerUID, labelLegacyControllerUID} {
		if v, ok := pod.Labels[l]; ok && v != string(job.UID) {
			return fmt.Errorf("label %s=%s is not the Job's uid %s", l, v, job.UID)
		}
	}
	// The server's templates turn the API token off; a pod that turns it
	// back on holds the ServiceAccount's API token.
	noAPIToken := tmpl.AutomountServiceAccountToken != nil && !*tmpl.AutomountServiceAccountToken
	eq := apiequality.Semantic.DeepEqual
	switch {
	case pod.Spec.ServiceAccountName != tmpl.ServiceAccountName:
		return fmt.Errorf("ServiceAccount %q differs from %q", pod.Spec.ServiceAccountName, tmpl.ServiceAccountName)
	case noAPIToken && (pod.Spec.AutomountServiceAccountToken == nil || *pod.Spec.AutomountServiceAccountToken):
		return fmt.Errorf("it mounts the ServiceAccount's API token (automountServiceAccountToken is not false, as in the template)")
	case len(pod.Spec.EphemeralContainers) > 0:
		return fmt.Errorf("it has ephemeral containers (%s)", pod.Spec.EphemeralContainers[0].Name)
	case pod.Spec.HostNetwork != tmpl.HostNetwork:
		return fmt.Errorf("hostNetwork differs")
	case pod.Spec.HostPID != tmpl.HostPID:
		return fmt.Errorf("hostPID differs")
	case pod.Spec.HostIPC != tmpl.HostIPC:
		return fmt.Errorf("hostIPC differs")
	case !eq(pod.Spec.HostAliases, tmpl.HostAliases):
		return fmt.Errorf("hostAliases differ (they would decide where the agent's connections go)")
	case dnsPolicy(pod.Spec.DNSPolicy) != dnsPolicy(tmpl.DNSPolicy):
		return fmt.Errorf("dnsPolicy %s differs from %s", dnsPolicy(pod.Spec.DNSPolicy), dnsPolicy(tmpl.DNSPolicy))
	case !eq(pod.Spec.DNSConfig, tmpl.DNSConfig):
		return fmt.Errorf("dnsConfig differs (it would decide where the agent's connections go)")
	}
	adds := admissionAdds{allowed: !noAPIToken}
	if err := sameContainers("init container", pod.Spec.InitContainers, tmpl.InitContainers, adds); err != nil {
		return err
	}
	if err := sameContainers("container", pod.Spec.Containers, tmpl.Containers, adds); err != nil {
		return err
	}
	if err := runningImages(pod); err != nil {
		return err
	}
	return sameVolumes(pod.Spec.Volumes, tmpl.Volumes, adds)
}

// admissionAdds says whether ServiceAccount admission's kube-api-access-*
// volume and mounts are expected on the pod.
type admissionAdds struct{ allowed bool }

func dnsPolicy(p corev1.DNSPolicy) corev1.DNSPolicy {
	if p == "" {
		return corev1.DNSClusterFirst
	}
	return p
}

// jobRunsOnePod says why job, as it is now, may run something other than
// the one agent pod the server created it for, or nil. Parallelism,
// completions and suspend stay editable after creation by whoever may
// update Jobs in its namespace (an application team's, for restores of
// its etcd): two restore agents at once would write one member's data
// together, a second completion would restore again later.
func jobRunsOnePod(job *batchv1.Job) error {
	s := job.Spec
	switch {
	case s.Parallelism != nil && *s.Parallelism > 1:
		return fmt.Errorf("its parallelism was set to %d: the server runs one agent per Job", *s.Parallelism)
	case s.Completions != nil && *s.Completions > 1:
		return fmt.Errorf("its completions were set to %d: the server's agents run once", *s.Completions)
	case s.CompletionMode != nil && *s.CompletionMode != batchv1.NonIndexedCompletion:
		return fmt.Errorf("its completionMode is %s: the server's Jobs are NonIndexed", *s.CompletionMode)
	case s.Suspend != nil && *s.Suspend:
		return fmt.Errorf("it is suspended: its pods are being stopped")
	}
	return nil
}

func sameContainers(kind string, got, want []corev1.Container, adds admissionAdds) error {
	if len(got) != len(want) {
		return fmt.Errorf("it has %d %ss, the template %d", len(got), kind, len(want))
	}
	for i := range got {
		g, w := &got[i], &want[i]
		eq := apiequality.Semantic.DeepEqual
		var what string
		switch {
		case g.Name != w.Name:
			return fmt.Errorf("%s %d is %q, not %q", kind, i, g.Name, w.Name)
		case g.Image != w.Image:
			what = "image"
		case !eq(g.Command, w.Command):
			what = "command"
		case !eq(g.Args, w.Args):
			what = "args"
		case !eq(g.Env, w.Env):
			what = "env"
		case !eq(g.EnvFrom, w.EnvFrom):
			what = "envFrom"
		case !eq(adds.mounts(g.VolumeMounts), adds.mounts(w.VolumeMounts)):
			what = "volumeMounts"
		case !eq(privileges(g.SecurityContext), privileges(w.SecurityContext)):
			what = "securityContext"
		case !eq(handlers(g), handlers(w)):
			what = "probes or lifecycle hooks"
		}
		if what != "" {
			return fmt.Errorf("%s %q %s differs", kind, g.Name, what)
		}
	}
	return nil
}

// mounts are ms without ServiceAccount admission's, where it may add
// them.
func (a admissionAdds) mounts(ms []corev1.VolumeMount) []corev1.VolumeMount {
	if !a.allowed {
		return ms
	}
	return slices.DeleteFunc(slices.Clone(ms), func(m corev1.VolumeMount) bool {
		return strings.HasPrefix(m.Name, kubeAPIAccessPrefix)
	})
}

// handlers is what a container's probes and lifecycle hooks run or
// reach: an exec handler runs a command in the container with its
// credentials. Admission adds none and defaults only their timings.
func handlers(c *corev1.Container) []string {
	var out []string
	handler := func(what string, exec *corev1.ExecAction, http *corev1.HTTPGetAction, tcp *corev1.TCPSocketAction, grpc *corev1.GRPCAction, sleep *corev1.SleepAction) {
		switch {
		case exec != nil:
			out = append(out, what+" exec "+fmt.Sprintf("%q", exec.Command))
		case http != nil:
			out = append(out, what+" httpGet "+http.Host+" "+http.Port.String()+" "+http.Path)
		case tcp != nil:
			out = append(out, what+" tcpSocket "+tcp.Host+" "+tcp.Port.String())
		case grpc != nil:
			out = append(out, what+" grpc "+fmt.Sprint(grpc.Port))
		case sleep != nil:
			out = append(out, what+" sleep "+fmt.Sprint(sleep.Seconds))
		}
	}
	for what, p := range map[string]*corev1.Probe{"liveness": c.LivenessProbe, "readiness": c.ReadinessProbe, "startup": c.StartupProbe} {
		if p != nil {
			h := p.ProbeHandler
			handler(what, h.Exec, h.HTTPGet, h.TCPSocket, h.GRPC, nil)
		}
	}
	if l := c.Lifecycle; l != nil {
		for what, h := range map[string]*corev1.LifecycleHandler{"postStart": l.PostStart, "preStop": l.PreStop} {
			if h != nil {
				handler(what, h.Exec, h.HTTPGet, h.TCPSocket, nil, h.Sleep)
			}
		}
	}
	slices.Sort(out)
	return out
}

// runningImages says whether a container runs another image than its
// spec pins: a pod's images may be changed after it started, and the
// kubelet runs the old one until it restarts the container. Image names
// prove nothing here — a runtime reports any of the names an image is
// known by (a mirrored image imported under its upstream name reports
// that one) — so only digests are compared: a spec that pins one
// (NAME@sha256:...) against the repository digest the kubelet reports
// running (imageID NAME@sha256:...). A status without one, or not
// reported yet, says nothing.
func runningImages(pod *corev1.Pod) error {
	spec := map[string]string{}
	for _, c := range append(slices.Clone(pod.Spec.InitContainers), pod.Spec.Containers...) {
		spec[c.Name] = c.Image
	}
	for _, st := range append(slices.Clone(pod.Status.InitContainerStatuses), pod.Status.ContainerStatuses...) {
		want, ok := spec[st.Name]
		if !ok || st.State.Running == nil {
			continue
		}
		_, pinned, ok := strings.Cut(want, "@")
		if !ok {
			continue
		}
		_, running, ok := strings.Cut(st.ImageID, "@")
		if ok && running != pinned {
			return fmt.Errorf("container %q runs image %s, not %s as its spec says (changed after it started)", st.Name, st.ImageID, want)
		}
	}
	return nil
}

// privileges are the parts of a container's securityContext that give it
// more than the template's, and that admission does not default.
func privileges(sc *corev1.SecurityContext) [3]any {
	var p [3]any
	if sc == nil {
		return p
	}
	if sc.Privileged != nil && *sc.Privileged {
		p[0] = true
	}
	if sc.Capabilities != nil && len(sc.Capabilities.Add) > 0 {
		p[1] = fmt.Sprint(sc.Capabilities.Add)
	}
	if sc.AllowPrivilegeEscalation != nil && *sc.AllowPrivilegeEscalation {
		p[2] = true
	}
	return p
}

func sameVolumes(got, want []corev1.Volume, adds admissionAdds) error {
	byName := map[string]corev1.VolumeSource{}
	for _, v := range want {
		if !adds.allowed || !strings.HasPrefix(v.Name, kubeAPIAccessPrefix) {
			byName[v.Name] = v.VolumeSource
		}
	}
	seen, apiAccess := 0, 0
	for _, v := range got {
		if adds.allowed && strings.HasPrefix(v.Name, kubeAPIAccessPrefix) {
			// One, and only what ServiceAccount admission projects: a
			// Secret projected under this name would pass as it.
			if apiAccess++; apiAccess > 1 || !isAPIAccess(v) {
				return fmt.Errorf("volume %q is not the one ServiceAccount admission adds", v.Name)
			}
			continue
		}
		w, ok := byName[v.Name]
		if !ok {
			return fmt.Errorf("volume %q is not in the template", v.Name)
		}
		if !apiequality.Semantic.DeepEqual(v.VolumeSource, w) {
			return fmt.Errorf("volume %q source differs", v.Name)
		}
		seen++
	}
	if seen != len(byName) {
		return fmt.Errorf("it lacks volumes of the template")
	}
	return nil
}

// isAPIAccess says whether v is ServiceAccount admission's projected
// volume: the ServiceAccount's token for the API server, the cluster's
// CA (ConfigMap kube-root-ca.crt) and the namespace, nothing else.
func isAPIAccess(v corev1.Volume) bool {
	if v.Projected == nil {
		return false
	}
	for _, src := range v.Projected.Sources {
		switch {
		case src.ServiceAccountToken != nil && src.ServiceAccountToken.Audience == "" && src.Secret == nil && src.ConfigMap == nil && src.DownwardAPI == nil && src.ClusterTrustBundle == nil:
		case src.ConfigMap != nil && src.ConfigMap.Name == "kube-root-ca.crt" && src.Secret == nil && src.ServiceAccountToken == nil && src.DownwardAPI == nil && src.ClusterTrustBundle == nil:
		case src.DownwardAPI != nil && src.Secret == nil && src.ConfigMap == nil && src.ServiceAccountToken == nil && src.ClusterTrustBundle == nil:
			for _, item := range src.DownwardAPI.Items {
				if item.ResourceFieldRef != nil || item.FieldRef == nil || item.FieldRef.FieldPath != "metadata.namespace" {
					return false
				}
			}
		default:
			return false
		}
	}
	return true
}
