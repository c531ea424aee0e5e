package sandbox_test

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"

	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/tests/sandbox"
)

const secondNodeNS = "second-node"

// TestSecondNode checks that AddNode joins a second node to a running
// sandbox as a real cluster's second node: pods on either reach pods on
// the other by pod IP and through a Service, pods on node 2 resolve names
// with CoreDNS (on node 0) and reach the API server, a ReadWriteMany claim
// is the same directory on both, `kubectl drain` empties node 2, and Stop
// leaves nothing of either node behind.
func TestSecondNode(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	archive, _ := podtoolArchive(ctx, t)
	var before map[string]string
	s := sandbox.StartForTestWith(t, sandbox.Config{Images: []string{archive},
		Locked: func() { before = machineState(t) }})
	began := time.Now()
	name, err := s.AddNode(ctx)
	if err != nil {
		t.Fatalf("AddNode: %v", err)
	}
	t.Logf("AddNode: node %s Ready in %s", name, time.Since(began).Round(time.Millisecond))
	if name != sandbox.Node2Name {
		t.Fatalf("AddNode named its node %q, want %s", name, sandbox.Node2Name)
	}
	if err := s.EnsureNamespace(ctx, secondNodeNS); err != nil {
		t.Fatal(err)
	}

	t.Run("nodes-ready", func(t *testing.T) {
		for node, ip := range map[string]string{sandbox.NodeName: sandbox.NodeIP, sandbox.Node2Name: sandbox.Node2IP} {
			n, err := s.Client().CoreV1().Nodes().Get(ctx, node, metav1.GetOptions{})
			if err != nil {
				t.Fatal(err)
			}
			if !nodeReady(n) || internalIP(n) != ip {
				t.Fatalf("node %s: Ready %v, InternalIP %q; want Ready at %s", node, nodeReady(n), internalIP(n), ip)
			}
		}
	})
	pod0 := servePinned(ctx, t, s, "serve-0", sandbox.NodeName)
	pod2 := servePinned(ctx, t, s, "serve-2", sandbox.Node2Name)
	t.Run("pod-to-pod", func(t *testing.T) {
		expectGet(ctx, t, s, "to-pod-2", sandbox.NodeName, "http://"+pod2.Status.PodIP+":8080/", "pod="+pod2.Name)
		expectGet(ctx, t, s, "to-pod-0", sandbox.Node2Name, "http://"+pod0.Status.PodIP+":8080/", "pod="+pod0.Name)
	})
	t.Run("service-other-node", func(t *testing.T) {
		svc, err := s.Client().CoreV1().Services(secondNodeNS).Get(ctx, "serve-2", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		expectGet(ctx, t, s, "to-svc-2", sandbox.NodeName, "http://"+svc.Spec.ClusterIP+"/", "pod="+pod2.Name)
	})
	t.Run("dns-on-node-2", func(t *testing.T) {
		// CoreDNS runs on node 0: the name and the Service both cross.
		expectGet(ctx, t, s, "dns-svc-0", sandbox.Node2Name, "http://serve-0."+secondNodeNS+".svc.cluster.local/", "pod="+pod0.Name)
	})
	t.Run("apiserver-from-node-2", func(t *testing.T) {
		out := runPinned(ctx, t, s, "whoami-2", sandbox.Node2Name, podtoolContainer("main", "incluster"))
		if !strings.Contains(out, "I am system:serviceaccount:"+secondNodeNS+":default") {
			t.Fatalf("incluster on node 2: %q", out)
		}
	})
	t.Run("rwx-claim", func(t *testing.T) { testSharedClaim(ctx, t, s) })
	t.Run("drain", func(t *testing.T) {
		out, err := kubectlErr(s, nil, "drain", sandbox.Node2Name, "--ignore-daemonsets", "--delete-emptydir-data", "--timeout=90s")
		if err != nil {
			t.Fatalf("kubectl drain: %v\n%s", err, out)
		}
		n, err := s.Client().CoreV1().Nodes().Get(ctx, sandbox.Node2Name, metav1.GetOptions{})
		if err != nil || !n.Spec.Unschedulable {
			t.Fatalf("node %s after drain: %v, unschedulable %v", sandbox.Node2Name, err, n != nil && n.Spec.Unschedulable)
		}
		pods, err := s.Client().CoreV1().Pods("").List(ctx, metav1.ListOptions{FieldSelector: "spec.nodeName=" + sandbox.Node2Name})
		if err != nil {
			t.Fatal(err)
		}
		for _, p := range pods.Items {
			if p.DeletionTimestamp == nil && p.Status.Phase == corev1.PodRunning {
				t.Errorf("pod %s/%s still runs on %s after drain", p.Namespace, p.Name, sandbox.Node2Name)
			}
		}
	})
	t.Run("stop-restores-machine", func(t *testing.T) {
		pids := append(s.ContainerPIDs(), s.NodePIDs()...)
		if len(s.NodePIDs()) < 6 {
			t.Fatalf("only %d node daemons before Stop; want containerd, kubelet and kube-proxy on each node", len(s.NodePIDs()))
		}
		began := time.Now()
		if err := s.Stop(); err != nil {
			t.Fatal(err)
		}
		t.Logf("Stop took %s", time.Since(began).Round(time.Millisecond))
		for _, pid := range pids {
			if sandbox.Alive(pid) {
				t.Errorf("pid %d still runs after Stop", pid)
			}
		}
		if b, _ := os.ReadFile("/proc/sys/net/ipv4/ip_forward"); strings.TrimSpace(string(b)) != "0" {
			t.Errorf("host ip_forward is %q after Stop, want 0", strings.TrimSpace(string(b)))
		}
		left, _ := filepath.Glob("/sys/fs/cgroup/*/" + sandbox.Node2Name)
		kubepods, _ := filepath.Glob("/sys/fs/cgroup/*/kubepods")
		if left = append(left, kubepods...); len(left) > 0 {
			t.Errorf("cgroups left after Stop: %v", left)
		}
		machineUnchanged(t, before)
	})
}

// servePinned runs podtool serve as a one-replica Deployment on node (a
// Deployment, not a bare pod, so `kubectl drain` may evict it) behind a
// Service of the same name, and returns its pod once Ready and routed.
func servePinned(ctx context.Context, t *testing.T, s *sandbox.Sandbox, name, node string) *corev1.Pod {
	t.Helper()
	c := podtoolContainer("serve", "serve", "--listen=:8080")
	c.Ports = []corev1.ContainerPort{{Name: "http", ContainerPort: 8080}}
	c.ReadinessProbe = &corev1.Probe{ProbeHandler: corev1.ProbeHandler{HTTPGet: &corev1.HTTPGetAction{Path: "/healthz", Port: intstr.FromString("http")}}, PeriodSeconds: 1}
	labels := map[string]string{"app": name}
	_, err := s.Client().AppsV1().Deployments(secondNodeNS).Create(ctx, &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: appsv1.DeploymentSpec{
			Replicas: ptr.To[int32](1),
			Selector: &metav1.LabelSelector{MatchLabels: labels},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: labels},
				Spec:       onNode(corev1.PodSpec{Containers: []corev1.Container{c}}, node),
			},
		},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.CreateService(ctx, secondNodeNS, name, labels, []corev1.ServicePort{{Name: "http", Port: 80, TargetPort: intstr.FromString("http")}}); err != nil {
		t.Fatal(err)
	}
	wctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	if err := s.WaitForDeploymentAvailable(wctx, secondNodeNS, name); err != nil {
		t.Fatal(err)
	}
	if err := s.WaitForServiceRouted(wctx, secondNodeNS, name); err != nil {
		t.Fatal(err)
	}
	pods, err := s.Client().CoreV1().Pods(secondNodeNS).List(ctx, metav1.ListOptions{LabelSelector: "app=" + name})
	if err != nil || len(pods.Items) != 1 {
		t.Fatalf("pods of %s: %v (%v)", name, pods, err)
	}
	pod := &pods.Items[0]
	if pod.Spec.NodeName != node {
		t.Fatalf("pod %s runs on %q, want %s", pod.Name, pod.Spec.NodeName, node)
	}
	t.Logf("pod %s on %s at %s", pod.Name, node, pod.Status.PodIP)
	return pod
}

// onNode pins a pod to a node the way a user does: by the node's
// kubernetes.io/hostname label.
func onNode(spec corev1.PodSpec, node string) corev1.PodSpec {
	spec.NodeSelector = map[string]string{corev1.LabelHostname: node}
	return spec
}

// expectGet runs podtool get url in a Job on node and wants want in its
// output.
func expectGet(ctx context.Context, t *testing.T, s *sandbox.Sandbox, name, node, url, want string) {
	t.Helper()
	out := runPinned(ctx, t, s, name, node, podtoolContainer("main", "get", url))
	if !strings.Contains(out, "200 OK") || !strings.Contains(out, want) {
		t.Fatalf("GET %s from %s: %q; want 200 OK and %q", url, node, out, want)
	}
}

// runPinned runs container as a Job (no retries) on node, waits for it
// and returns its logs.
func runPinned(ctx context.Context, t *testing.T, s *sandbox.Sandbox, name, node string, c corev1.Container, vols ...corev1.Volume) string {
	t.Helper()
	_, err := s.Client().BatchV1().Jobs(secondNodeNS).Create(ctx, &batchv1.Job{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: batchv1.JobSpec{
			BackoffLimit: ptr.To[int32](0),
			Template: corev1.PodTemplateSpec{Spec: onNode(corev1.PodSpec{
				RestartPolicy: corev1.RestartPolicyNever,
				Containers:    []corev1.Container{c},
				Volumes:       vols,
			}, node)},
		},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	wctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	_, werr := s.WaitForJob(wctx, secondNodeNS, name)
	out, _ := kubectlErr(s, nil, "-n", secondNodeNS, "logs", "job/"+name)
	if werr != nil {
		t.Fatalf("job %s on %s: %v\nlogs: %s", name, node, werr, out)
	}
	return out
}

// testSharedClaim: a ReadWriteMany claim mounted by a pod on each node is
// one directory: each pod writes its file (in a subPath of its own, as
// root since the kubelet makes subPath directories root's) and reads the
// other's.
func testSharedClaim(ctx context.Context, t *testing.T, s *sandbox.Sandbox) {
	_, err := s.Client().CoreV1().PersistentVolumeClaims(secondNodeNS).Create(ctx, &corev1.PersistentVolumeClaim{
		ObjectMeta: metav1.ObjectMeta{Name: "shared"},
		Spec: corev1.PersistentVolumeClaimSpec{
			AccessModes: []corev1.PersistentVolumeAccessMode{corev1.ReadWriteMany},
			Resources:   corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("1Mi")}},
		},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	vol := corev1.Volume{Name: "shared", VolumeSource: corev1.VolumeSource{
		PersistentVolumeClaim: &corev1.PersistentVolumeClaimVolumeSource{ClaimName: "shared"},
	}}
	pod := func(own string, args ...string) corev1.Container {
		c := podtoolContainer("main", append([]string{"inspect", "--write", "/out"}, args...)...)
		c.SecurityContext = &corev1.SecurityContext{RunAsUser: ptr.To[int64](0)}
		c.VolumeMounts = []corev1.VolumeMount{
			{Name: "shared", MountPath: "/data"},
			{Name: "shared", MountPath: "/out", SubPath: own},
		}
		return c
	}
	out := runPinned(ctx, t, s, "rwx-0", sandbox.NodeName, pod("from-0"), vol)
	if !strings.Contains(out, "write /out: ok") {
		t.Fatalf("rwx-0 on node 0: %q", out)
	}
	out = runPinned(ctx, t, s, "rwx-2", sandbox.Node2Name, pod("from-2", "--file", "/data/from-0/podtool-probe"), vol)
	if !strings.Contains(out, "write /out: ok") || !strings.Contains(out, `file /data/from-0/podtool-probe: "x"`) {
		t.Fatalf("rwx-2 on node 2 does not see node 0's file: %q", out)
	}
	out = runPinned(ctx, t, s, "rwx-0-reads", sandbox.NodeName, pod("from-0", "--file", "/data/from-2/podtool-probe"), vol)
	if !strings.Contains(out, `file /data/from-2/podtool-probe: "x"`) {
		t.Fatalf("rwx-0-reads on node 0 does not see node 2's file: %q", out)
	}
}

func nodeReady(n *corev1.Node) bool {
	for _, c := range n.Status.Conditions {
		if c.Type == corev1.NodeReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

func internalIP(n *corev1.Node) string {
	for _, a := range n.Status.Addresses {
		if a.Type == corev1.NodeInternalIP {
			return a.Address
		}
	}
	return ""
}
