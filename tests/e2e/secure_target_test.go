package e2e

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	"go.etcd.io/etcd/client/pkg/v3/transport"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/server/v3/embed"
	"go.uber.org/zap"

	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/tests/world"
)

// An application etcd as operators run it: TLS, client certificates,
// authentication on with a root user, the product reaching it with a
// client certificate whose name is root. On the installed product, under
// a steady write load (issue 36, "On the sandbox"):
//
//   - its full backup passes a drill;
//   - its chain is folded into a new full backup (which passes a drill
//     too) and the next chain grows from it;
//   - restores to a point on either chain equal etcd's own answer at
//     that revision, key by key;
//   - etcd restored in place from its newest full without a revision bump while
//     the delta agent runs (etcd's client resumes the agent's watch; the
//     new history passes the chain's end): the chain ends as a history
//     break and keeps only the old history, a full backup starts a new
//     chain, a point after the restore is planned on that chain only and
//     equals etcd's answer, and the old history's last point still
//     restores as it was.
func TestSecureTargetOnTheDay(t *testing.T) {
	sb, im := startSandbox(t)
	k := &world.Kubectl{Path: sb.KubectlPath(), Kubeconfig: sb.Kubeconfig(), PluginDir: binDir}
	c := &cluster{sb: sb, kubectl: k}

	se := startSecureEtcd(t, "secure")
	ec := se.client(t)
	for i := range 50 {
		put(t, ec, fmt.Sprintf("/registry/seed/%03d", i), strings.Repeat("s", 200))
	}

	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Minute)
	defer cancel()
	product, err := world.InstallProduct(ctx, sb, k, im, t.TempDir(), &testLog{t: t, prefix: "install: "},
		world.PlainTarget{Name: "secure", Addr: se.clientURL.Host, DeltaPeriod: deltaPeriod.String(), CompactAfterRevisions: 1000, TLS: &se.tls})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(product.Stop)
	t.Cleanup(func() {
		if t.Failed() {
			for _, component := range []string{"delta-agent", "fold-agent", "drill-agent", "backup-agent"} {
				r := c.run(t, nil, "-n", world.DefaultNamespace, "logs", "-l", "app.kubernetes.io/component="+component, "--tail=30", "--prefix", "--all-containers")
				t.Logf("%s logs:\n%s\n%s", component, r.Stdout, r.Stderr)
			}
			r := c.run(t, nil, "-n", world.DefaultNamespace, "logs", "deployment/etcdbackup-server", "--tail=80")
			t.Logf("server log:\n%s", r.Stdout)
		}
	})
	verification := func(name string) string {
		return mustSucceed(t, c.run(t, nil, "etcdbackup", "get", name, "-o",
			`jsonpath={.status.verification.result}/{.status.verification.message}`), "get verification").Stdout
	}
	drill := func(t *testing.T, name string) {
		t.Helper()
		r := mustSucceed(t, c.run(t, nil, "etcdbackup", "drill", name, "--wait", "--timeout", "5m"), "drill "+name)
		if v := verification(name); !strings.HasPrefix(v, "Succeeded/") {
			t.Errorf("drill of %s: %q\n%s", name, v, r)
		}
	}

	load := startWriteLoad(ctx, t, ec, 100)
	defer load.stop()
	var full string
	pollUntil(ctx, t, "a full backup of secure with a growing delta chain", func() bool {
		full = chainGrowing(t, c, "secure")
		return full != ""
	})
	t.Logf("chain started from full backup %s", full)
	fullRev := fullRevision(t, c, full)

	t.Run("drill", func(t *testing.T) { drill(t, full) })

	// More than compactAfterRevisions (1000) revisions at 100 writes/s.
	var fold string
	t.Run("fold", func(t *testing.T) {
		waitFor(ctx, t, 5*time.Minute, "the chain of "+full+" folded into a new full backup with a growing chain", func() bool {
			if b := chainGrowing(t, c, "secure"); strings.HasPrefix(b, "secure-fold-") {
				fold = b
			}
			return fold != ""
		})
		t.Logf("folded into %s", fold)
		drill(t, fold)
	})
	if fold == "" {
		t.FailNow()
	}

	load.stop()
	// One more write, so that the newest chain holds a segment even when
	// a fold took everything before it.
	last, err := ec.Put(ctx, "/registry/after-load", "x")
	if err != nil {
		t.Fatal(err)
	}
	newest := last.Header.Revision
	// Folds go on while a chain is over compactAfterRevisions: wait for
	// the chain that holds the last write and will not be folded.
	var cur string
	waitFor(ctx, t, 5*time.Minute, "a chain of secure holding the last write, with no fold to come", func() bool {
		if newestFullHasNoSegments(t, c, "secure") {
			// A fold took everything: one more write starts its chain.
			r, err := ec.Put(ctx, "/registry/after-load", "y")
			if err != nil {
				t.Fatal(err)
			}
			newest = r.Header.Revision
			return false
		}
		cur = chainGrowing(t, c, "secure")
		if cur == "" {
			return false
		}
		ch := chainOf(t, c, cur)
		return ch.LastRevision >= newest && ch.LastRevision-fullRevision(t, c, cur) <= 1000
	})
	foldRev := fullRevision(t, c, fold)
	curRev := fullRevision(t, c, cur)
	root := &etcdUser{name: "root", password: se.rootPassword}
	keyspace := func(rev int64) []*mvccpb.KeyValue {
		t.Helper()
		r, err := ec.Get(ctx, "\x00", clientv3.WithFromKey(), clientv3.WithRev(rev))
		if err != nil {
			t.Fatal(err)
		}
		return r.Kvs
	}
	for _, p := range []struct {
		name string
		rev  int64
	}{
		{"first-chain", fullRev + (foldRev-fullRev)/2},
		{"newest-chain", newest},
	} {
		t.Run("restore-"+p.name, func(t *testing.T) {
			restoreToPointExpecting(t, c, "secure", root, "--to-revision", strconv.FormatInt(p.rev, 10), p.rev, keyspace(p.rev))
		})
	}

	// The test's own directory, not the subtest's: the restored etcd runs
	// on it until the test ends, and a subtest's directory is removed when
	// the subtest ends (etcd, finding its data gone, exits the process).
	restoredDir := filepath.Join(t.TempDir(), "restored.etcd")
	t.Run("restored-under-the-chain", func(t *testing.T) {
		before := chainOf(t, c, cur)
		oldLast := keyspace(before.LastRevision)
		existed := mustSucceed(t, c.run(t, nil, "etcdbackup", "list", "--target", "secure", "-o", "name"), "list --target secure").Stdout
		// The operator restores etcd in place from the newest full (a
		// fold), keeping its
		// revisions, with the same member and cluster token: the same
		// cluster ID, nothing for the agent to see but the data.
		dir := restoredDir
		mustSucceed(t, c.run(t, nil, "etcdbackup", "restore", cur, "--local", "--bump-revision", "0",
			"--data-dir", dir, "--member-name", se.name, "--initial-cluster", se.name+"="+se.peerURL.String(),
			"--initial-advertise-peer-urls", se.peerURL.String(), "--initial-cluster-token", se.token), "restore etcd in place")
		se.restartOn(t, dir)
		if r := keyspace(0); len(r) == 0 {
			t.Fatal("the restored etcd holds no keys")
		}
		// The new history passes the chain's end.
		for i := 0; ; i++ {
			resp, err := ec.Put(ctx, fmt.Sprintf("/registry/new-history/%04d", i), "n")
			if err != nil {
				t.Fatal(err)
			}
			if resp.Header.Revision > before.LastRevision+20 {
				break
			}
		}
		pollUntil(ctx, t, "the chain of "+cur+" ended", func() bool { return chainOf(t, c, cur).EndReason != "" })
		ended := chainOf(t, c, cur)
		if !strings.Contains(ended.EndReason, "history changed") && !strings.Contains(ended.EndReason, "revision went back") {
			t.Errorf("the chain of %s ended with %q; want it to say etcd's history changed under it", cur, ended.EndReason)
		}
		if ended.LastRevision > before.LastRevision {
			t.Errorf("the chain of %s ends at revision %d, past the old history's end %d: it holds writes of the new history", cur, ended.LastRevision, before.LastRevision)
		}
		checkContiguous(t, cur, curRev, segmentsOf(t, c, cur))

		var next string
		n := 0
		pollUntil(ctx, t, "a new full backup of secure with a growing chain", func() bool {
			n++
			put(t, ec, fmt.Sprintf("/registry/after-restore/%03d", n), "y")
			next = chainGrowing(t, c, "secure")
			return next != "" && !strings.Contains(existed, next)
		})
		t.Logf("new chain from full backup %s", next)
		marker, err := ec.Put(ctx, "/registry/after-restore/marker", "m")
		if err != nil {
			t.Fatal(err)
		}
		var seg segment
		pollUntil(ctx, t, "the new chain holding the marker", func() bool {
			for _, s := range segmentsOf(t, c, next) {
				if s.FirstRevision <= marker.Header.Revision && marker.Header.Revision <= s.LastRevision {
					seg = s
					return true
				}
			}
			return false
		})
		out := restoreToPointExpecting(t, c, "secure", root, "--to-time", seg.LastTime.Format(time.RFC3339Nano), seg.LastRevision, keyspace(seg.LastRevision))
		if !strings.Contains(out, fmt.Sprintf("after backup %q", next)) {
			t.Errorf("the point after the restore was not planned on the new chain (%s):\n%s", next, out)
		}
		// The old history's last point is still what etcd held then.
		restoreToPointExpecting(t, c, "secure", root, "--to-revision", strconv.FormatInt(before.LastRevision, 10), before.LastRevision, oldLast)
	})
}

// newestFullHasNoSegments says whether target's newest full backup has
// no delta segment yet.
func newestFullHasNoSegments(t *testing.T, c *cluster, target string) bool {
	t.Helper()
	for _, b := range listedBackups(t, c, "--target", target) { // newest first
		if b.Status.Delta != nil {
			continue
		}
		return b.Status.Chain == nil || b.Status.Chain.Segments == 0
	}
	return false
}

// secureEtcd is a one-member etcd on loopback with TLS, client
// certificate authentication and etcd authentication on.
type secureEtcd struct {
	name, token, dataDir string
	clientURL, peerURL   url.URL
	serverCert           string
	serverKey            string
	// tls is the root user's client certificate, as the product gets it.
	tls          world.TargetTLS
	rootPassword string
	e            *embed.Etcd
}

// startSecureEtcd starts it with a root user, whose certificate's name is
// root, and authentication enabled. Its server certificate names the
// Service the sandbox exposes it as (NAME.kube-system.svc) and 127.0.0.1.
func startSecureEtcd(t *testing.T, name string) *secureEtcd {
	t.Helper()
	dir := t.TempDir()
	se := &secureEtcd{name: "m1", token: "e2e-" + name, dataDir: filepath.Join(dir, "m1.etcd"), clientURL: freeLoopbackURL(t), peerURL: freeLoopbackURL(t), rootPassword: "root-password-e2e"}
	se.clientURL.Scheme = "https"
	se.tls, se.serverCert, se.serverKey = makeEtcdPKI(t, dir, name+".kube-system.svc")
	se.start(t)
	t.Cleanup(se.stop)

	// Before auth is on, anyone may set it up.
	c := se.client(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := c.UserAdd(ctx, "root", se.rootPassword); err != nil {
		t.Fatal(err)
	}
	if _, err := c.UserGrantRole(ctx, "root", "root"); err != nil {
		t.Fatal(err)
	}
	if _, err := c.AuthEnable(ctx); err != nil {
		t.Fatal(err)
	}
	// The certificate alone now authenticates as root.
	if _, err := c.Put(ctx, "/auth/check", "root"); err != nil {
		t.Fatalf("put as root by certificate: %v", err)
	}
	return se
}

func (se *secureEtcd) start(t *testing.T) {
	t.Helper()
	cfg := embed.NewConfig()
	cfg.Name, cfg.Dir = se.name, se.dataDir
	cfg.ListenClientUrls, cfg.AdvertiseClientUrls = []url.URL{se.clientURL}, []url.URL{se.clientURL}
	cfg.ListenPeerUrls, cfg.AdvertisePeerUrls = []url.URL{se.peerURL}, []url.URL{se.peerURL}
	cfg.InitialCluster, cfg.InitialClusterToken = se.name+"="+se.peerURL.String(), se.token
	cfg.ClientTLSInfo = transport.TLSInfo{CertFile: se.serverCert, KeyFile: se.serverKey, TrustedCAFile: se.tls.CAFile, ClientCertAuth: true}
	cfg.LogLevel, cfg.LogOutputs = "error", []string{filepath.Join(filepath.Dir(se.dataDir), se.name+".log")}
	cfg.UnsafeNoFsync = true
	e, err := embed.StartEtcd(cfg)
	if err != nil {
		t.Fatalf("start %s: %v", se.name, err)
	}
	select {
	case <-e.Server.ReadyNotify():
	case err := <-e.Err():
		t.Fatalf("start %s: %v", se.name, err)
	case <-time.After(60 * time.Second):
		t.Fatalf("%s not ready after 60s", se.name)
	}
	se.e = e
}

func (se *secureEtcd) stop() {
	if se.e != nil {
		se.e.Close()
		se.e = nil
	}
}

// restartOn stops the member and starts it on dataDir at the same URLs.
func (se *secureEtcd) restartOn(t *testing.T, dataDir string) {
	t.Helper()
	se.stop()
	se.dataDir = dataDir
	se.start(t)
}

// client connects as root by certificate, until the end of the test.
func (se *secureEtcd) client(t *testing.T) *clientv3.Client {
	t.Helper()
	info := transport.TLSInfo{CertFile: se.tls.CertFile, KeyFile: se.tls.KeyFile, TrustedCAFile: se.tls.CAFile}
	tlsCfg, err := info.ClientConfig()
	if err != nil {
		t.Fatal(err)
	}
	c, err := clientv3.New(clientv3.Config{Endpoints: []string{se.clientURL.String()}, TLS: tlsCfg, DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// makeEtcdPKI writes a CA, a server certificate for dnsName and
// 127.0.0.1, and a client certificate named root into dir.
func makeEtcdPKI(t *testing.T, dir, dnsName string) (client world.TargetTLS, serverCert, serverKey string) {
	t.Helper()
	write := func(name, typ string, der []byte) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	caTmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "e2e-etcd-ca"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	ca, err := x509.ParseCertificate(caDER)
	if err != nil {
		t.Fatal(err)
	}
	issue := func(file, cn string, serial int64, usage []x509.ExtKeyUsage, dns []string, ips []net.IP) (string, string) {
		key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		if err != nil {
			t.Fatal(err)
		}
		tmpl := &x509.Certificate{
			SerialNumber: big.NewInt(serial), Subject: pkix.Name{CommonName: cn},
			NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
			KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: usage, DNSNames: dns, IPAddresses: ips,
		}
		der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &key.PublicKey, caKey)
		if err != nil {
			t.Fatal(err)
		}
		keyDER, err := x509.MarshalECPrivateKey(key)
		if err != nil {
			t.Fatal(err)
		}
		return write(file+".crt", "CERTIFICATE", der), write(file+".key", "EC PRIVATE KEY", keyDER)
	}
	client.CAFile = write("ca.crt", "CERTIFICATE", caDER)
	serverCert, serverKey = issue("server", "etcd-server", 2, []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		[]string{dnsName, "localhost"}, []net.IP{net.ParseIP("127.0.0.1")})
	client.CertFile, client.KeyFile = issue("root", "root", 3, []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}, nil, nil)
	return client, serverCert, serverKey
}
