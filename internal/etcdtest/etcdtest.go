// Package etcdtest starts a real etcd member in process (etcd's own embed
// server) for tests, with TLS client-certificate authentication as kubeadm
// runs it, or in plain HTTP.
package etcdtest

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"go.etcd.io/etcd/client/pkg/v3/transport"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/server/v3/embed"
	"go.uber.org/zap"
)

// Etcd is a running member.
type Etcd struct {
	// Endpoint is its client URL.
	Endpoint string
	// Name is the member's name.
	Name string
	// DataDir is its --data-dir, held by it while it runs.
	DataDir string
	// TLS holds the client certificate files (nil: plain HTTP).
	TLS *transport.TLSInfo
	// PeerURL and InitialCluster are its peer URL and --initial-cluster
	// (the layout a restore for it is made with).
	PeerURL        string
	InitialCluster string
	// Stop stops it; calling it again does nothing.
	Stop func()

	cfg *embed.Config
}

// Start runs a one-member etcd until the end of the test.
func Start(t testing.TB, withTLS bool) *Etcd {
	t.Helper()
	dir := t.TempDir()
	cfg := embed.NewConfig()
	cfg.Name = "member-1"
	cfg.Dir = filepath.Join(dir, "data")
	cfg.LogLevel = "error"
	cfg.LogOutputs = []string{filepath.Join(dir, "etcd.log")}
	cfg.UnsafeNoFsync = true
	// Room for benchmarks of databases over etcd's default 2 GiB, and
	// for revisions larger than a delta segment's frame.
	cfg.QuotaBackendBytes = 8 << 30
	cfg.MaxRequestBytes = 16 << 20
	scheme := "http"
	te := &Etcd{Name: cfg.Name, DataDir: cfg.Dir}
	if withTLS {
		scheme = "https"
		files := makeTLS(t, dir)
		cfg.ClientTLSInfo = transport.TLSInfo{CertFile: files.serverCert, KeyFile: files.serverKey, TrustedCAFile: files.ca, ClientCertAuth: true}
		te.TLS = &transport.TLSInfo{CertFile: files.clientCert, KeyFile: files.clientKey, TrustedCAFile: files.ca}
	}
	// The ports are picked free, then bound by etcd: a test in another
	// package may take one in between. etcd binds before it touches its
	// data dir, so it is started again on new ports.
	for attempt := 1; ; attempt++ {
		client, peer := freeURL(t, scheme), freeURL(t, "http")
		cfg.ListenClientUrls, cfg.AdvertiseClientUrls = []url.URL{client}, []url.URL{client}
		cfg.ListenPeerUrls, cfg.AdvertisePeerUrls = []url.URL{peer}, []url.URL{peer}
		cfg.InitialCluster = cfg.InitialClusterFromName(cfg.Name)
		te.cfg, te.Endpoint, te.PeerURL, te.InitialCluster = cfg, client.String(), peer.String(), cfg.InitialCluster
		err := te.run(t)
		if err == nil {
			return te
		}
		if !errors.Is(err, syscall.EADDRINUSE) || attempt == 5 {
			t.Fatal(err)
		}
	}
}

// run starts te's etcd and waits until it serves; an error is etcd's
// refusal to start.
func (te *Etcd) run(t testing.TB) error {
	t.Helper()
	e, err := embed.StartEtcd(te.cfg)
	if err != nil {
		return err
	}
	te.Stop = sync.OnceFunc(e.Close)
	t.Cleanup(te.Stop)
	select {
	case <-e.Server.ReadyNotify():
	case <-time.After(30 * time.Second):
		t.Fatal("etcd not ready")
	}
	return nil
}

// RestartOn stops the member and starts it again on dataDir (a data
// directory restored for it) at the same URLs, as an operator who
// restores etcd in place does: its clients reconnect to it.
func (te *Etcd) RestartOn(t testing.TB, dataDir string) {
	t.Helper()
	te.Stop()
	cfg := *te.cfg
	cfg.Dir = dataDir
	te.cfg, te.DataDir = &cfg, dataDir
	if err := te.run(t); err != nil {
		t.Fatal(err)
	}
}

// Config is a client configuration for the member.
func (te *Etcd) Config(t testing.TB) clientv3.Config {
	t.Helper()
	cfg := clientv3.Config{Endpoints: []string{te.Endpoint}, DialTimeout: 5 * time.Second, Logger: zap.NewNop()}
	if te.TLS != nil {
		tlsCfg, err := te.TLS.ClientConfig()
		if err != nil {
			t.Fatal(err)
		}
		cfg.TLS = tlsCfg
	}
	return cfg
}

// Client connects to the member until the end of the test.
func (te *Etcd) Client(t testing.TB) *clientv3.Client {
	t.Helper()
	c, err := clientv3.New(te.Config(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// Fill writes n values of size bytes under /fill/.
func Fill(t testing.TB, c *clientv3.Client, n, size int) {
	t.Helper()
	val := strings.Repeat("v", size)
	for i := 0; i < n; i++ {
		if _, err := c.Put(context.Background(), fmt.Sprintf("/fill/%06d", i), val); err != nil {
			t.Fatal(err)
		}
	}
}

func freeURL(t testing.TB, scheme string) url.URL {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return url.URL{Scheme: scheme, Host: l.Addr().String()}
}

type tlsFiles struct{ ca, serverCert, serverKey, clientCert, clientKey string }

func makeTLS(t testing.TB, dir string) tlsFiles {
	t.Helper()
	caKey, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	caTmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "test-etcd-ca"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	caCert, _ := x509.ParseCertificate(caDER)
	write := func(name string, typ string, der []byte) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	issue := func(name string, serial int64, usage x509.ExtKeyUsage) (string, string) {
		key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		tmpl := &x509.Certificate{
			SerialNumber: big.NewInt(serial), Subject: pkix.Name{CommonName: name},
			NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
			KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{usage},
			IPAddresses: []net.IP{net.ParseIP("127.0.0.1")}, DNSNames: []string{"localhost"},
		}
		der, err := x509.CreateCertificate(rand.Reader, tmpl, caCert, &key.PublicKey, caKey)
		if err != nil {
			t.Fatal(err)
		}
		keyDER, _ := x509.MarshalECPrivateKey(key)
		return write(name+".crt", "CERTIFICATE", der), write(name+".key", "EC PRIVATE KEY", keyDER)
	}
	f := tlsFiles{ca: write("ca.crt", "CERTIFICATE", caDER)}
	f.serverCert, f.serverKey = issue("server", 2, x509.ExtKeyUsageServerAuth)
	f.clientCert, f.clientKey = issue("client", 3, x509.ExtKeyUsageClientAuth)
	return f
}

// FreeURL is an http URL on a loopback port free right now.
func FreeURL(t testing.TB) url.URL { return freeURL(t, "http") }

// StartOn starts a real etcd member named name on an existing (restored)
// data directory, with the peer URL it was restored for, until Stop or
// the end of the test.
func StartOn(t testing.TB, dataDir, name, initialCluster string, peer url.URL) *Etcd {
	t.Helper()
	clientURL := freeURL(t, "http")
	cfg := embed.NewConfig()
	cfg.Name, cfg.Dir, cfg.LogLevel, cfg.UnsafeNoFsync = name, dataDir, "error", true
	cfg.LogOutputs = []string{filepath.Join(t.TempDir(), "etcd.log")}
	cfg.ListenPeerUrls, cfg.AdvertisePeerUrls = []url.URL{peer}, []url.URL{peer}
	cfg.ListenClientUrls, cfg.AdvertiseClientUrls = []url.URL{clientURL}, []url.URL{clientURL}
	cfg.InitialCluster = initialCluster
	e, err := embed.StartEtcd(cfg)
	if err != nil {
		t.Fatal(err)
	}
	te := &Etcd{Endpoint: clientURL.String(), Name: name, DataDir: dataDir, Stop: sync.OnceFunc(e.Close)}
	t.Cleanup(te.Stop)
	select {
	case <-e.Server.ReadyNotify():
	case <-time.After(30 * time.Second):
		t.Fatal("etcd on the restored data dir is not ready")
	}
	return te
}

// ReadKey starts a real etcd member named name on an existing (restored)
// data directory, with the peer URL it was restored for, and returns the
// value of key; it fails the test when the key is missing. The member is
// stopped before it returns.
func ReadKey(t testing.TB, dataDir, name, initialCluster string, peer url.URL, key string) string {
	t.Helper()
	te := StartOn(t, dataDir, name, initialCluster, peer)
	defer te.Stop()
	c, err := clientv3.New(te.Config(t))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	resp, err := c.Get(context.Background(), key)
	if err != nil || len(resp.Kvs) != 1 {
		t.Fatalf("get %q from the restored member: %+v %v", key, resp, err)
	}
	return string(resp.Kvs[0].Value)
}
