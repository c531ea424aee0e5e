package sandbox

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
)

// netpolQueueID is the NFQUEUE the enforcer reads the first packet of each
// connection from (upstream's install.yaml uses 98).
const netpolQueueID = 98

// netpolTable is the nftables table (family inet) the enforcer programs in
// the node's network namespace.
const netpolTable = "kube-network-policies"

// ErrNetworkPolicyUnsupported is returned (wrapped) by CheckNetworkPolicy,
// and by Start with Config.NetworkPolicy, when this machine's kernel cannot
// run kube-network-policies.
var ErrNetworkPolicyUnsupported = errors.New("this kernel cannot run kube-network-policies")

// CheckNetworkPolicy tells whether the kernel can run kube-network-policies
// as the sandbox builds it (nil), or why not (ErrNetworkPolicyUnsupported).
// The enforcer sends the first packet of every connection of a pod under a
// policy to NFQUEUE (nfnetlink_queue) through x_tables' NFQUEUE target,
// which nftables runs through nft_compat (hack/build-netpol.sh: upstream's
// nftables queue expression needs CONFIG_NFT_QUEUE, which the machines
// this project is developed on lack). Both show in /proc; nft_compat does
// not, and without it Start fails with the enforcer's own error.
func CheckNetworkPolicy() error {
	if _, err := os.Stat("/proc/net/netfilter/nfnetlink_queue"); err != nil {
		return fmt.Errorf("%w: no nfnetlink_queue (CONFIG_NETFILTER_NETLINK_QUEUE): %v", ErrNetworkPolicyUnsupported, err)
	}
	targets, err := os.ReadFile("/proc/net/ip_tables_targets")
	if err != nil {
		return fmt.Errorf("%w: no x_tables (CONFIG_NETFILTER_XTABLES): %v", ErrNetworkPolicyUnsupported, err)
	}
	for _, t := range strings.Fields(string(targets)) {
		if t == "NFQUEUE" {
			return nil
		}
	}
	return fmt.Errorf("%w: no x_tables NFQUEUE target (CONFIG_NETFILTER_XT_TARGET_NFQUEUE) in /proc/net/ip_tables_targets", ErrNetworkPolicyUnsupported)
}

// checkNetworkPolicyBinary reports (wrapping ErrBinariesMissing) a missing
// kube-network-policies.
func checkNetworkPolicyBinary(nodeDir string) error {
	if p := filepath.Join(nodeDir, "bin", "kube-network-policies"); !isFile(p) {
		return fmt.Errorf("%w: no %s (`make netpol-bin`)", ErrBinariesMissing, p)
	}
	return nil
}

// netpolRBAC is upstream's install.yaml (v0.8.0) without the DaemonSet:
// the identity the enforcer runs as, allowed to list and watch what it
// evaluates policies against.
const netpolRBAC = `apiVersion: v1
kind: ServiceAccount
metadata:
  name: kube-network-policies
  namespace: kube-system
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata:
  name: kube-network-policies
rules:
  - apiGroups: [""]
    resources: [pods, namespaces]
    verbs: [list, watch]
  - apiGroups: [networking.k8s.io]
    resources: [networkpolicies]
    verbs: [list, watch]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata:
  name: kube-network-policies
roleRef:
  apiGroup: rbac.authorization.k8s.io
  kind: ClusterRole
  name: kube-network-policies
subjects:
  - kind: ServiceAccount
    name: kube-network-policies
    namespace: kube-system
`

// startNetworkPolicy starts kube-network-policies on node n as a host
// process in the node's namespaces, as kube-proxy runs, where upstream runs
// a hostNetwork DaemonSet. Its main only knows the in-cluster
// configuration, so the node's /run (its own, see nodeDirs) gets the
// service-account token and CA a pod would have, and the environment names
// the API server. NRI, which it would use to learn pod IPs before the API
// server has them, is absent from Debian's containerd 1.6; it then logs
// so and uses the API server's pod IPs alone. It returns once the enforcer
// has programmed its nftables table and bound its queue: from then on
// every NetworkPolicy is enforced.
func (s *Sandbox) startNetworkPolicy(ctx context.Context, n *node) error {
	if err := s.EnsureNamespace(ctx, "kube-system"); err != nil {
		return err
	}
	if err := s.applyManifest(ctx, netpolRBAC); err != nil {
		return fmt.Errorf("kube-network-policies RBAC: %w", err)
	}
	// The sandbox lives for one test run; a day outlasts any.
	tr, err := s.client.CoreV1().ServiceAccounts("kube-system").CreateToken(ctx, "kube-network-policies", &authenticationv1.TokenRequest{
		Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: ptr.To[int64](24 * 3600)},
	}, metav1.CreateOptions{})
	if err != nil {
		return fmt.Errorf("kube-network-policies token: %w", err)
	}
	saDir := n.hostPath("/run/secrets/kubernetes.io/serviceaccount")
	if err := os.MkdirAll(saDir, 0o755); err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(saDir, "token"), []byte(tr.Status.Token), 0o600); err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(saDir, "ca.crt"), s.pki.ca.certPEM, 0o644); err != nil {
		return err
	}
	u, err := url.Parse(s.apiserver.url)
	if err != nil {
		return fmt.Errorf("API server URL: %w", err)
	}
	// env: exec.Cmd's environment is the node's fixed one (launch); env
	// execs the binary, so the process stays the one Stop kills.
	if n.netpol, err = s.launchInNode(n, "kube-network-policies", "env",
		"KUBERNETES_SERVICE_HOST="+u.Hostname(), "KUBERNETES_SERVICE_PORT="+u.Port(),
		filepath.Join(s.nodeDir, "bin", "kube-network-policies"),
		"--hostname-override="+n.spec.name,
		"--nfqueue-id="+strconv.Itoa(netpolQueueID),
		// Its metrics stay on the node's loopback; nothing scrapes them.
		"--metrics-bind-address=127.0.0.1:9080",
		"--v=2",
	); err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	return poll(ctx, "kube-network-policies to program nftables and bind NFQUEUE "+strconv.Itoa(netpolQueueID), func() (bool, string, error) {
		select {
		case <-n.netpol.exited:
			return false, "", fmt.Errorf("kube-network-policies exited (%v); last lines of %s:\n%s", n.netpol.waitErr, n.netpol.logPath, n.netpol.logTail(20))
		default:
		}
		if _, err := n.exec(ctx, "nft", "list", "table", "inet", netpolTable); err != nil {
			return false, "no nftables table inet " + netpolTable, nil
		}
		// Per network namespace: the node's queues.
		queues, err := n.exec(ctx, "cat", "/proc/net/netfilter/nfnetlink_queue")
		if err != nil {
			return false, "", fmt.Errorf("read the node's NFQUEUEs: %w", err)
		}
		for _, line := range strings.Split(queues, "\n") {
			if f := strings.Fields(line); len(f) > 0 && f[0] == strconv.Itoa(netpolQueueID) {
				return true, "", nil
			}
		}
		return false, "queue not bound", nil
	})
}

// EnforcesNetworkPolicy reports whether the node enforces NetworkPolicy
// (Config.NetworkPolicy).
func (s *Sandbox) EnforcesNetworkPolicy() bool { return s.networkPolicy }
