// Package sandbox starts a small real Kubernetes cluster on this machine
// for tests, `make sandbox` and `make demo`.
//
// Everything is real and runs without Docker:
//
//   - etcd, in-process (go.etcd.io/etcd/server/v3/embed), with TLS client
//     authentication as kubeadm sets it up;
//   - kube-apiserver, kube-controller-manager and kube-scheduler, the real
//     binaries built from k8s.io/kubernetes by hack/build-kube.sh, each
//     with its own identity;
//   - one node, like a kind node without a container engine: containerd
//     and runc (Debian's packages), the kubelet and kube-proxy (nftables
//     mode) v1.37.2, CNI plugins (bridge, host-local, loopback, portmap),
//     all in a network namespace and a private mount namespace of its own.
//     The host (HostIP) and the node (NodeIP) are joined by veth pairs to
//     a bridge in a "switch" network namespace of its own, so nodes reach
//     each other at L2 and the host never forwards. Pods get addresses
//     from PodCIDR on the node's bridge, Services ClusterIPs from
//     ServiceCIDR; each node masquerades its pods' traffic leaving
//     ClusterCIDR (towards the host services), not pod-to-pod traffic;
//   - on demand (AddNode), a second node, Node2Name at Node2IP with pods
//     from Node2PodCIDR, joined the same way with its own kubelet identity
//     and cgroupRoot; it gets the same images, and node 0's volumes
//     directory, so a hostPath volume is the same on both;
//   - CoreDNS as a Deployment behind the kube-dns Service, so Service names
//     resolve in pods;
//   - a default StorageClass whose provisioner makes hostPath volumes in the
//     node's /var/lib, so PersistentVolumeClaims bind and their data
//     outlives the Pods;
//   - with Config.NetworkPolicy, NetworkPolicy enforced by
//     kube-network-policies v0.8.0 (sigs.k8s.io), run on the node as
//     kube-proxy is, as the kube-system ServiceAccount upstream's manifest
//     makes (its token in the node's own /run, where the in-cluster client
//     looks). It queues each new connection of a pod under a policy to
//     NFQUEUE 98 and answers accept or drop. This machine's kernel lacks
//     the nftables queue expression (CONFIG_NFT_QUEUE), so
//     hack/build-netpol.sh patches that one verdict into x_tables' NFQUEUE
//     target through nft_compat. Traffic from root on the node, the
//     kubelet's probes included, is never judged, as upstream does.
//     CheckNetworkPolicy tells whether the kernel can run it.
//
// Nothing is pulled: containerd gets its images from OCI image archives
// (Config.Images, ImportImages, LoadBinaryImage), the pause and CoreDNS
// images included. A user installs the product with `kubectl apply -k` and
// talks to it with `kubectl etcdbackup` exactly as on any cluster: the
// request travels client → kube-apiserver → kubelet → containerd → the
// pod's network namespace.
//
// Addresses: the API server and etcd listen on HostIP, the host end of the
// node's veth; the controllers on 127.0.0.1. Host services reach pods as a
// cluster's outside services do, through a Service with an EndpointSlice
// naming HostIP (ExposeHostService). No traffic uses the machine's own
// network.
//
// Disaster recovery: StopControlPlane and StartControlPlane take the
// control plane (etcd, kube-apiserver, kube-controller-manager,
// kube-scheduler) down and bring it back on another etcd data directory —
// a restored one (EtcdMember says what a restore needs) — with the same
// addresses, ports and certificates, as a kubeadm operator does by moving
// the static pod manifests out and back. The node and its pods run on.
//
// Isolation: the paths the kubelet, containerd and the CNI plugins
// hard-code (/run, /var/lib, /var/log, /opt) are the node's own inside its
// mount namespace; so are the machine-wide sysctls the kubelet writes
// (kernel.panic, kernel.panic_on_oops, vm.overcommit_memory, …), covered
// by plain files there. Stop kills every process of the nodes, removes their
// cgroups (kubepods, k8s.io, sandbox-node-2), the network namespaces
// (nodes' and switch's) and the host link; the mounts
// and the nftables tables (kube-proxy's, kube-network-policies') go with
// the namespaces. One sandbox runs per machine (the nodes' names are
// fixed): a second Start waits for the first to stop, or with
// Config.NoWait fails naming it.
package sandbox
