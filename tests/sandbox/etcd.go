package sandbox

import (
	"context"
	"fmt"
	"net/url"
	"path/filepath"
	"time"

	"go.etcd.io/etcd/client/pkg/v3/transport"
	"go.etcd.io/etcd/server/v3/embed"
)

// etcdServer is the in-process etcd the apiserver stores its objects in.
type etcdServer struct {
	etcd      *embed.Etcd
	clientURL string
}

// startEtcd starts a single-member etcd on loopback and HostIP with its
// data in dir. It
// is a real etcd server; only fsync is off, because test data is throwaway and
// fsync dominates the apiserver's write latency on small VMs.
func startEtcd(ctx context.Context, dir string, p *pki) (*etcdServer, error) {
	clientPort, err := freePort()
	if err != nil {
		return nil, err
	}
	peerPort, err := freePort()
	if err != nil {
		return nil, err
	}
	// TLS with client-certificate authentication, as kubeadm's etcd: the
	// backup agent must bring the certificate from its Secret.
	clientURL := url.URL{Scheme: "https", Host: fmt.Sprintf("127.0.0.1:%d", clientPort)}
	peerURL := url.URL{Scheme: "http", Host: fmt.Sprintf("127.0.0.1:%d", peerPort)}

	cfg := embed.NewConfig()
	cfg.Name = "sandbox"
	cfg.Dir = filepath.Join(dir, "etcd")
	cfg.ClientTLSInfo = transport.TLSInfo{
		CertFile: p.etcdServer.certFile, KeyFile: p.etcdServer.keyFile,
		TrustedCAFile: p.etcdCA.certFile, ClientCertAuth: true,
	}
	// Also on the host end of the node's veth: pods reach it there, through
	// the kube-system/etcd Service.
	cfg.ListenClientUrls = []url.URL{clientURL, {Scheme: "https", Host: fmt.Sprintf("%s:%d", HostIP, clientPort)}}
	cfg.AdvertiseClientUrls = []url.URL{clientURL}
	cfg.ListenPeerUrls = []url.URL{peerURL}
	cfg.AdvertisePeerUrls = []url.URL{peerURL}
	cfg.InitialCluster = cfg.InitialClusterFromName(cfg.Name)
	cfg.UnsafeNoFsync = true
	// Quiet: only warnings and errors, and into a file rather than the test's
	// output, where they would drown the interesting lines.
	cfg.Logger = "zap"
	cfg.LogLevel = "warn"
	cfg.LogOutputs = []string{filepath.Join(dir, "etcd.log")}
	// A metrics listener is not wanted; the default has none on its own port.
	cfg.Metrics = "basic"

	e, err := embed.StartEtcd(cfg)
	if err != nil {
		return nil, fmt.Errorf("start etcd: %w", err)
	}
	select {
	case <-e.Server.ReadyNotify():
	case err := <-e.Err():
		e.Close()
		return nil, fmt.Errorf("etcd failed while starting: %w", err)
	case <-ctx.Done():
		e.Close()
		return nil, fmt.Errorf("waiting for etcd: %w", ctx.Err())
	case <-time.After(30 * time.Second):
		e.Close()
		return nil, fmt.Errorf("etcd not ready after 30s (see %s)", filepath.Join(dir, "etcd.log"))
	}
	return &etcdServer{etcd: e, clientURL: clientURL.String()}, nil
}

func (s *etcdServer) stop() {
	// Close stops the server and its listeners and waits for them.
	s.etcd.Close()
}
