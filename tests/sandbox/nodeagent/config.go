package nodeagent

import (
	"net/netip"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/kubernetes"
)

// HandRunAnnotation marks a Pod whose process the test runs itself (the
// sandbox's RunPod): the agent leaves such Pods alone — no containers, no
// status — and only routes Service traffic to them through
// Config.HandRunTarget.
const HandRunAnnotation = "sandbox.etcdbackup.io/hand-run"

// HostTargetAnnotation on a Service sends its traffic to a loopback address
// of the host instead of to Pods: "PORT=127.0.0.1:HOSTPORT[,…]" (PORT is the
// Service port's number or name). It is how Pods reach things that run on
// the sandbox's host, such as its etcd.
const HostTargetAnnotation = "sandbox.etcdbackup.io/host-target"

// Config is what the agent needs to know about its node and cluster.
type Config struct {
	// NodeName is the Node whose Pods the agent runs (already registered).
	NodeName string
	// Client is the kubelet's identity (system:node:NAME in system:nodes),
	// so the Node authorizer limits it to what a kubelet may do.
	Client kubernetes.Interface
	// ProxyClient is kube-proxy's identity (system:kube-proxy): Services
	// and EndpointSlices.
	ProxyClient kubernetes.Interface
	// StateDir holds Pod volumes, logs, hosts files; the agent owns it.
	StateDir string
	// NodeRoot is the node's host filesystem for hostPath volumes (and so
	// for hostPath PersistentVolumes): "/var/lib/x" is NodeRoot/var/lib/x.
	NodeRoot string
	// Images maps image names (see ImageName) to host binaries.
	Images map[string]string
	// APIServerAddr is the host's loopback HOST:PORT of the API server: the
	// `kubernetes` Service leads there.
	APIServerAddr string
	// ServiceCIDR is the API server's Service ClusterIP range; connections
	// from Pods to it go through the agent's proxy. It must be a loopback
	// range (local in every Pod namespace).
	ServiceCIDR netip.Prefix
	// HostIP is the node's address reported in Pod status.
	HostIP string
	// Allocatable is the node's, for resourceFieldRef defaults.
	Allocatable corev1.ResourceList
	// HandRunTarget maps a hand-run Pod's IP and port to the host address
	// its process listens on (for Service traffic to it); may be nil.
	HandRunTarget func(ip netip.Addr, port int32) (string, bool)
	// Logf receives progress lines; nil discards them.
	Logf func(format string, args ...any)
}
