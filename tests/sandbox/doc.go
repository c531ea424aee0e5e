// Package sandbox starts a small real Kubernetes cluster on loopback for
// tests, `make sandbox` and `make demo`.
//
// Everything is real and runs without Docker, on free loopback ports:
//
//   - etcd, in-process (go.etcd.io/etcd/server/v3/embed);
//   - kube-apiserver, kube-controller-manager and kube-scheduler, the real
//     binaries built from k8s.io/kubernetes by hack/build-kube.sh (make
//     kube-bins), each with its own identity, as kubeadm sets them up;
//   - one Node, whose kubelet is the node agent (package nodeagent): it runs
//     the Pods bound to the node whose images are the project's own (a table
//     maps image name → binary built from this repository), each Pod in a
//     network namespace of its own, and reports their status like a
//     kubelet;
//   - a "node endpoint": the kubelet's HTTPS server, whose port-forward is
//     the kubelet's streaming library (k8s.io/cri-streaming) and whose
//     /containerLogs reads logs with the kubelet's CRI log reader;
//   - a default StorageClass with a hostPath provisioner, so
//     PersistentVolumeClaims bind and their data outlives the Pods.
//
// A user installs the product with `kubectl apply -k manifests/` and talks
// to it with `kubectl etcdbackup` exactly as on a real cluster: the request
// travels client → kube-apiserver (authn, RBAC, WebSocket→SPDY translation,
// upgrade-aware proxy) → kubelet streaming library → the Pod's network
// namespace. Tests can still run a process themselves and register it as a
// Pod (RunPod): such "hand-run" Pods are left alone by the node agent.
//
// Addresses: the API server and every component listen on 127.0.0.1 only.
// Service ClusterIPs come from 127.96.0.0/16 and Pod IPs from
// 10.244.0.0/16, but both exist only inside the Pods' own network
// namespaces: the node reaches a Pod at 127.0.0.1 inside its namespace, and
// Pods reach Services through the node agent's proxy. Nothing is ever sent
// to an address of the host's network.
package sandbox
