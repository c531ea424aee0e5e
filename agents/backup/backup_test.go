package backup_test

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/sha256"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/hex"
	"encoding/pem"
	"fmt"
	"io"
	"math/big"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/klauspost/compress/zstd"
	"go.etcd.io/etcd/client/pkg/v3/transport"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/snapshot"
	etcdutl "go.etcd.io/etcd/etcdutl/v3/snapshot"
	"go.etcd.io/etcd/server/v3/embed"
	"go.uber.org/zap"

	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/agents/backup"
	ebv1 "github.com/kubectl-etcdbackup/kubectl-etcdbackup/api/etcdbackup/v1"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/client"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/server/servertest"
)

// testEtcd is a real etcd member, with TLS client certificates or without.
type testEtcd struct {
	e        *embed.Etcd
	stop     func()
	endpoint string
	tls      *transport.TLSInfo
}

func freeURL(t *testing.T, scheme string) url.URL {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return url.URL{Scheme: scheme, Host: l.Addr().String()}
}

func startEtcd(t *testing.T, withTLS bool) *testEtcd {
	t.Helper()
	dir := t.TempDir()
	cfg := embed.NewConfig()
	cfg.Name = "member-1"
	cfg.Dir = filepath.Join(dir, "data")
	cfg.LogLevel = "error"
	cfg.LogOutputs = []string{filepath.Join(dir, "etcd.log")}
	cfg.UnsafeNoFsync = true
	scheme := "http"
	te := &testEtcd{}
	if withTLS {
		scheme = "https"
		info := makeTLS(t, dir)
		cfg.ClientTLSInfo = transport.TLSInfo{CertFile: info.serverCert, KeyFile: info.serverKey, TrustedCAFile: info.ca, ClientCertAuth: true}
		te.tls = &transport.TLSInfo{CertFile: info.clientCert, KeyFile: info.clientKey, TrustedCAFile: info.ca}
	}
	client, peer := freeURL(t, scheme), freeURL(t, "http")
	cfg.ListenClientUrls, cfg.AdvertiseClientUrls = []url.URL{client}, []url.URL{client}
	cfg.ListenPeerUrls, cfg.AdvertisePeerUrls = []url.URL{peer}, []url.URL{peer}
	cfg.InitialCluster = cfg.InitialClusterFromName(cfg.Name)
	e, err := embed.StartEtcd(cfg)
	if err != nil {
		t.Fatal(err)
	}
	te.stop = sync.OnceFunc(e.Close)
	t.Cleanup(te.stop)
	select {
	case <-e.Server.ReadyNotify():
	case <-time.After(30 * time.Second):
		t.Fatal("etcd not ready")
	}
	te.e, te.endpoint = e, client.String()
	return te
}

func (te *testEtcd) client(t *testing.T) *clientv3.Client {
	t.Helper()
	cfg := te.config(t)
	c, err := clientv3.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

func (te *testEtcd) config(t *testing.T) clientv3.Config {
	cfg := clientv3.Config{Endpoints: []string{te.endpoint}, DialTimeout: 5 * time.Second, Logger: zap.NewNop()}
	if te.tls != nil {
		tlsCfg, err := te.tls.ClientConfig()
		if err != nil {
			t.Fatal(err)
		}
		cfg.TLS = tlsCfg
	}
	return cfg
}

// fill writes n values of size bytes under /fill/.
func fill(t *testing.T, c *clientv3.Client, n, size int) {
	t.Helper()
	val := strings.Repeat("v", size)
	for i := 0; i < n; i++ {
		if _, err := c.Put(context.Background(), fmt.Sprintf("/fill/%06d", i), val); err != nil {
			t.Fatal(err)
		}
	}
}

type dataServer struct {
	client *client.Client
	dir    string
}

func startServer(t *testing.T) *dataServer {
	s := servertest.Start(t, "")
	return &dataServer{client: s.Client, dir: s.Dir}
}

func (s *dataServer) download(t *testing.T, name string) []byte {
	t.Helper()
	var buf bytes.Buffer
	if _, err := s.client.Download(context.Background(), &buf, client.DownloadRequest{Name: name}); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

func (s *dataServer) names(t *testing.T) []string {
	resp, err := s.client.Backups.ListBackups(context.Background(), &ebv1.ListBackupsRequest{})
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, b := range resp.GetBackups() {
		out = append(out, b.GetName())
	}
	return out
}

func sha(b []byte) string {
	s := sha256.Sum256(b)
	return hex.EncodeToString(s[:])
}

func TestBackupEqualsSnapshotSave(t *testing.T) {
	for _, tc := range []struct {
		name        string
		tls         bool
		compression string
	}{
		{"plain", false, ""},
		{"tls", true, ""},
		{"tls-zstd", true, "zstd"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			te := startEtcd(t, tc.tls)
			c := te.client(t)
			fill(t, c, 2000, 512)
			if _, err := c.Put(context.Background(), "foo", "1"); err != nil {
				t.Fatal(err)
			}
			srv := startServer(t)

			b, err := backup.Run(context.Background(), c, srv.client, backup.Options{
				Endpoint: te.endpoint, Name: "b1", Target: "test-etcd", Compression: tc.compression,
				Labels: map[string]string{"by": "test"},
			})
			if err != nil {
				t.Fatal(err)
			}
			// etcd's own tool on the same member at the same revision.
			ref := filepath.Join(t.TempDir(), "ref.db")
			if _, err := snapshot.SaveWithVersion(context.Background(), zap.NewNop(), te.config(t), ref); err != nil {
				t.Fatal(err)
			}
			want, err := os.ReadFile(ref)
			if err != nil {
				t.Fatal(err)
			}
			got := srv.download(t, "b1")
			if tc.compression == "zstd" {
				if len(got) >= len(want) {
					t.Errorf("zstd backup is %d bytes, raw snapshot %d: not compressed", len(got), len(want))
				}
				dec, err := zstd.NewReader(bytes.NewReader(got))
				if err != nil {
					t.Fatal(err)
				}
				if got, err = io.ReadAll(dec); err != nil {
					t.Fatal(err)
				}
				dec.Close()
			}
			// Two snapshots of one revision differ in bolt's page layout
			// (etcd's backend commits in between), so compare what etcd
			// itself reports: the SHA-256 trailer, and etcdutl's status —
			// revision, key count and the hash of every key and value.
			gotPath := filepath.Join(t.TempDir(), "got.db")
			if err := os.WriteFile(gotPath, got, 0o600); err != nil {
				t.Fatal(err)
			}
			gotSt, wantSt := status(t, gotPath), status(t, ref)
			if gotSt.Hash != wantSt.Hash || gotSt.Revision != wantSt.Revision || gotSt.TotalKey != wantSt.TotalKey {
				t.Fatalf("etcd status of the backup %+v, of snapshot.Save %+v", gotSt, wantSt)
			}
			if err := verifyTrailer(got); err != nil {
				t.Fatal(err)
			}
			// Metadata the issue asks for.
			e := b.GetEtcd()
			st, _ := c.Status(context.Background(), te.endpoint)
			if e.GetClusterId() != st.Header.ClusterId || e.GetMemberId() != st.Header.MemberId || e.GetMemberName() != "member-1" ||
				e.GetRevision() != st.Header.Revision || e.GetVersion() == "" || e.GetDbSize() == 0 {
				t.Errorf("etcd info %+v; status %+v", e, st.Header)
			}
			if b.GetRawSize() != int64(len(got)) || b.GetRawSha256() != sha(got) || b.GetCompression() != tc.compression {
				t.Errorf("raw size/sha/compression = %d %s %q; want %d %s %q", b.GetRawSize(), b.GetRawSha256(), b.GetCompression(), len(got), sha(got), tc.compression)
			}
			if b.GetSource().GetKind() != "agent" || b.GetSource().GetTarget() != "test-etcd" || b.GetSource().GetStartTime() == nil {
				t.Errorf("source %+v", b.GetSource())
			}
		})
	}
}

// etcd going away mid-snapshot fails the backup and stores nothing.
func TestEtcdDiesMidSnapshot(t *testing.T) {
	te := startEtcd(t, false)
	c := te.client(t)
	fill(t, c, 4000, 4096) // ~16 MiB: the stream takes many messages
	srv := startServer(t)
	killed := false
	_, err := backup.Run(context.Background(), c, srv.client, backup.Options{
		Endpoint: te.endpoint, Name: "doomed",
		Progress: func(n int64) {
			if n > 1<<20 && !killed {
				killed = true
				te.stop()
			}
		},
	})
	if err == nil {
		t.Fatal("backup succeeded although etcd died mid-snapshot")
	}
	if !killed {
		t.Fatal("the test did not kill etcd mid-stream")
	}
	if names := srv.names(t); len(names) != 0 {
		t.Fatalf("listed after a failed backup: %v", names)
	}
	time.Sleep(100 * time.Millisecond) // the server notices the cancel asynchronously
	entries, _ := os.ReadDir(filepath.Join(srv.dir, ".tmp"))
	if len(entries) != 0 {
		t.Fatalf("half-written upload left in .tmp: %v", entries)
	}
}

func TestPlaintextNeedsNoCertsButTLSRefusesStrangers(t *testing.T) {
	te := startEtcd(t, true)
	cfg := clientv3.Config{Endpoints: []string{te.endpoint}, DialTimeout: 2 * time.Second, Logger: zap.NewNop()}
	info := transport.TLSInfo{TrustedCAFile: te.tls.TrustedCAFile} // no client cert
	tlsCfg, err := info.ClientConfig()
	if err != nil {
		t.Fatal(err)
	}
	cfg.TLS = tlsCfg
	c, err := clientv3.New(cfg)
	if err == nil {
		defer c.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
		defer cancel()
		_, err = backup.Run(ctx, c, startServer(t).client, backup.Options{Endpoint: te.endpoint, Name: "x"})
	}
	if err == nil {
		t.Fatal("etcd with client-cert auth accepted a client without a certificate")
	}
}

func status(t *testing.T, path string) etcdutl.Status {
	t.Helper()
	st, err := etcdutl.NewV3(zap.NewNop()).Status(path)
	if err != nil {
		t.Fatalf("etcdutl status %s: %v", path, err)
	}
	return st
}

// verifyTrailer checks etcd's snapshot trailer: the last 32 bytes are the
// SHA-256 of the rest.
func verifyTrailer(b []byte) error {
	if len(b) < 32 {
		return fmt.Errorf("snapshot of %d bytes has no trailer", len(b))
	}
	s := sha256.Sum256(b[:len(b)-32])
	if !bytes.Equal(s[:], b[len(b)-32:]) {
		return fmt.Errorf("snapshot trailer does not match its data")
	}
	return nil
}

type tlsFiles struct{ ca, serverCert, serverKey, clientCert, clientKey string }

func makeTLS(t *testing.T, dir string) tlsFiles {
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
