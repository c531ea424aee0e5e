package sandbox_test

import (
	"context"
	"errors"
	"os"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/tests/sandbox"
)

// TestNetworkPolicy checks that the sandbox enforces NetworkPolicy as a
// cluster with a policy-aware network plugin does: with no policy every
// pod reaches a server pod; under a policy that admits only pods with a
// label from namespaces with a label, exactly those still connect and the
// others time out; under deny-all ingress nobody connects, yet the
// kubelet's probes, which come from the node, still reach the pod (it
// stays Ready). After Stop no process of the node is left and its network
// namespace, with the enforcer's nftables table in it, is gone.
//
// It skips, saying why, on a kernel that cannot run the enforcer.
func TestNetworkPolicy(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	// Before building anything; StartForTestWith checks again (and the
	// rest: root, binaries).
	if err := sandbox.CheckNetworkPolicy(); errors.Is(err, sandbox.ErrNetworkPolicyUnsupported) {
		t.Skipf("sandbox: NetworkPolicy: %v", err)
	}
	archive, _ := podtoolArchive(ctx, t)
	var before map[string]string
	s := sandbox.StartForTestWith(t, sandbox.Config{Images: []string{archive}, NetworkPolicy: true,
		Locked: func() { before = machineState(t) }})
	c := s.Client()

	const (
		serverNS  = "np-server"
		trustedNS = "np-trusted" // carries trustLabel
		otherNS   = "np-other"
	)
	trustLabel := map[string]string{"np-test/trusted": "true"}
	clientLabel := map[string]string{"role": "client"}
	for ns, labels := range map[string]map[string]string{serverNS: nil, trustedNS: trustLabel, otherNS: nil} {
		if _, err := c.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{
			ObjectMeta: metav1.ObjectMeta{Name: ns, Labels: labels},
		}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		if err := s.EnsureNamespace(ctx, ns); err != nil {
			t.Fatal(err)
		}
	}

	// The probe fails the pod's readiness at its first miss, so a probe
	// blocked for two seconds shows as NotReady.
	server := podtoolContainer("server", "serve", "--listen=:8080")
	server.ReadinessProbe = &corev1.Probe{
		ProbeHandler:     corev1.ProbeHandler{HTTPGet: &corev1.HTTPGetAction{Path: "/healthz", Port: intstr.FromInt32(8080)}},
		PeriodSeconds:    1,
		TimeoutSeconds:   1,
		FailureThreshold: 1,
	}
	pods := []struct {
		ns, name  string
		labels    map[string]string
		container corev1.Container
	}{
		{serverNS, "server", map[string]string{"app": "server"}, server},
		{trustedNS, "labeled", clientLabel, podtoolContainer("client", "sleep")},
		{trustedNS, "unlabeled", nil, podtoolContainer("client", "sleep")},
		{otherNS, "labeled", clientLabel, podtoolContainer("client", "sleep")},
	}
	for _, p := range pods {
		if _, err := c.CoreV1().Pods(p.ns).Create(ctx, &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: p.name, Labels: p.labels},
			Spec:       corev1.PodSpec{Containers: []corev1.Container{p.container}},
		}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	var serverIP string
	for _, p := range pods {
		wctx, cancel := context.WithTimeout(ctx, time.Minute)
		pod, err := s.WaitForPod(wctx, p.ns, p.name, sandbox.PodReady)
		cancel()
		if err != nil {
			t.Fatal(err)
		}
		if p.name == "server" {
			serverIP = pod.Status.PodIP
		}
	}
	url := "http://" + serverIP + ":8080/"

	// connect runs a plain HTTP GET of the server's pod IP in a client pod
	// (podtool gives up after 10 s).
	connect := func(ns, pod string) (string, error) {
		return kubectlErr(s, nil, "-n", ns, "exec", pod, "--", "/podtool", "get", url)
	}
	mustConnect := func(t *testing.T, ns, pod string) {
		t.Helper()
		out, err := connect(ns, pod)
		if err != nil || !strings.Contains(out, "200 OK pod=server") {
			t.Fatalf("%s/%s → %s: want 200 from the server, got %v: %s", ns, pod, url, err, out)
		}
		t.Logf("%s/%s connects: %s", ns, pod, strings.TrimSpace(out))
	}
	mustNotConnect := func(t *testing.T, ns, pod string) {
		t.Helper()
		out, err := connect(ns, pod)
		if err == nil {
			t.Fatalf("%s/%s → %s: connected, want it blocked: %s", ns, pod, url, out)
		}
		// Dropped, not refused: NetworkPolicy drops the SYN.
		if !strings.Contains(out, "deadline exceeded") && !strings.Contains(out, "timeout") {
			t.Fatalf("%s/%s → %s: failed, but not by a timeout: %v: %s", ns, pod, url, err, out)
		}
		t.Logf("%s/%s blocked: %s", ns, pod, strings.TrimSpace(out))
	}
	createPolicy := func(t *testing.T, np *networkingv1.NetworkPolicy) {
		t.Helper()
		if _, err := c.NetworkingV1().NetworkPolicies(serverNS).Create(ctx, np, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	// untilBlocked waits until the enforcer has seen a new policy: ns/pod's
	// connections fail.
	untilBlocked := func(t *testing.T, ns, pod string) {
		t.Helper()
		deadline := time.Now().Add(45 * time.Second)
		for {
			if _, err := connect(ns, pod); err != nil {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s/%s still connects to %s 45 s after the policy", ns, pod, url)
			}
			time.Sleep(500 * time.Millisecond)
		}
	}

	t.Run("no-policy-all-connect", func(t *testing.T) {
		mustConnect(t, trustedNS, "labeled")
		mustConnect(t, trustedNS, "unlabeled")
		mustConnect(t, otherNS, "labeled")
	})

	t.Run("ingress-from-labeled-pods-in-labeled-namespace", func(t *testing.T) {
		createPolicy(t, &networkingv1.NetworkPolicy{
			ObjectMeta: metav1.ObjectMeta{Name: "from-trusted-clients"},
			Spec: networkingv1.NetworkPolicySpec{
				PodSelector: metav1.LabelSelector{MatchLabels: map[string]string{"app": "server"}},
				PolicyTypes: []networkingv1.PolicyType{networkingv1.PolicyTypeIngress},
				Ingress: []networkingv1.NetworkPolicyIngressRule{{
					// One peer with both selectors: the pod label AND the
					// namespace label.
					From: []networkingv1.NetworkPolicyPeer{{
						NamespaceSelector: &metav1.LabelSelector{MatchLabels: trustLabel},
						PodSelector:       &metav1.LabelSelector{MatchLabels: clientLabel},
					}},
				}},
			},
		})
		untilBlocked(t, trustedNS, "unlabeled")
		mustNotConnect(t, trustedNS, "unlabeled")
		mustNotConnect(t, otherNS, "labeled")
		mustConnect(t, trustedNS, "labeled")
	})

	t.Run("deny-all-ingress-probes-still-pass", func(t *testing.T) {
		if err := c.NetworkingV1().NetworkPolicies(serverNS).Delete(ctx, "from-trusted-clients", metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
		before, err := c.CoreV1().Pods(serverNS).Get(ctx, "server", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		readySince := readyCondition(before).LastTransitionTime
		createPolicy(t, &networkingv1.NetworkPolicy{
			ObjectMeta: metav1.ObjectMeta{Name: "deny-all-ingress"},
			Spec: networkingv1.NetworkPolicySpec{
				PolicyTypes: []networkingv1.PolicyType{networkingv1.PolicyTypeIngress},
			},
		})
		untilBlocked(t, trustedNS, "labeled")
		mustNotConnect(t, trustedNS, "labeled")
		// The probe runs every second and fails the pod at its first
		// miss; the connection attempts above took 10 s or more.
		time.Sleep(3 * time.Second)
		after, err := c.CoreV1().Pods(serverNS).Get(ctx, "server", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		cond := readyCondition(after)
		if cond.Status != corev1.ConditionTrue || !cond.LastTransitionTime.Equal(&readySince) {
			t.Fatalf("server pod under deny-all: Ready=%s since %s (was Ready since %s): the kubelet's probes were blocked", cond.Status, cond.LastTransitionTime, readySince)
		}
		t.Logf("server pod still Ready (since %s) under deny-all ingress: the kubelet's probes from the node pass", readySince)
	})

	t.Run("stop-leaves-nothing", func(t *testing.T) {
		pids := s.NodePIDs()
		if len(pids) != 4 {
			t.Fatalf("node daemons %v: want containerd, kubelet, kube-proxy, kube-network-policies", pids)
		}
		if err := s.Stop(); err != nil {
			t.Fatal(err)
		}
		for _, pid := range pids {
			if sandbox.Alive(pid) {
				t.Errorf("node daemon pid %d still runs after Stop", pid)
			}
		}
		if _, err := os.Stat("/run/netns/etcdbackup-node"); err == nil {
			t.Errorf("the node's network namespace (and the enforcer's nftables table in it) is still there after Stop")
		}
		// Processes, mounts, cgroups, links, routes, the host's nftables
		// ruleset, sysctls: as TestNode checks.
		machineUnchanged(t, before)
	})
}

func readyCondition(p *corev1.Pod) corev1.PodCondition {
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c
		}
	}
	return corev1.PodCondition{}
}
