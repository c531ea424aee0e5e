package agenttls_test

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"net"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/server/agenttls"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/snapshot"
)

const ns = "etcdbackup-system"

// The CA is made once and kept: a restarted server reads the same one, so
// agents started before the restart still verify it.
func TestCAIsCreatedOnceAndReused(t *testing.T) {
	ctx := context.Background()
	cs := fake.NewClientset()
	now := time.Now()
	first, err := agenttls.EnsureCA(ctx, cs, ns, now)
	if err != nil {
		t.Fatal(err)
	}
	s, err := cs.CoreV1().Secrets(ns).Get(ctx, agenttls.SecretName, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if len(s.Data[agenttls.CertKey]) == 0 || len(s.Data[agenttls.KeyKey]) == 0 {
		t.Fatalf("Secret keys %v", keys(s.Data))
	}
	if !first.Cert.IsCA || first.Cert.NotAfter.Sub(now) < 5*365*24*time.Hour {
		t.Fatalf("CA %v until %s", first.Cert.IsCA, first.Cert.NotAfter)
	}
	again, err := agenttls.EnsureCA(ctx, cs, ns, now.Add(time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	if !again.Cert.Equal(first.Cert) || string(again.CertPEM) != string(first.CertPEM) {
		t.Fatal("a restart made a new CA")
	}
	// What the restarted server issues verifies with the first CA.
	cert, err := again.ServingCert(agenttls.ServerNames(ns), nil, now)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := cert.Leaf.Verify(x509.VerifyOptions{Roots: first.Pool(), DNSName: "etcdbackup." + ns + ".svc"}); err != nil {
		t.Fatal(err)
	}
}

func TestDamagedCASecretIsRefused(t *testing.T) {
	cs := fake.NewClientset(&corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: agenttls.SecretName},
		Data:       map[string][]byte{agenttls.CertKey: []byte("junk"), agenttls.KeyKey: []byte("secret-key-material")},
	})
	_, err := agenttls.EnsureCA(context.Background(), cs, ns, time.Now())
	if err == nil || !strings.Contains(err.Error(), "delete the Secret") {
		t.Fatalf("damaged Secret: %v", err)
	}
	if strings.Contains(err.Error(), "secret-key-material") {
		t.Fatalf("the error shows the key: %v", err)
	}
}

// The serving certificate holds every name agents may dial — the
// Service's names and agents.serverAddress's host, an IP as an IP SAN.
func TestServingCertCoversTheNamesAgentsDial(t *testing.T) {
	ca, err := agenttls.EnsureCA(context.Background(), fake.NewClientset(), ns, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	dns, ips := agenttls.HostsFor(ns, "etcdbackup."+ns+".svc:50052", "10.96.0.42:50052", "backup.example:443")
	cert, err := ca.ServingCert(dns, ips, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{
		"etcdbackup", "etcdbackup." + ns, "etcdbackup." + ns + ".svc", "etcdbackup." + ns + ".svc.cluster.local", "backup.example", "10.96.0.42",
	} {
		if _, err := cert.Leaf.Verify(x509.VerifyOptions{Roots: ca.Pool(), DNSName: name}); err != nil {
			t.Errorf("%s: %v", name, err)
		}
	}
	if _, err := cert.Leaf.Verify(x509.VerifyOptions{Roots: ca.Pool(), DNSName: "etcdbackup.other.svc"}); err == nil {
		t.Error("the certificate holds another namespace's name")
	}
	if cert.Leaf.NotAfter.After(time.Now().Add(agenttls.ServingValidity + time.Minute)) {
		t.Errorf("serving certificate valid until %s", cert.Leaf.NotAfter)
	}
}

// A TLS client with the CA and the Service's name connects; with another
// CA, or another name, it does not.
func TestHandshake(t *testing.T) {
	ctx := context.Background()
	ca, err := agenttls.EnsureCA(ctx, fake.NewClientset(), ns, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	other, err := agenttls.EnsureCA(ctx, fake.NewClientset(), ns, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	cert, err := ca.ServingCert(agenttls.ServerNames(ns), nil, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	lis, err := tls.Listen("tcp", "127.0.0.1:0", agenttls.ServerConfig(cert))
	if err != nil {
		t.Fatal(err)
	}
	defer lis.Close()
	go func() {
		for {
			c, err := lis.Accept()
			if err != nil {
				return
			}
			_ = c.(*tls.Conn).Handshake()
			c.Close()
		}
	}()
	dial := func(pool *x509.CertPool, name string) error {
		c, err := tls.DialWithDialer(&net.Dialer{Timeout: 5 * time.Second}, "tcp", lis.Addr().String(), &tls.Config{RootCAs: pool, ServerName: name, NextProtos: []string{"h2"}})
		if err == nil {
			c.Close()
		}
		return err
	}
	if err := dial(ca.Pool(), "etcdbackup."+ns+".svc"); err != nil {
		t.Fatal(err)
	}
	if err := dial(other.Pool(), "etcdbackup."+ns+".svc"); err == nil {
		t.Fatal("a client trusting another CA connected")
	}
	if err := dial(ca.Pool(), "intruder.example"); err == nil {
		t.Fatal("the certificate verified for a name it does not hold")
	}
}

// The CA certificate, never its key, reaches every agent namespace; a
// changed CA updates the ConfigMap.
func TestPublish(t *testing.T) {
	ctx := context.Background()
	cs := fake.NewClientset()
	if _, err := cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "app"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	_, current, err := agenttls.Setup(ctx, agenttls.Options{Client: cs, Namespace: ns, AgentNamespaces: []string{"app", ns}})
	if err != nil {
		t.Fatal(err)
	}
	ca := current.CA()
	for _, n := range []string{ns, "app"} {
		cm, err := cs.CoreV1().ConfigMaps(n).Get(ctx, agenttls.ConfigMapName, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if cm.Data[agenttls.CertKey] != string(ca.CertPEM) || len(cm.Data) != 1 || strings.Contains(cm.Data[agenttls.CertKey], "PRIVATE") {
			t.Fatalf("ConfigMap in %s: %v", n, keys(cm.Data))
		}
	}
	if err := agenttls.Publish(ctx, cs, "app", []byte("rotated")); err != nil {
		t.Fatal(err)
	}
	cm, err := cs.CoreV1().ConfigMaps("app").Get(ctx, agenttls.ConfigMapName, metav1.GetOptions{})
	if err != nil || cm.Data[agenttls.CertKey] != "rotated" {
		t.Fatalf("after rotation: %v %v", cm, err)
	}
}

func keys[V any](m map[string]V) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	return out
}

// The serving certificate is renewed while the server runs: a handshake
// after two thirds of its validity gets a new one, valid for as long
// again, for the same names; before that, the same one (issue 37).
func TestServingCertIsRenewedWhileTheServerRuns(t *testing.T) {
	ctx := context.Background()
	start := time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC)
	ca, err := agenttls.EnsureCA(ctx, fake.NewClientset(), ns, start)
	if err != nil {
		t.Fatal(err)
	}
	names := agenttls.ServerNames(ns)
	first, err := ca.ServingCert(names, nil, start)
	if err != nil {
		t.Fatal(err)
	}
	now := start
	cfg := ca.RenewingServerConfig(first, names, nil, func() time.Time { return now })
	served := func() *x509.Certificate {
		t.Helper()
		c, err := cfg.GetCertificate(&tls.ClientHelloInfo{})
		if err != nil {
			t.Fatal(err)
		}
		return c.Leaf
	}
	now = start.Add(agenttls.ServingValidity / 2)
	if got := served(); !got.Equal(first.Leaf) {
		t.Fatalf("renewed at half its validity: serial %v", got.SerialNumber)
	}
	now = start.Add(agenttls.ServingValidity * 3 / 4)
	renewed := served()
	if renewed.Equal(first.Leaf) || !renewed.NotAfter.After(first.Leaf.NotAfter) || !slices.Equal(renewed.DNSNames, first.Leaf.DNSNames) {
		t.Fatalf("after three quarters of its validity: %v until %s, want a new certificate for %v past %s", renewed.DNSNames, renewed.NotAfter, first.Leaf.DNSNames, first.Leaf.NotAfter)
	}
	if _, err := renewed.Verify(x509.VerifyOptions{Roots: ca.Pool(), DNSName: "etcdbackup." + ns + ".svc", CurrentTime: now}); err != nil {
		t.Fatalf("the renewed certificate does not verify: %v", err)
	}
	if got := served(); !got.Equal(renewed) {
		t.Fatal("renewed again at once")
	}
}

// The agent port follows the CA Secret: when a restore of the cluster
// removed it (or someone replaced it), the server makes a new CA, serves
// certificates of it from the next handshake on and publishes it in
// every agent namespace; a client trusting the old CA no longer connects
// (issue 37).
func TestFollowsTheCASecret(t *testing.T) {
	ctx := context.Background()
	cs := fake.NewClientset()
	cfg, current, err := agenttls.Setup(ctx, agenttls.Options{Client: cs, Namespace: ns, AgentNamespaces: []string{"app"}})
	if err != nil {
		t.Fatal(err)
	}
	old := current.CA()
	lis, err := tls.Listen("tcp", "127.0.0.1:0", cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer lis.Close()
	go func() {
		for {
			c, err := lis.Accept()
			if err != nil {
				return
			}
			_ = c.(*tls.Conn).Handshake()
			c.Close()
		}
	}()
	dial := func(pool *x509.CertPool) error {
		c, err := tls.DialWithDialer(&net.Dialer{Timeout: 5 * time.Second}, "tcp", lis.Addr().String(), &tls.Config{RootCAs: pool, ServerName: "etcdbackup." + ns + ".svc", NextProtos: []string{"h2"}})
		if err == nil {
			c.Close()
		}
		return err
	}
	if err := dial(old.Pool()); err != nil {
		t.Fatal(err)
	}
	if changed, err := current.Refresh(ctx); err != nil || changed {
		t.Fatalf("Refresh with the Secret unchanged: %v, %v", changed, err)
	}
	// Namespace app did not exist at Setup; it does now, and the next
	// Refresh publishes there.
	if _, err := cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "app"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}

	if err := cs.CoreV1().Secrets(ns).Delete(ctx, agenttls.SecretName, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	changed, err := current.Refresh(ctx)
	if err != nil || !changed {
		t.Fatalf("Refresh after the CA Secret was removed: %v, %v", changed, err)
	}
	now := current.CA()
	if bytes.Equal(now.CertPEM, old.CertPEM) {
		t.Fatal("the CA in force is still the old one")
	}
	if err := dial(now.Pool()); err != nil {
		t.Fatalf("a client trusting the new CA: %v", err)
	}
	if err := dial(old.Pool()); err == nil {
		t.Fatal("a client trusting the old CA still connects")
	}
	s, err := cs.CoreV1().Secrets(ns).Get(ctx, agenttls.SecretName, metav1.GetOptions{})
	if err != nil || !bytes.Equal(s.Data[agenttls.CertKey], now.CertPEM) {
		t.Fatalf("the new CA's Secret: %v", err)
	}
	for _, n := range []string{ns, "app"} {
		cm, err := cs.CoreV1().ConfigMaps(n).Get(ctx, agenttls.ConfigMapName, metav1.GetOptions{})
		if err != nil || cm.Data[agenttls.CertKey] != string(now.CertPEM) {
			t.Fatalf("ConfigMap in %s after the change: %v", n, err)
		}
	}
}

// A restore removes the CA's Secret by this name (snapshot.RevokeServerKeys).
func TestRestoreRevokesTheCASecret(t *testing.T) {
	if !slices.Contains(snapshot.ServerKeySecrets, agenttls.SecretName) {
		t.Errorf("snapshot.ServerKeySecrets %q lacks %q", snapshot.ServerKeySecrets, agenttls.SecretName)
	}
}
