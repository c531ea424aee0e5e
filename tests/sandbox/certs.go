package sandbox

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/base64"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"time"
)

// certValidity is long enough for a demo sandbox left running for days, and
// irrelevant for tests: every Start makes new throwaway keys.
const certValidity = 30 * 24 * time.Hour

// keyPair is a certificate with its private key, in memory and on disk.
type keyPair struct {
	cert     *x509.Certificate
	key      *ecdsa.PrivateKey
	certPEM  []byte
	keyPEM   []byte
	certFile string
	keyFile  string
}

// pki holds every certificate and key the sandbox needs. Two CAs are kept
// apart on purpose, as in kubeadm: the cluster CA signs serving certificates
// (apiserver, kubelet) and the client CA signs client certificates
// (admin, users, the apiserver's kubelet client), so a test can tell a trust
// mistake from a working setup.
type pki struct {
	dir string

	ca       *keyPair // cluster CA: serving certs
	clientCA *keyPair // client CA: client certs

	apiserver     *keyPair // kube-apiserver serving cert
	admin         *keyPair // CN=sandbox-admin, O=system:masters
	kubeletClient *keyPair // apiserver → kubelet client cert
	node          *keyPair // kubelet serving cert

	controllerManager *keyPair // CN=system:kube-controller-manager
	scheduler         *keyPair // CN=system:kube-scheduler
	nodeClient        *keyPair // the kubelet: CN=system:node:NODE, O=system:nodes
	kubeProxy         *keyPair // kube-proxy: CN=system:kube-proxy
	controlPlane      *keyPair // serving cert of the controller-manager and scheduler

	// The aggregation layer's front proxy, as kubeadm sets it up: the
	// controllers read its CA from extension-apiserver-authentication and
	// complain without one.
	frontProxyCA     *keyPair
	frontProxyClient *keyPair

	// etcd, as kubeadm sets it up: its own CA, a serving certificate, and
	// client certificates for the API server and for backups.
	etcdCA           *keyPair
	etcdServer       *keyPair
	apiserverEtcd    *keyPair // CN=kube-apiserver-etcd-client
	etcdBackupClient *keyPair // CN=etcdbackup: what the etcd-client Secret holds

	saKeyFile string // service-account signing key (private)
	saPubFile string // service-account verification key (public)

	// encryptionConfigFile is the API server's EncryptionConfiguration:
	// Secrets encrypted at rest with aescbc, as on-prem clusters do.
	encryptionConfigFile string
}

// newPKI generates the sandbox's certificates and writes them under dir.
func newPKI(dir string) (*pki, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("create pki dir: %w", err)
	}
	p := &pki{dir: dir}
	var err error
	if p.ca, err = p.newCA("ca", "sandbox-cluster-ca"); err != nil {
		return nil, err
	}
	if p.clientCA, err = p.newCA("client-ca", "sandbox-client-ca"); err != nil {
		return nil, err
	}
	loopback := []net.IP{net.IPv4(127, 0, 0, 1)}
	hostIP := net.ParseIP(HostIP)
	// The host and the node reach the API server at the host end of the
	// veth; in-cluster clients at the `kubernetes` Service's ClusterIP and
	// names.
	if p.apiserver, err = p.issue("apiserver", p.ca, certRequest{
		commonName: "kube-apiserver",
		dnsNames:   []string{"localhost", "kubernetes", "kubernetes.default", "kubernetes.default.svc", "kubernetes.default.svc.cluster.local"},
		ips:        append(loopback, hostIP, net.ParseIP(kubernetesServiceIP)),
		usage:      x509.ExtKeyUsageServerAuth,
	}); err != nil {
		return nil, err
	}
	// The identities RBAC's bootstrap roles and the Node authorizer know.
	for _, id := range []struct {
		kp   **keyPair
		name string
		req  certRequest
	}{
		{&p.controllerManager, "kube-controller-manager", certRequest{commonName: "system:kube-controller-manager"}},
		{&p.scheduler, "kube-scheduler", certRequest{commonName: "system:kube-scheduler"}},
		{&p.kubeProxy, "kube-proxy", certRequest{commonName: "system:kube-proxy"}},
	} {
		id.req.usage = x509.ExtKeyUsageClientAuth
		if *id.kp, err = p.issue(id.name, p.clientCA, id.req); err != nil {
			return nil, err
		}
	}
	if p.etcdCA, err = p.newCA("etcd-ca", "sandbox-etcd-ca"); err != nil {
		return nil, err
	}
	if p.etcdServer, err = p.issue("etcd-server", p.etcdCA, certRequest{
		commonName: "etcd",
		// Pods reach it through the kube-system/etcd Service.
		dnsNames: []string{"localhost", "etcd.kube-system.svc", "etcd.kube-system.svc.cluster.local"},
		ips:      append(loopback, hostIP),
		usage:    x509.ExtKeyUsageServerAuth,
	}); err != nil {
		return nil, err
	}
	if p.apiserverEtcd, err = p.issue("apiserver-etcd-client", p.etcdCA, certRequest{
		commonName: "kube-apiserver-etcd-client", usage: x509.ExtKeyUsageClientAuth,
	}); err != nil {
		return nil, err
	}
	if p.etcdBackupClient, err = p.issue("etcd-backup-client", p.etcdCA, certRequest{
		commonName: "etcdbackup", usage: x509.ExtKeyUsageClientAuth,
	}); err != nil {
		return nil, err
	}
	if p.frontProxyCA, err = p.newCA("front-proxy-ca", "sandbox-front-proxy-ca"); err != nil {
		return nil, err
	}
	if p.frontProxyClient, err = p.issue("front-proxy-client", p.frontProxyCA, certRequest{
		commonName: "front-proxy-client",
		usage:      x509.ExtKeyUsageClientAuth,
	}); err != nil {
		return nil, err
	}
	if p.controlPlane, err = p.issue("control-plane-serving", p.ca, certRequest{
		commonName: "sandbox-control-plane",
		dnsNames:   []string{"localhost"},
		ips:        loopback,
		usage:      x509.ExtKeyUsageServerAuth,
	}); err != nil {
		return nil, err
	}
	if p.admin, err = p.issue("admin", p.clientCA, certRequest{
		commonName:    "sandbox-admin",
		organizations: []string{"system:masters"},
		usage:         x509.ExtKeyUsageClientAuth,
	}); err != nil {
		return nil, err
	}
	// The apiserver authenticates to kubelets with this one; system:masters
	// mirrors what kubeadm uses: the kubelet authorizes it with a
	// SubjectAccessReview.
	if p.kubeletClient, err = p.issue("apiserver-kubelet-client", p.clientCA, certRequest{
		commonName:    "kube-apiserver-kubelet-client",
		organizations: []string{"system:masters"},
		usage:         x509.ExtKeyUsageClientAuth,
	}); err != nil {
		return nil, err
	}
	if p.node, p.nodeClient, err = p.nodeCerts(nodeSpecs[0]); err != nil {
		return nil, err
	}
	if err := p.newServiceAccountKey(); err != nil {
		return nil, err
	}
	if err := p.newEncryptionConfig(); err != nil {
		return nil, err
	}
	return p, nil
}

// EncryptionKeyName is the name of the aescbc key the sandbox's API
// server encrypts Secrets with: they are stored as
// "k8s:enc:aescbc:v1:sandbox-1:…".
const EncryptionKeyName = "sandbox-1"

// newEncryptionConfig writes an EncryptionConfiguration with a new
// random aescbc key for Secrets beside the PKI, in enc/ (kubeadm leaves
// the place to the operator; /etc/kubernetes/enc/ is the usual one).
func (p *pki) newEncryptionConfig() error {
	key := make([]byte, 32)
	if _, err := rand.Read(key); err != nil {
		return fmt.Errorf("generate the encryption key: %w", err)
	}
	dir := filepath.Join(filepath.Dir(p.dir), "enc")
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("create %s: %w", dir, err)
	}
	p.encryptionConfigFile = filepath.Join(dir, "encryption-config.yaml")
	config := fmt.Sprintf(`apiVersion: apiserver.config.k8s.io/v1
kind: EncryptionConfiguration
resources:
- resources: [secrets]
  providers:
  - aescbc:
      keys:
      - name: %s
        secret: %s
  - identity: {}
`, EncryptionKeyName, base64.StdEncoding.EncodeToString(key))
	if err := os.WriteFile(p.encryptionConfigFile, []byte(config), 0o600); err != nil {
		return fmt.Errorf("write the encryption configuration: %w", err)
	}
	return nil
}

// nodeCerts issues a node's kubelet certificates: its serving certificate
// (the API server reaches the kubelet by the node's InternalIP and checks
// it against --kubelet-certificate-authority) and its client certificate,
// the identity RBAC's system:nodes and the Node authorizer know, each node
// its own as NodeRestriction requires. Node 0's files are node.crt and
// node-client.crt, node 2's node-2.crt and node-2-client.crt.
func (p *pki) nodeCerts(sp nodeSpec) (serving, client *keyPair, err error) {
	if serving, err = p.issue("node"+sp.suffix, p.ca, certRequest{
		commonName: "system:node:" + sp.name,
		dnsNames:   []string{sp.name, "localhost"},
		ips:        []net.IP{net.ParseIP(sp.ip)},
		usage:      x509.ExtKeyUsageServerAuth,
	}); err != nil {
		return nil, nil, err
	}
	if client, err = p.issue("node"+sp.suffix+"-client", p.clientCA, certRequest{
		commonName:    "system:node:" + sp.name,
		organizations: []string{"system:nodes"},
		usage:         x509.ExtKeyUsageClientAuth,
	}); err != nil {
		return nil, nil, err
	}
	return serving, client, nil
}

type certRequest struct {
	commonName    string
	organizations []string
	dnsNames      []string
	ips           []net.IP
	usage         x509.ExtKeyUsage
}

func (p *pki) newCA(name, commonName string) (*keyPair, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("generate %s key: %w", name, err)
	}
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber:          newSerial(),
		Subject:               pkix.Name{CommonName: commonName},
		NotBefore:             now.Add(-time.Hour), // tolerate small clock skew
		NotAfter:              now.Add(certValidity),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign | x509.KeyUsageDigitalSignature,
		BasicConstraintsValid: true,
		IsCA:                  true,
		MaxPathLenZero:        true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, key.Public(), key)
	if err != nil {
		return nil, fmt.Errorf("self-sign %s: %w", name, err)
	}
	return p.save(name, der, key)
}

func (p *pki) issue(name string, ca *keyPair, req certRequest) (*keyPair, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("generate %s key: %w", name, err)
	}
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber: newSerial(),
		Subject:      pkix.Name{CommonName: req.commonName, Organization: req.organizations},
		NotBefore:    now.Add(-time.Hour),
		NotAfter:     now.Add(certValidity),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{req.usage},
		DNSNames:     req.dnsNames,
		IPAddresses:  req.ips,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, key.Public(), ca.key)
	if err != nil {
		return nil, fmt.Errorf("sign %s: %w", name, err)
	}
	return p.save(name, der, key)
}

func (p *pki) save(name string, der []byte, key *ecdsa.PrivateKey) (*keyPair, error) {
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, fmt.Errorf("parse %s cert: %w", name, err)
	}
	keyPEM, err := encodeECKey(key)
	if err != nil {
		return nil, fmt.Errorf("encode %s key: %w", name, err)
	}
	kp := &keyPair{
		cert:     cert,
		key:      key,
		certPEM:  pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}),
		keyPEM:   keyPEM,
		certFile: filepath.Join(p.dir, name+".crt"),
		keyFile:  filepath.Join(p.dir, name+".key"),
	}
	if err := os.WriteFile(kp.certFile, kp.certPEM, 0o644); err != nil {
		return nil, fmt.Errorf("write %s cert: %w", name, err)
	}
	if err := os.WriteFile(kp.keyFile, kp.keyPEM, 0o600); err != nil {
		return nil, fmt.Errorf("write %s key: %w", name, err)
	}
	return kp, nil
}

// newServiceAccountKey writes the key pair the apiserver signs and verifies
// service-account tokens with (ES256).
func (p *pki) newServiceAccountKey() error {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return fmt.Errorf("generate service-account key: %w", err)
	}
	keyPEM, err := encodeECKey(key)
	if err != nil {
		return fmt.Errorf("encode service-account key: %w", err)
	}
	pubDER, err := x509.MarshalPKIXPublicKey(key.Public())
	if err != nil {
		return fmt.Errorf("encode service-account public key: %w", err)
	}
	p.saKeyFile = filepath.Join(p.dir, "sa.key")
	p.saPubFile = filepath.Join(p.dir, "sa.pub")
	if err := os.WriteFile(p.saKeyFile, keyPEM, 0o600); err != nil {
		return fmt.Errorf("write service-account key: %w", err)
	}
	if err := os.WriteFile(p.saPubFile, pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: pubDER}), 0o644); err != nil {
		return fmt.Errorf("write service-account public key: %w", err)
	}
	return nil
}

// newClientCert signs a client certificate (CN=user, O=groups) with the
// client CA, in memory only; the caller embeds it in a kubeconfig.
func (p *pki) newClientCert(user string, groups []string) (certPEM, keyPEM []byte, err error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, fmt.Errorf("generate key for %q: %w", user, err)
	}
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber: newSerial(),
		Subject:      pkix.Name{CommonName: user, Organization: groups},
		NotBefore:    now.Add(-time.Hour),
		NotAfter:     now.Add(certValidity),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, p.clientCA.cert, key.Public(), p.clientCA.key)
	if err != nil {
		return nil, nil, fmt.Errorf("sign client cert for %q: %w", user, err)
	}
	keyPEM, err = encodeECKey(key)
	if err != nil {
		return nil, nil, fmt.Errorf("encode key for %q: %w", user, err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), keyPEM, nil
}

func encodeECKey(key *ecdsa.PrivateKey) ([]byte, error) {
	der, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return nil, err
	}
	return pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: der}), nil
}

func newSerial() *big.Int {
	// 128 random bits: unique enough that no two sandbox certs ever collide.
	n, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 128))
	if err != nil {
		// crypto/rand does not fail on Linux; a constant serial would still
		// produce a usable (if unusual) certificate.
		return big.NewInt(1)
	}
	return n
}
