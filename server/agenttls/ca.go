// Package agenttls secures the agent port: the server keeps a CA of its
// own in a Secret of its namespace (created on first start, read after),
// issues itself a serving certificate for the names agents dial at every
// start, and publishes the CA certificate (never its key) in a ConfigMap
// of each namespace agents run in, which agent Jobs mount to verify the
// server.
package agenttls

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"net"
	"slices"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/api/agentjob"
)

// Names of the objects, and the keys in them.
const (
	// SecretName holds the CA's certificate and key in the server's
	// namespace.
	SecretName = agentjob.AgentCASecret
	// ConfigMapName holds the CA's certificate (CertKey) in every
	// namespace agents run in.
	ConfigMapName = "etcdbackup-agent-ca"
	// CertKey and KeyKey are the PEM certificate and key.
	CertKey = "ca.crt"
	KeyKey  = "ca.key"
	// ServiceName is the Service agents reach the server by.
	ServiceName = "etcdbackup"
)

// Validity of what the server makes.
const (
	// CAValidity: rotate by deleting the Secret and restarting the server.
	CAValidity = 10 * 365 * 24 * time.Hour
	// ServingValidity: the serving certificate is issued at every start
	// and again while the server runs, once two thirds of it have passed
	// (RenewingServerConfig).
	ServingValidity = 365 * 24 * time.Hour
)

var labels = map[string]string{"app.kubernetes.io/name": "etcdbackup-server"}

// CA is the agent port's certificate authority.
type CA struct {
	Cert *x509.Certificate
	// CertPEM is what agents trust.
	CertPEM []byte
	key     *ecdsa.PrivateKey
}

// EnsureCA reads the CA from Secret SecretName in namespace, creating it
// (ECDSA P-256) if it does not exist. Two servers starting at once agree:
// the loser of the create reads the winner's.
func EnsureCA(ctx context.Context, client kubernetes.Interface, namespace string, now time.Time) (*CA, error) {
	secrets := client.CoreV1().Secrets(namespace)
	s, err := secrets.Get(ctx, SecretName, metav1.GetOptions{})
	if err == nil {
		return parseCA(s)
	}
	if !apierrors.IsNotFound(err) {
		return nil, fmt.Errorf("agent CA: read Secret %s/%s: %w", namespace, SecretName, err)
	}
	ca, keyPEM, err := newCA(namespace, now)
	if err != nil {
		return nil, err
	}
	s = &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Name: SecretName, Namespace: namespace, Labels: labels},
		Type:       corev1.SecretTypeOpaque,
		Data:       map[string][]byte{CertKey: ca.CertPEM, KeyKey: keyPEM},
	}
	_, err = secrets.Create(ctx, s, metav1.CreateOptions{})
	if apierrors.IsAlreadyExists(err) {
		theirs, err := secrets.Get(ctx, SecretName, metav1.GetOptions{})
		if err != nil {
			return nil, fmt.Errorf("agent CA: read Secret %s/%s: %w", namespace, SecretName, err)
		}
		return parseCA(theirs)
	}
	if err != nil {
		return nil, fmt.Errorf("agent CA: create Secret %s/%s: %w", namespace, SecretName, err)
	}
	return ca, nil
}

func newCA(namespace string, now time.Time) (*CA, []byte, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, fmt.Errorf("agent CA: generate key: %w", err)
	}
	tmpl := &x509.Certificate{
		SerialNumber:          serial(),
		Subject:               pkix.Name{CommonName: "etcdbackup agent CA (" + namespace + ")"},
		NotBefore:             now.Add(-time.Hour),
		NotAfter:              now.Add(CAValidity),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign | x509.KeyUsageDigitalSignature,
		BasicConstraintsValid: true,
		IsCA:                  true,
		MaxPathLenZero:        true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return nil, nil, fmt.Errorf("agent CA: self-sign: %w", err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, nil, fmt.Errorf("agent CA: %w", err)
	}
	kder, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return nil, nil, fmt.Errorf("agent CA: encode key: %w", err)
	}
	return &CA{Cert: cert, CertPEM: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), key: key},
		pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kder}), nil
}

// parseCA reads a CA Secret. Its errors never quote the key.
func parseCA(s *corev1.Secret) (*CA, error) {
	where := fmt.Sprintf("agent CA: Secret %s/%s", s.Namespace, s.Name)
	cb, _ := pem.Decode(s.Data[CertKey])
	if cb == nil || cb.Type != "CERTIFICATE" {
		return nil, fmt.Errorf("%s: %s is not a PEM certificate; delete the Secret and restart the server to make a new CA", where, CertKey)
	}
	cert, err := x509.ParseCertificate(cb.Bytes)
	if err != nil {
		return nil, fmt.Errorf("%s: %s: %w", where, CertKey, err)
	}
	kb, _ := pem.Decode(s.Data[KeyKey])
	if kb == nil {
		return nil, fmt.Errorf("%s: %s is not a PEM key; delete the Secret and restart the server to make a new CA", where, KeyKey)
	}
	key, err := x509.ParseECPrivateKey(kb.Bytes)
	if err != nil {
		return nil, fmt.Errorf("%s: %s is not an EC private key", where, KeyKey)
	}
	pub, ok := cert.PublicKey.(*ecdsa.PublicKey)
	if !ok || !pub.Equal(&key.PublicKey) || !cert.IsCA {
		return nil, fmt.Errorf("%s: the key does not match the CA certificate; delete the Secret and restart the server", where)
	}
	return &CA{Cert: cert, CertPEM: pem.EncodeToMemory(cb), key: key}, nil
}

func serial() *big.Int {
	n, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	if err != nil {
		panic(err) // crypto/rand does not fail
	}
	return n
}

// ServerNames are the DNS names of the server's Service in namespace, as
// agents may dial it.
func ServerNames(namespace string) []string {
	return []string{
		ServiceName,
		ServiceName + "." + namespace,
		ServiceName + "." + namespace + ".svc",
		ServiceName + "." + namespace + ".svc.cluster.local",
	}
}

// HostsFor returns ServerNames plus the host of each address (HOST:PORT
// or HOST) agents are told to dial, DNS names and IPs apart.
func HostsFor(namespace string, addrs ...string) (dns []string, ips []net.IP) {
	dns = ServerNames(namespace)
	for _, a := range addrs {
		host, _, err := net.SplitHostPort(a)
		if err != nil {
			host = a
		}
		if host == "" {
			continue
		}
		if ip := net.ParseIP(host); ip != nil {
			ips = append(ips, ip)
		} else if !slices.Contains(dns, host) {
			dns = append(dns, host)
		}
	}
	return dns, ips
}

// ServingCert issues a serving certificate for dns and ips, valid for
// ServingValidity from now, with a fresh ECDSA P-256 key that never
// leaves the process.
func (ca *CA) ServingCert(dns []string, ips []net.IP, now time.Time) (tls.Certificate, error) {
	if len(dns) == 0 && len(ips) == 0 {
		return tls.Certificate{}, errors.New("agent TLS: no name to issue a serving certificate for")
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return tls.Certificate{}, fmt.Errorf("agent TLS: generate key: %w", err)
	}
	notAfter := now.Add(ServingValidity)
	if notAfter.After(ca.Cert.NotAfter) {
		notAfter = ca.Cert.NotAfter
	}
	tmpl := &x509.Certificate{
		SerialNumber: serial(),
		Subject:      pkix.Name{CommonName: firstOr(dns, "etcdbackup")},
		NotBefore:    now.Add(-time.Hour),
		NotAfter:     notAfter,
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		DNSNames:     dns,
		IPAddresses:  ips,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.Cert, &key.PublicKey, ca.key)
	if err != nil {
		return tls.Certificate{}, fmt.Errorf("agent TLS: issue the serving certificate: %w", err)
	}
	leaf, err := x509.ParseCertificate(der)
	if err != nil {
		return tls.Certificate{}, fmt.Errorf("agent TLS: %w", err)
	}
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key, Leaf: leaf}, nil
}

func firstOr(s []string, def string) string {
	if len(s) > 0 {
		return s[0]
	}
	return def
}

// ServerConfig is the agent listener's TLS configuration: TLS 1.3 only,
// the serving certificate, ALPN h2 (gRPC's).
func ServerConfig(cert tls.Certificate) *tls.Config {
	return &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS13, NextProtos: []string{"h2"}}
}

// RenewingServerConfig is ServerConfig for a server that runs longer
// than ServingValidity: each handshake gets the current certificate,
// issued anew for dns and ips once two thirds of its validity have
// passed (now is the clock). When issuing fails the one in force is kept
// while it is valid. Certificates holds the first, for Describe.
func (ca *CA) RenewingServerConfig(first tls.Certificate, dns []string, ips []net.IP, now func() time.Time) *tls.Config {
	cfg, _ := ca.renewingServerConfig(first, dns, ips, now)
	return cfg
}

func (ca *CA) renewingServerConfig(first tls.Certificate, dns []string, ips []net.IP, now func() time.Time) (*tls.Config, *renewing) {
	r := &renewing{ca: ca, dns: dns, ips: ips, now: now, cur: &first}
	cfg := ServerConfig(first)
	cfg.GetCertificate = r.get
	return cfg, r
}

// renewing is the serving certificate in force, renewed on demand.
type renewing struct {
	ca  *CA
	dns []string
	ips []net.IP
	now func() time.Time

	mu  sync.Mutex
	cur *tls.Certificate
}

func (r *renewing) get(*tls.ClientHelloInfo) (*tls.Certificate, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	now, leaf := r.now(), r.cur.Leaf
	if now.Before(leaf.NotBefore.Add(2 * leaf.NotAfter.Sub(leaf.NotBefore) / 3)) {
		return r.cur, nil
	}
	next, err := r.ca.ServingCert(r.dns, r.ips, now)
	if err != nil {
		if now.Before(leaf.NotAfter) {
			return r.cur, nil // still valid; the next handshake tries again
		}
		return nil, fmt.Errorf("agent TLS: the serving certificate expired at %s and a new one could not be issued: %w", leaf.NotAfter.UTC().Format(time.RFC3339), err)
	}
	r.cur = &next
	return r.cur, nil
}

// Pool is a certificate pool of the CA alone.
func (ca *CA) Pool() *x509.CertPool {
	p := x509.NewCertPool()
	p.AddCert(ca.Cert)
	return p
}

// Publish writes the CA certificate into ConfigMap ConfigMapName of
// namespace, creating it or updating it when it differs.
func Publish(ctx context.Context, client kubernetes.Interface, namespace string, certPEM []byte) error {
	cms := client.CoreV1().ConfigMaps(namespace)
	cm, err := cms.Get(ctx, ConfigMapName, metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err):
		_, err = cms.Create(ctx, &corev1.ConfigMap{
			ObjectMeta: metav1.ObjectMeta{Name: ConfigMapName, Namespace: namespace, Labels: labels},
			Data:       map[string]string{CertKey: string(certPEM)},
		}, metav1.CreateOptions{})
		if err != nil && !apierrors.IsAlreadyExists(err) {
			return fmt.Errorf("publish the agent CA: create ConfigMap %s/%s: %w", namespace, ConfigMapName, err)
		}
		if err == nil {
			return nil
		}
		// Created meanwhile: compare and update below.
		if cm, err = cms.Get(ctx, ConfigMapName, metav1.GetOptions{}); err != nil {
			return fmt.Errorf("publish the agent CA: read ConfigMap %s/%s: %w", namespace, ConfigMapName, err)
		}
	case err != nil:
		return fmt.Errorf("publish the agent CA: read ConfigMap %s/%s: %w", namespace, ConfigMapName, err)
	}
	if bytes.Equal([]byte(cm.Data[CertKey]), certPEM) {
		return nil
	}
	cm = cm.DeepCopy()
	if cm.Data == nil {
		cm.Data = map[string]string{}
	}
	cm.Data[CertKey] = string(certPEM)
	if _, err := cms.Update(ctx, cm, metav1.UpdateOptions{}); err != nil {
		return fmt.Errorf("publish the agent CA: update ConfigMap %s/%s: %w", namespace, ConfigMapName, err)
	}
	return nil
}
