package nodeagent

import (
	"bytes"
	"fmt"
	"net/netip"

	corev1 "k8s.io/api/core/v1"
)

// ClusterDomain is the sandbox's cluster DNS domain.
const ClusterDomain = "cluster.local"

// podHostname is the Pod's hostname, as the kubelet picks it.
func podHostname(pod *corev1.Pod) string {
	h := pod.Spec.Hostname
	if h == "" {
		h = pod.Name
	}
	if len(h) > 63 {
		h = h[:63]
	}
	return h
}

// hostsFile is the Pod's /etc/hosts. The sandbox has no DNS server; instead
// every Service with a ClusterIP is listed under the names cluster DNS would
// give it (NAME.NS.svc.cluster.local, NAME.NS.svc, NAME.NS, and NAME in the
// Pod's own namespace). Go's resolver reads /etc/hosts before DNS, with the
// name as written, so these resolve without a search list.
func hostsFile(pod *corev1.Pod, podIP netip.Addr, svcs []*corev1.Service) []byte {
	var b bytes.Buffer
	b.WriteString("# Kubernetes-managed hosts file (sandbox node agent).\n")
	b.WriteString("127.0.0.1\tlocalhost\n")
	b.WriteString("::1\tlocalhost ip6-localhost ip6-loopback\n")
	if podIP.IsValid() {
		host := podHostname(pod)
		if pod.Spec.Subdomain != "" {
			fmt.Fprintf(&b, "%s\t%s.%s.%s.svc.%s\t%s\n", podIP, host, pod.Spec.Subdomain, pod.Namespace, ClusterDomain, host)
		} else {
			fmt.Fprintf(&b, "%s\t%s\n", podIP, host)
		}
	}
	b.WriteString("\n# Services (the sandbox's stand-in for cluster DNS)\n")
	for _, svc := range svcs {
		ip := svc.Spec.ClusterIP
		if ip == "" || ip == corev1.ClusterIPNone {
			continue
		}
		fmt.Fprintf(&b, "%s\t%s.%s.svc.%s %s.%s.svc %s.%s", ip, svc.Name, svc.Namespace, ClusterDomain, svc.Name, svc.Namespace, svc.Name, svc.Namespace)
		if svc.Namespace == pod.Namespace {
			fmt.Fprintf(&b, " %s", svc.Name)
		}
		b.WriteByte('\n')
	}
	return b.Bytes()
}

// resolvConf has the search path cluster DNS would give, and no name
// server: a name not in the hosts file fails at once instead of leaking to
// the host's resolver.
func resolvConf(ns string) []byte {
	return fmt.Appendf(nil, "search %s.svc.%s svc.%s %s\noptions ndots:5\n", ns, ClusterDomain, ClusterDomain, ClusterDomain)
}

func sortedStrings(s []string) []string {
	out := append([]string(nil), s...)
	for i := 1; i < len(out); i++ {
		for j := i; j > 0 && out[j] < out[j-1]; j-- {
			out[j], out[j-1] = out[j-1], out[j]
		}
	}
	return out
}
