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
// Compared are only the fields that decide what runs and with which
// credentials and host access: the ServiceAccount; the containers and init
// containers (count, order, name, image, command, args, env, envFrom,
// volume mounts other than kube-api-access-*, privileged, added
// capabilities, allowPrivilegeEscalation); the volumes by name and source
// other than kube-api-access-* (so an extra hostPath is refused);
// hostNetwork, hostPID, hostIPC; no ephemeral containers. A
// controller-uid label, if present, must be the Job's UID.
//
// Ignored is what the API server and admission legitimately add to the
// pods the Job controller creates: the projected kube-api-access-* volume
// and its mounts, defaults (imagePullPolicy, terminationMessage*,
// dnsPolicy, restartPolicy, schedulerName, pod securityContext,
// enableServiceLinks, priority, preemptionPolicy), tolerations,
// nodeName, resources (LimitRanges), and the pod's name and labels: a
// copy of the pod made by hand outside the Job's selector (the delta
// e2e's second agent) runs the same thing and is admitted. The label is
// not required because it proves nothing: whoever makes a pod sets it.
//
// The env comparison assumes NonIndexed Jobs, as the server makes: the Job
// controller adds JOB_COMPLETION_INDEX to the pods of Indexed ones.
func podFromTemplate(pod *corev1.Pod, job *batchv1.Job) error {
	tmpl := job.Spec.Template.Spec
	for _, l := range []string{labelControllerUID, labelLegacyControllerUID} {
		if v, ok := pod.Labels[l]; ok && v != string(job.UID) {
			return fmt.Errorf("label %s=%s is not the Job's uid %s", l, v, job.UID)
		}
	}
	switch {
	case pod.Spec.ServiceAccountName != tmpl.ServiceAccountName:
		return fmt.Errorf("ServiceAccount %q differs from %q", pod.Spec.ServiceAccountName, tmpl.ServiceAccountName)
	case len(pod.Spec.EphemeralContainers) > 0:
		return fmt.Errorf("it has ephemeral containers (%s)", pod.Spec.EphemeralContainers[0].Name)
	case pod.Spec.HostNetwork != tmpl.HostNetwork:
		return fmt.Errorf("hostNetwork differs")
	case pod.Spec.HostPID != tmpl.HostPID:
		return fmt.Errorf("hostPID differs")
	case pod.Spec.HostIPC != tmpl.HostIPC:
		return fmt.Errorf("hostIPC differs")
	}
	if err := sameContainers("init container", pod.Spec.InitContainers, tmpl.InitContainers); err != nil {
		return err
	}
	if err := sameContainers("container", pod.Spec.Containers, tmpl.Containers); err != nil {
		return err
	}
	return sameVolumes(pod.Spec.Volumes, tmpl.Volumes)
}

func sameContainers(kind string, got, want []corev1.Container) error {
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
		case !eq(mounts(g.VolumeMounts), mounts(w.VolumeMounts)):
			what = "volumeMounts"
		case !eq(privileges(g.SecurityContext), privileges(w.SecurityContext)):
			what = "securityContext"
		}
		if what != "" {
			return fmt.Errorf("%s %q %s differs", kind, g.Name, what)
		}
	}
	return nil
}

// mounts are ms without ServiceAccount admission's.
func mounts(ms []corev1.VolumeMount) []corev1.VolumeMount {
	return slices.DeleteFunc(slices.Clone(ms), func(m corev1.VolumeMount) bool {
		return strings.HasPrefix(m.Name, kubeAPIAccessPrefix)
	})
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

func sameVolumes(got, want []corev1.Volume) error {
	byName := map[string]corev1.VolumeSource{}
	for _, v := range want {
		if !strings.HasPrefix(v.Name, kubeAPIAccessPrefix) {
			byName[v.Name] = v.VolumeSource
		}
	}
	seen := 0
	for _, v := range got {
		if strings.HasPrefix(v.Name, kubeAPIAccessPrefix) && v.Projected != nil {
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
