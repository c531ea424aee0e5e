package sandbox

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"sync"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// The control plane can go down and come back, as on a kubeadm node whose
// operator restores etcd: the static pod manifests of etcd, kube-apiserver,
// kube-controller-manager and kube-scheduler move out of
// /etc/kubernetes/manifests (the kubelet stops the four), etcd's data
// directory is replaced by a restore, and the manifests move back, the etcd
// one now naming the restored directory (the kubelet starts the four
// again). The node's kubelet, kube-proxy and pods keep running throughout
// and reconnect, as on that node.
//
// kube-controller-manager and kube-scheduler go down and come back with
// the API server rather than riding out the outage: that is the upstream
// procedure ("Restoring an etcd cluster": restart the components so they
// do not rely on stale data) and what moving all the manifests out does.
// Left running they would keep informer caches from after the snapshot (a
// restore winds etcd's revision back, so their watches resume from the
// future and miss what happens until the revision catches up), and on a
// kubeadm node a controller losing its leader lease exits and is
// restarted by the kubelet; fresh processes are that without the crash
// loop. The sandbox's volume provisioner, a controller too, follows them.

// ErrControlPlaneState is returned (wrapped) by StartControlPlane and
// StopControlPlane on a stopped sandbox, and by StartControlPlane when the
// control plane is already up.
var ErrControlPlaneState = errors.New("control plane in the wrong state")

// EtcdMember is what a restore needs to know of the sandbox's etcd member
// (etcdutl snapshot restore's flags, or snapshot.Member), and what its
// clients need. Everything but DataDir is fixed at Start and kept by
// StartControlPlane.
type EtcdMember struct {
	// Name is the member's --name.
	Name string
	// PeerURLs are its --initial-advertise-peer-urls (one: http on
	// loopback).
	PeerURLs []string
	// InitialCluster is its --initial-cluster: Name=PeerURL.
	InitialCluster string
	// InitialClusterToken is its --initial-cluster-token: etcd's default,
	// "etcd-cluster", which a restore writes when given none.
	InitialClusterToken string
	// DataDir is the data directory it runs on (or ran on last, while the
	// control plane is down): <Dir>/etcd after Start.
	DataDir string
	// Endpoint is its client URL (EtcdEndpoint): https on loopback. It
	// listens on the same port on HostIP too, where pods reach it.
	Endpoint string
	// CAFile, CertFile and KeyFile are etcd's CA and a client certificate
	// it accepts (EtcdClientTLS).
	CAFile, CertFile, KeyFile string
}

// EtcdMember describes the sandbox's etcd member.
func (s *Sandbox) EtcdMember() EtcdMember {
	s.cpMu.Lock()
	dataDir := s.etcd.dataDir
	s.cpMu.Unlock()
	ca, cert, key := s.EtcdClientTLS()
	peer := s.etcd.peerURL.String()
	return EtcdMember{
		Name:                etcdMemberName,
		PeerURLs:            []string{peer},
		InitialCluster:      etcdMemberName + "=" + peer,
		InitialClusterToken: etcdClusterToken,
		DataDir:             dataDir,
		Endpoint:            s.etcd.clientURL.String(),
		CAFile:              ca,
		CertFile:            cert,
		KeyFile:             key,
	}
}

// StopControlPlane stops kube-controller-manager and kube-scheduler (and
// the sandbox's volume provisioner), then kube-apiserver, then etcd — the
// apiserver before etcd, whose absence would hang its graceful shutdown —
// and returns once they have exited: etcd has closed its data directory,
// which a restore may now replace. The node and its pods keep running;
// their connections to the API server fail until StartControlPlane.
// Processes get SIGTERM and, after 15 s or when ctx ends, SIGKILL.
//
// It is a no-op when the control plane is already down. Client() and the
// kubeconfigs stay valid (they reach the API server again after
// StartControlPlane); Stop works either way.
func (s *Sandbox) StopControlPlane(ctx context.Context) error {
	s.cpMu.Lock()
	defer s.cpMu.Unlock()
	if s.stopped {
		return fmt.Errorf("sandbox: stop control plane: %w: the sandbox is stopped", ErrControlPlaneState)
	}
	if s.cpDown {
		return nil
	}
	began := time.Now()
	// Down from here on, whatever fails: StartControlPlane starts it all.
	s.cpDown = true
	grace := graceFor(ctx, 15*time.Second)
	var errs []error
	if err := s.stopControllers(grace); err != nil {
		errs = append(errs, err)
	}
	if err := s.apiserver.stop(graceFor(ctx, 15*time.Second)); err != nil {
		errs = append(errs, err)
	}
	s.etcd.stop()
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("sandbox: stop control plane: %w", err)
	}
	s.logf("control plane stopped: kube-controller-manager, kube-scheduler, kube-apiserver, etcd (%s)", since(began))
	return nil
}

// StartControlPlane brings the control plane StopControlPlane stopped
// back: etcd on etcdDataDir (a member data directory: a restored one, or
// the one it ran on), with the same member name, client and peer URLs,
// ports and TLS, so the apiserver's --etcd-servers and the Services that
// lead pods to etcd still hold; then kube-apiserver with the same flags,
// port and certificates, until /readyz answers; then
// kube-controller-manager and kube-scheduler, until they are healthy and
// the controllers answer; then the volume provisioner. A port still taken
// (by another process: the sandbox's own have exited) is waited for up to
// 20 s, then the start fails naming it.
//
// etcdDataDir becomes EtcdMember().DataDir; the sandbox does not remove it
// (the next Start in the same Dir removes <Dir>/etcd-* and
// <Dir>/etcd.before-restore-*). It must outlive the sandbox's etcd: stop
// the sandbox before removing it.
//
// On error it stops whatever it started, leaving the control plane down:
// call it again, or Stop. It fails with ErrControlPlaneState when the
// control plane runs or the sandbox is stopped. It does not wait for the
// node: see WaitForNodeReady.
func (s *Sandbox) StartControlPlane(ctx context.Context, etcdDataDir string) (err error) {
	s.cpMu.Lock()
	defer s.cpMu.Unlock()
	if s.stopped {
		return fmt.Errorf("sandbox: start control plane: %w: the sandbox is stopped", ErrControlPlaneState)
	}
	if !s.cpDown {
		return fmt.Errorf("sandbox: start control plane: %w: it is running (StopControlPlane first)", ErrControlPlaneState)
	}
	if etcdDataDir == "" {
		return errors.New("sandbox: start control plane: no etcd data directory")
	}
	dataDir, err := filepath.Abs(etcdDataDir)
	if err != nil {
		return fmt.Errorf("sandbox: start control plane: etcd data directory: %w", err)
	}
	began := time.Now()
	defer func() {
		if err != nil {
			// Leave it all down, as StopControlPlane does.
			_ = s.stopControllers(15 * time.Second)
			_ = s.apiserver.stop(15 * time.Second)
			s.etcd.stop()
			err = fmt.Errorf("sandbox: start control plane: %w", err)
		}
	}()
	if err := s.etcd.start(ctx, dataDir); err != nil {
		return err
	}
	s.logf("etcd ready at %s on %s (%s)", s.etcd.clientURL.String(), dataDir, since(began))

	step := time.Now()
	apiserver, err := startAPIServer(ctx, s.binPath("kube-apiserver"), s.dir, s.pki, s.etcd.clientURL.String(), s.apiserver.port, s.log)
	if err != nil {
		return err
	}
	s.apiserver = apiserver
	s.logf("kube-apiserver ready at %s (%s)", apiserver.url, since(step))

	step = time.Now()
	if err := s.startControllers(ctx, s.log); err != nil {
		return err
	}
	if s.provisioner, err = startProvisioner(ctx, s.client, s.node.hostPath, s.logf); err != nil {
		return err
	}
	s.cpDown = false
	s.logf("kube-controller-manager, kube-scheduler ready (%s); control plane back in %s", since(step), since(began))
	return nil
}

// stopControllers stops kube-controller-manager and kube-scheduler side
// by side (SIGTERM, SIGKILL after grace), then the volume provisioner.
// Exited or never started ones are skipped.
func (s *Sandbox) stopControllers(grace time.Duration) error {
	controllers := []*process{s.controllerManager, s.scheduler}
	errs := make([]error, len(controllers))
	var wg sync.WaitGroup
	for i, p := range controllers {
		if p == nil {
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = p.stop(grace)
		}()
	}
	wg.Wait()
	if s.provisioner != nil {
		s.provisioner.stop()
		s.provisioner = nil
	}
	return errors.Join(errs...)
}

// graceFor is d, or less if ctx ends sooner.
func graceFor(ctx context.Context, d time.Duration) time.Duration {
	if ctx.Err() != nil {
		return 0
	}
	if deadline, ok := ctx.Deadline(); ok && time.Until(deadline) < d {
		return max(time.Until(deadline), 0)
	}
	return d
}

// WaitForNodeReady waits until the Node is Ready and its kubelet has
// renewed its Lease (kube-node-lease/NodeName) at or after since, its
// heartbeat: after StartControlPlane the Node's Ready condition read back
// from a restored etcd is the snapshot's, and only a renewal shows the
// kubelet talks to the new control plane. A zero since waits for Ready
// only.
func (s *Sandbox) WaitForNodeReady(ctx context.Context, since time.Time) error {
	// The Lease's renewTime has microseconds.
	since = since.Truncate(time.Microsecond)
	return poll(ctx, "node "+NodeName+" to be Ready with a heartbeat since "+since.Format(time.RFC3339), func() (bool, string, error) {
		node, err := s.client.CoreV1().Nodes().Get(ctx, NodeName, metav1.GetOptions{})
		if err != nil {
			return false, fmt.Sprintf("get node: %v", err), nil
		}
		ready := "no Ready condition"
		for _, c := range node.Status.Conditions {
			if c.Type == corev1.NodeReady {
				if c.Status != corev1.ConditionTrue {
					return false, fmt.Sprintf("Ready=%s %s: %s", c.Status, c.Reason, c.Message), nil
				}
				ready = ""
			}
		}
		if ready != "" {
			return false, ready, nil
		}
		if since.IsZero() {
			return true, "", nil
		}
		lease, err := s.client.CoordinationV1().Leases(corev1.NamespaceNodeLease).Get(ctx, NodeName, metav1.GetOptions{})
		if err != nil {
			return false, fmt.Sprintf("Ready; get lease: %v", err), nil
		}
		return renewedSince(lease, since), fmt.Sprintf("Ready; lease renewed %v", lease.Spec.RenewTime), nil
	})
}

func renewedSince(lease *coordinationv1.Lease, since time.Time) bool {
	return lease.Spec.RenewTime != nil && !lease.Spec.RenewTime.Time.Before(since)
}
