package sandbox

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"go.etcd.io/etcd/client/pkg/v3/transport"
	"go.etcd.io/etcd/server/v3/embed"
)

// etcdMemberName is the sandbox etcd member's --name.
const etcdMemberName = "sandbox"

// etcdClusterToken is the member's --initial-cluster-token: etcd's own
// default, which a restore writes unless told otherwise.
const etcdClusterToken = "etcd-cluster"

// portBusyTimeout bounds how long a restart waits for a port of the
// control plane that is still (or again) taken: the sandbox's own
// listeners are closed when their process has exited, so only another
// process can hold one, and it rarely lets go.
const portBusyTimeout = 20 * time.Second

// etcdServer is the in-process etcd the apiserver stores its objects in.
// Its addresses are fixed at Start; the server itself can be stopped and
// started again on another data directory (StopControlPlane,
// StartControlPlane). The Sandbox's cpMu guards etcd and dataDir.
type etcdServer struct {
	clientURL     url.URL // advertised: https://127.0.0.1:PORT
	hostClientURL url.URL // the same port on HostIP, for pods
	peerURL       url.URL // http://127.0.0.1:PORT
	logPath       string
	pki           *pki

	dataDir string
	etcd    *embed.Etcd // nil while stopped
}

// newEtcdServer picks etcd's client and peer ports; start runs it.
func newEtcdServer(dir string, p *pki) (*etcdServer, error) {
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
	return &etcdServer{
		clientURL:     url.URL{Scheme: "https", Host: fmt.Sprintf("127.0.0.1:%d", clientPort)},
		hostClientURL: url.URL{Scheme: "https", Host: fmt.Sprintf("%s:%d", HostIP, clientPort)},
		peerURL:       url.URL{Scheme: "http", Host: fmt.Sprintf("127.0.0.1:%d", peerPort)},
		logPath:       filepath.Join(dir, "etcd.log"),
		pki:           p,
	}, nil
}

// config is the member's configuration on dataDir: always the same name,
// URLs, TLS and cluster, so a data directory restored for this member
// (EtcdMember) fits it.
func (s *etcdServer) config(dataDir string) *embed.Config {
	cfg := embed.NewConfig()
	cfg.Name = etcdMemberName
	cfg.Dir = dataDir
	cfg.ClientTLSInfo = transport.TLSInfo{
		CertFile: s.pki.etcdServer.certFile, KeyFile: s.pki.etcdServer.keyFile,
		TrustedCAFile: s.pki.etcdCA.certFile, ClientCertAuth: true,
	}
	// Also on the host end of the node's veth: pods reach it there, through
	// the kube-system/etcd Service.
	cfg.ListenClientUrls = []url.URL{s.clientURL, s.hostClientURL}
	cfg.AdvertiseClientUrls = []url.URL{s.clientURL}
	cfg.ListenPeerUrls = []url.URL{s.peerURL}
	cfg.AdvertisePeerUrls = []url.URL{s.peerURL}
	cfg.InitialCluster = cfg.InitialClusterFromName(cfg.Name)
	cfg.InitialClusterToken = etcdClusterToken
	// A real etcd server; only fsync is off, because test data is
	// throwaway and fsync dominates the apiserver's write latency on small
	// VMs.
	cfg.UnsafeNoFsync = true
	// Quiet: only warnings and errors, and into a file rather than the test's
	// output, where they would drown the interesting lines. zap appends, so
	// a restart's lines follow the first run's.
	cfg.Logger = "zap"
	cfg.LogLevel = "warn"
	cfg.LogOutputs = []string{s.logPath}
	// A metrics listener is not wanted; the default has none on its own port.
	cfg.Metrics = "basic"
	return cfg
}

// start runs the single member on dataDir (a fresh one is initialized, a
// member's existing or restored one is used as it is) and waits until it
// serves. A port still taken is waited for, up to portBusyTimeout.
func (s *etcdServer) start(ctx context.Context, dataDir string) error {
	if s.etcd != nil {
		return errors.New("etcd is already running")
	}
	busySince := time.Time{}
	for {
		e, err := embed.StartEtcd(s.config(dataDir))
		if err == nil {
			if err := s.waitReady(ctx, e); err != nil {
				return err
			}
			s.etcd, s.dataDir = e, dataDir
			return nil
		}
		if !addrInUse(err) {
			return fmt.Errorf("start etcd on %s: %w", dataDir, err)
		}
		if busySince.IsZero() {
			busySince = time.Now()
		}
		if time.Since(busySince) > portBusyTimeout {
			return fmt.Errorf("start etcd: its ports (client %s, peer %s) are still in use after %s; another process holds one (see `ss -tlnp`): %w",
				s.clientURL.Host, s.peerURL.Host, portBusyTimeout, err)
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("start etcd: waiting for its ports (client %s, peer %s) to be free: %w", s.clientURL.Host, s.peerURL.Host, ctx.Err())
		case <-time.After(250 * time.Millisecond):
		}
	}
}

func (s *etcdServer) waitReady(ctx context.Context, e *embed.Etcd) error {
	select {
	case <-e.Server.ReadyNotify():
		return nil
	case err := <-e.Err():
		e.Close()
		return fmt.Errorf("etcd failed while starting: %w", err)
	case <-ctx.Done():
		e.Close()
		return fmt.Errorf("waiting for etcd: %w", ctx.Err())
	case <-time.After(30 * time.Second):
		e.Close()
		return fmt.Errorf("etcd not ready after 30s (see %s)", s.logPath)
	}
}

// addrInUse tells whether a listener could not bind because its address
// is taken.
func addrInUse(err error) bool {
	return errors.Is(err, syscall.EADDRINUSE) || strings.Contains(err.Error(), "address already in use")
}

// stop stops the server if it runs: Close stops it and its listeners and
// waits for them, and releases the data directory.
func (s *etcdServer) stop() {
	if s.etcd == nil {
		return
	}
	s.etcd.Close()
	s.etcd = nil
}
