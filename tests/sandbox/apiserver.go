package sandbox

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"io"
	"path/filepath"
	"strconv"
)

// ServiceCIDR is the sandbox's Service ClusterIP range. It is a loopback
// range on purpose: ClusterIPs exist only inside Pod network namespaces
// (where all of 127.0.0.0/8 is local and the node agent's proxy listens on
// them), so no Service address is ever one of the host network's.
const ServiceCIDR = "127.96.0.0/16"

// kubernetesServiceIP is the first address of ServiceCIDR, the ClusterIP of
// the `kubernetes` Service, which in-cluster clients dial.
const kubernetesServiceIP = "127.96.0.1"

// apiserverProcess is a running kube-apiserver child process.
type apiserverProcess struct {
	*process
	url string
}

// apiserverArgs are the flags that make a real kube-apiserver serve on
// loopback only, trust the sandbox's CAs and reach the node endpoint.
func apiserverArgs(dir string, p *pki, etcdURL string, port int) []string {
	return []string{
		"--bind-address=127.0.0.1",
		"--secure-port=" + strconv.Itoa(port),
		"--cert-dir=" + filepath.Join(dir, "apiserver-certs"), // unused with explicit certs; keeps it out of /var/run
		"--tls-cert-file=" + p.apiserver.certFile,
		"--tls-private-key-file=" + p.apiserver.keyFile,
		"--client-ca-file=" + p.clientCA.certFile,
		"--etcd-servers=" + etcdURL,
		"--etcd-cafile=" + p.etcdCA.certFile,
		"--etcd-certfile=" + p.apiserverEtcd.certFile,
		"--etcd-keyfile=" + p.apiserverEtcd.keyFile,
		"--service-account-issuer=https://kubernetes.default.svc.cluster.local",
		"--service-account-key-file=" + p.saPubFile,
		"--service-account-signing-key-file=" + p.saKeyFile,
		"--service-cluster-ip-range=" + ServiceCIDR,
		"--authorization-mode=Node,RBAC",
		// As kubeadm: a node may only touch its own Node, Lease and Pods.
		"--enable-admission-plugins=NodeRestriction",
		// The kubelet connection: by the node's InternalIP (127.0.0.1), with
		// a client certificate the node endpoint checks, verifying the node
		// endpoint's serving certificate against the cluster CA.
		"--kubelet-preferred-address-types=InternalIP",
		"--kubelet-client-certificate=" + p.kubeletClient.certFile,
		"--kubelet-client-key=" + p.kubeletClient.keyFile,
		"--kubelet-certificate-authority=" + p.ca.certFile,
		// The aggregation layer's front proxy (kubeadm's flags).
		"--requestheader-client-ca-file=" + p.frontProxyCA.certFile,
		"--requestheader-allowed-names=front-proxy-client",
		"--requestheader-username-headers=X-Remote-User",
		"--requestheader-group-headers=X-Remote-Group",
		"--requestheader-extra-headers-prefix=X-Remote-Extra-",
		"--proxy-client-cert-file=" + p.frontProxyClient.certFile,
		"--proxy-client-key-file=" + p.frontProxyClient.keyFile,
		"--profiling=false",
		// --advertise-address=127.0.0.1 is refused unless the endpoint
		// reconciler is off; leaving it unset lets the apiserver pick the
		// host's address for the "kubernetes" Service's endpoints, which
		// nothing dials (the node agent's proxy sends that Service's traffic
		// to the loopback port instead).
		"--v=1",
	}
}

// adminTLS is the client TLS configuration of the sandbox admin, trusting
// the cluster CA: for polling health endpoints.
func adminTLS(p *pki) (*tls.Config, error) {
	cert, err := tls.X509KeyPair(p.admin.certPEM, p.admin.keyPEM)
	if err != nil {
		return nil, fmt.Errorf("admin cert: %w", err)
	}
	roots := x509.NewCertPool()
	roots.AddCert(p.ca.cert)
	return &tls.Config{RootCAs: roots, Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12}, nil
}

// startAPIServer runs kube-apiserver and waits until /readyz answers 200.
func startAPIServer(ctx context.Context, binary, dir string, p *pki, etcdURL string, logw io.Writer) (*apiserverProcess, error) {
	tlsConfig, err := adminTLS(p)
	if err != nil {
		return nil, err
	}
	proc, url, err := startComponent(ctx, component{
		name:   "kube-apiserver",
		binary: binary,
		dir:    dir,
		args:   func(port int) []string { return apiserverArgs(dir, p, etcdURL, port) },
		health: "/readyz",
		tls:    tlsConfig,
	}, logw)
	if err != nil {
		return nil, err
	}
	return &apiserverProcess{process: proc, url: url}, nil
}
