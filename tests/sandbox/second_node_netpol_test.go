package sandbox_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/tests/sandbox"
)

// TestSecondNodeNetworkPolicy checks that NetworkPolicy selects pods on
// another node by their labels: traffic between nodes keeps the pods'
// addresses (no masquerading), and node 2 enforces policies for its pods.
// A server on node 2 admits only pods labeled role=client; of two clients
// on node 0, the labeled one connects and the other is dropped.
func TestSecondNodeNetworkPolicy(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	if err := sandbox.CheckNetworkPolicy(); errors.Is(err, sandbox.ErrNetworkPolicyUnsupported) {
		t.Skipf("sandbox: NetworkPolicy: %v", err)
	}
	archive, _ := podtoolArchive(ctx, t)
	s := sandbox.StartForTestWith(t, sandbox.Config{Images: []string{archive}, NetworkPolicy: true})
	began := time.Now()
	if _, err := s.AddNode(ctx); err != nil {
		t.Fatalf("AddNode: %v", err)
	}
	t.Logf("AddNode with kube-network-policies: %s", time.Since(began).Round(time.Millisecond))
	if err := s.EnsureNamespace(ctx, secondNodeNS); err != nil {
		t.Fatal(err)
	}
	server := servePinned(ctx, t, s, "serve-2", sandbox.Node2Name)
	for name, labels := range map[string]map[string]string{"labeled": {"role": "client"}, "unlabeled": nil} {
		if _, err := s.Client().CoreV1().Pods(secondNodeNS).Create(ctx, &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: name, Labels: labels},
			Spec:       onNode(corev1.PodSpec{Containers: []corev1.Container{podtoolContainer("client", "sleep")}}, sandbox.NodeName),
		}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		wctx, cancel := context.WithTimeout(ctx, time.Minute)
		_, err := s.WaitForPod(wctx, secondNodeNS, name, sandbox.PodReady)
		cancel()
		if err != nil {
			t.Fatal(err)
		}
	}
	url := "http://" + server.Status.PodIP + ":8080/"
	get := func(pod string) (string, error) {
		return kubectlErr(s, nil, "-n", secondNodeNS, "exec", pod, "--", "/podtool", "get", url)
	}
	for _, pod := range []string{"labeled", "unlabeled"} {
		if out, err := get(pod); err != nil || !strings.Contains(out, "200 OK") {
			t.Fatalf("%s → %s without a policy: %v: %s", pod, url, err, out)
		}
	}
	_, err := s.Client().NetworkingV1().NetworkPolicies(secondNodeNS).Create(ctx, &networkingv1.NetworkPolicy{
		ObjectMeta: metav1.ObjectMeta{Name: "clients-only"},
		Spec: networkingv1.NetworkPolicySpec{
			PodSelector: metav1.LabelSelector{MatchLabels: map[string]string{"app": "serve-2"}},
			PolicyTypes: []networkingv1.PolicyType{networkingv1.PolicyTypeIngress},
			Ingress: []networkingv1.NetworkPolicyIngressRule{{From: []networkingv1.NetworkPolicyPeer{{
				PodSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"role": "client"}},
			}}}},
		},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	// The enforcer learns of the policy through a watch: wait until the
	// unlabeled client is dropped, then the labeled one must still connect.
	waitFor(t, "the policy to drop the unlabeled client", func() bool {
		_, err := get("unlabeled")
		return err != nil
	})
	if out, err := get("unlabeled"); err == nil || (!strings.Contains(out, "deadline exceeded") && !strings.Contains(out, "timeout")) {
		t.Fatalf("unlabeled → %s under the policy: want a timeout, got %v: %s", url, err, out)
	}
	if out, err := get("labeled"); err != nil || !strings.Contains(out, "200 OK pod="+server.Name) {
		t.Fatalf("labeled → %s under the policy: %v: %s", url, err, out)
	}
}
