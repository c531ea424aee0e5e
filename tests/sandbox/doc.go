// Package sandbox starts a small real Kubernetes control plane on loopback for tests and demos.
//
// Everything is real and runs without Docker, bound to 127.0.0.1 only, on
// free ports:
//
//   - etcd, in-process (go.etcd.io/etcd/server/v3/embed);
//   - the real kube-apiserver binary, built from k8s.io/kubernetes by
//     hack/build-kube.sh (make kube-bins);
//   - a "node endpoint": the kubelet's port-forward streaming server
//     (k8s.io/cri-streaming) behind HTTPS, registered as the kubelet endpoint
//     of a Node object, which forwards each pod port to a local TCP address.
//
// No scheduler, controller-manager or kubelet runs: the sandbox writes the
// objects they would (Node status, Pod status, ServiceAccount "default")
// itself. A port-forward request therefore travels the same path as in a real
// cluster — client → kube-apiserver (authn, RBAC, WebSocket→SPDY translation,
// upgrade-aware proxy) → kubelet streaming library → target — which is what
// the plugin's tunnel has to survive.
package sandbox
