package sandbox

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"io"
	"net"
	"path/filepath"
	"strconv"
	"strings"
	"time"
)

// apiserverProcess is a running kube-apiserver child process.
type apiserverProcess struct {
	*process
	url  string
	port int
}

// apiserverArgs are the flags that make a real kube-apiserver serve on the
// host end of the node's veth only (the node and its pods reach it there;
// the host too), trust the sandbox's CAs and reach the kubelet.
func apiserverArgs(dir string, p *pki, etcdURL string, port int) []string {
	return []string{
		"--bind-address=" + HostIP,
		"--advertise-address=" + HostIP,
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
		// Secrets encrypted at rest (aescbc), as on-prem clusters keep
		// them: a backup holds them encrypted.
		"--encryption-provider-config=" + p.encryptionConfigFile,
		"--authorization-mode=Node,RBAC",
		// As kubeadm: a node may only touch its own Node, Lease and Pods.
		"--enable-admission-plugins=NodeRestriction",
		// The kubelet connection: by the node's InternalIP, with a client
		// certificate the kubelet checks against the client CA (then
		// authorizes with a SubjectAccessReview), verifying the kubelet's
		// serving certificate against the cluster CA.
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
		// On SIGTERM, refuse new requests with 429 and Retry-After until
		// those in flight are done, then give the HTTP server 2 s (not
		// --request-timeout's 60 s) to close the connections: the node's
		// watches, which keep it busy, end at once, and StopControlPlane
		// returns in a second or two instead of at the SIGKILL.
		"--shutdown-send-retry-after=true",
		"--profiling=false",
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

// startAPIServer runs kube-apiserver on port (0: a free one) and waits
// until /readyz answers 200.
func startAPIServer(ctx context.Context, binary, dir string, p *pki, etcdURL string, port int, logw io.Writer) (*apiserverProcess, error) {
	tlsConfig, err := adminTLS(p)
	if err != nil {
		return nil, err
	}
	proc, url, err := startComponent(ctx, component{
		name:   "kube-apiserver",
		host:   HostIP,
		port:   port,
		binary: binary,
		dir:    dir,
		args:   func(port int) []string { return apiserverArgs(dir, p, etcdURL, port) },
		health: "/readyz",
		tls:    tlsConfig,
	}, logw)
	if err != nil {
		return nil, err
	}
	_, portStr, err := net.SplitHostPort(strings.TrimPrefix(url, "https://"))
	if err == nil {
		port, err = strconv.Atoi(portStr)
	}
	if err != nil {
		_ = proc.stop(15 * time.Second)
		return nil, fmt.Errorf("kube-apiserver URL %s: %w", url, err)
	}
	return &apiserverProcess{process: proc, url: url, port: port}, nil
}
