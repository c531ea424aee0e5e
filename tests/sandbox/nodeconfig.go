package sandbox

import "fmt"

// The paths below are inside the node's mount namespace, where /run,
// /var/lib, /var/log and /opt are the node's own.
const (
	containerdSock = "/run/containerd/containerd.sock"
	cniBinDir      = "/opt/cni/bin"
	cniConfDir     = "/opt/cni/net.d"
)

// containerdConfig is containerd's configuration for the node: its own
// root, state and socket (in the node's private dirs), the overlayfs
// snapshotter, runc with cgroupfs (PID 1 here is not systemd), the local
// pause image (the pod sandbox image, built from tests/cmd/pause and
// imported: nothing is ever pulled), and the CNI paths. restrict_oom_score_adj: root here lacks
// CAP_SYS_RESOURCE, so the pause container's oom_score_adj of -998 would
// make every pod sandbox fail in runc ("can't get final child's PID from
// pipe: EOF"); with it, containerd clamps the value to its own.
func containerdConfig(pauseImage string) string {
	return fmt.Sprintf(`version = 2
root = "/var/lib/containerd"
state = "/run/containerd"
disabled_plugins = ["io.containerd.snapshotter.v1.aufs", "io.containerd.snapshotter.v1.btrfs", "io.containerd.snapshotter.v1.devmapper", "io.containerd.snapshotter.v1.zfs", "io.containerd.tracing.processor.v1.otlp", "io.containerd.internal.v1.tracing"]

[grpc]
  address = %[1]q

[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = %[2]q
  restrict_oom_score_adj = true
  enable_selinux = false
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = false
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = %[3]q
    conf_dir = %[4]q
`, containerdSock, pauseImage, cniBinDir, cniConfDir)
}

// cniConfig is a node's pod network: a bridge with the pods' gateway on
// it, addresses from the node's podCIDR and hairpin (a pod reaching itself
// through its Service). No ipMasq: the plugin would masquerade everything
// leaving podCIDR, pod → pod across nodes too, hiding the pods' addresses
// from NetworkPolicy; the node's own nftables table masquerades only what
// leaves ClusterCIDR (setupNodeNetwork). portmap serves hostPort, with
// nftables as there is no iptables here.
func cniConfig(podCIDR string) string {
	return fmt.Sprintf(`{
  "cniVersion": "1.0.0",
  "name": "sandbox",
  "plugins": [
    {
      "type": "bridge",
      "bridge": %[1]q,
      "isGateway": true,
      "hairpinMode": true,
      "ipMasq": false,
      "ipam": {
        "type": "host-local",
        "ranges": [[{"subnet": %[2]q}]],
        "routes": [{"dst": "0.0.0.0/0"}]
      }
    },
    {"type": "portmap", "capabilities": {"portMappings": true}, "backend": "nftables"}
  ]
}
`, cniBridge, podCIDR)
}

// kubeletConfig is the KubeletConfiguration: cgroup v1 with cgroupfs (no
// systemd here), webhook authentication and authorization of requests to
// the kubelet (the API server's client certificate is checked against the
// client CA, then authorized by a SubjectAccessReview), the serving
// certificate with the node's IP, cluster DNS, no host resolv.conf (pods
// must never reach the machine's resolver) and thresholds low enough that a
// busy test machine never evicts. The node's cgroupRoot keeps a second
// kubelet's pods apart from the first's on the machine's one cgroup tree.
func kubeletConfig(clientCA, cert, key, resolvConf string, sp nodeSpec) string {
	cgroupRoot := sp.cgroupRoot
	if cgroupRoot == "" {
		cgroupRoot = "/"
	}
	return fmt.Sprintf(`apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
failCgroupV1: false
cgroupDriver: cgroupfs
cgroupsPerQOS: true
enforceNodeAllocatable: []
failSwapOn: false
address: %[5]s
port: 10250
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
healthzPort: 10248
authentication:
  anonymous:
    enabled: false
  webhook:
    enabled: true
  x509:
    clientCAFile: %[1]s
authorization:
  mode: Webhook
tlsCertFile: %[2]s
tlsPrivateKeyFile: %[3]s
rotateCertificates: false
serverTLSBootstrap: false
containerRuntimeEndpoint: unix://%[6]s
clusterDNS: [%[7]s]
clusterDomain: cluster.local
resolvConf: %[4]q
registerNode: true
serializeImagePulls: false
evictionHard:
  memory.available: "1Mi"
  nodefs.available: "1%%"
  nodefs.inodesFree: "1%%"
  imagefs.available: "1%%"
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
nodeStatusReportFrequency: 10s
syncFrequency: 10s
fileCheckFrequency: 10s
maxPods: 110
cgroupRoot: %[8]s
`, clientCA, cert, key, resolvConf, sp.ip, containerdSock, DNSServiceIP, cgroupRoot)
}

// kubeProxyConfig runs kube-proxy in nftables mode inside the node. The
// conntrack settings are zero so it leaves the machine-wide
// nf_conntrack_max and timeouts alone. minSyncPeriod 0: rules follow each
// change at once (the default batches them for a second, which a test
// creating a Service and then a client pod would race).
func kubeProxyConfig(kubeconfig string, sp nodeSpec) string {
	return fmt.Sprintf(`apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
mode: nftables
nftables:
  minSyncPeriod: 0s
hostnameOverride: %[2]s
bindAddress: %[3]s
clusterCIDR: %[4]s
detectLocalMode: ClusterCIDR
healthzBindAddress: %[3]s:10256
metricsBindAddress: 127.0.0.1:10249
clientConnection:
  kubeconfig: %[1]s
conntrack:
  maxPerCore: 0
  min: 0
  tcpEstablishedTimeout: 0s
  tcpCloseWaitTimeout: 0s
`, kubeconfig, sp.name, sp.ip, ClusterCIDR)
}
