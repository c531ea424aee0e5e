// Package nodeagent is the sandbox's kubelet for this project's own images.
//
// It watches the Pods bound to its Node and runs every container whose image
// is one of the project's images (a table maps image name → a binary built
// from this repository) as a local process, the way a kubelet and a container
// runtime would:
//
//   - each Pod gets a network namespace of its own (only `lo`, up, with the
//     Pod IP and the whole Service range local to it), so two Pods listening
//     on the same port never collide, and a private hosts file in which the
//     names of the sandbox's Services resolve to their ClusterIPs;
//   - in each Pod's namespace an nftables rule sends connections to the
//     Service range to the agent's proxy (one listener per Pod, on
//     127.0.0.1:ProxyPort), which reads the original destination and
//     forwards to a ready endpoint: another Pod's namespace, a hand-run Pod's
//     process, or the API server for the `kubernetes` Service — so
//     in-cluster clients, client-go's in-cluster config included, work,
//     while containers keep every other port of their namespace;
//   - each container runs through a re-exec shim (this package's init hook
//     in whatever binary imports it) that joins the Pod's network namespace,
//     builds a root filesystem in a private mount namespace (host /usr and
//     /lib read-only, the binary at /<image name> as the image's entrypoint,
//     the Pod's volumes, hosts file and service-account token at their
//     standard paths), drops to the securityContext's user and groups and
//     execs the container's command;
//   - Secret, ConfigMap, downward API and projected volumes (the bound
//     service-account token included, refreshed like the kubelet does),
//     emptyDir and PersistentVolumeClaims backed by hostPath PVs (under the
//     node's root directory, so their data outlives the Pod);
//   - status as a kubelet reports it (Pending → Running, readiness from the
//     readiness probe, Succeeded/Failed with exit codes, restarts with
//     back-off per restartPolicy), events, graceful deletion, a node Lease;
//   - container logs in the CRI format, served with the kubelet's own reader
//     (k8s.io/cri-client/pkg/logs), and dialing into Pods for port-forward.
//
// A Pod whose image is not in the table stays Pending with an event that
// says so. Everything it opens is on loopback or inside namespaces it
// created itself; Stop kills every process it started and releases every
// namespace.
package nodeagent
