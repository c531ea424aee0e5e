package sandbox

import (
	"context"
	"fmt"
	"io"
	"strconv"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// controllerManagerArgs run kube-controller-manager the way kubeadm does:
// its own identity, one service-account credential per controller, the
// service-account token controller (signing key) and the root CA publisher
// (kube-root-ca.crt in every namespace, the ca.crt of in-cluster clients).
// Leader election is off: there is one of it, and acquiring a lease would
// only delay the start.
func controllerManagerArgs(p *pki, kubeconfig string, port int) []string {
	return []string{
		"--kubeconfig=" + kubeconfig,
		"--authentication-kubeconfig=" + kubeconfig,
		"--authorization-kubeconfig=" + kubeconfig,
		"--bind-address=127.0.0.1",
		"--secure-port=" + strconv.Itoa(port),
		"--tls-cert-file=" + p.controlPlane.certFile,
		"--tls-private-key-file=" + p.controlPlane.keyFile,
		"--client-ca-file=" + p.clientCA.certFile,
		"--leader-elect=false",
		"--use-service-account-credentials=true",
		"--service-account-private-key-file=" + p.saKeyFile,
		"--root-ca-file=" + p.ca.certFile,
		"--cluster-name=sandbox",
		"--service-cluster-ip-range=" + ServiceCIDR,
		"--controllers=*",
		// The default 20 QPS makes the start a queue: every controller's
		// credentials cost a few requests of the shared root client.
		"--kube-api-qps=200",
		"--kube-api-burst=400",
		"--profiling=false",
		"--v=1",
	}
}

// schedulerArgs run kube-scheduler with its default profile.
func schedulerArgs(p *pki, kubeconfig string, port int) []string {
	return []string{
		"--kubeconfig=" + kubeconfig,
		"--authentication-kubeconfig=" + kubeconfig,
		"--authorization-kubeconfig=" + kubeconfig,
		"--bind-address=127.0.0.1",
		"--secure-port=" + strconv.Itoa(port),
		"--tls-cert-file=" + p.controlPlane.certFile,
		"--tls-private-key-file=" + p.controlPlane.keyFile,
		"--leader-elect=false",
		"--kube-api-qps=200",
		"--kube-api-burst=400",
		"--profiling=false",
		"--v=1",
	}
}

// startControllers starts kube-controller-manager and kube-scheduler side
// by side and returns once both are healthy and the controllers visibly
// work (the ServiceAccount and root-CA controllers have populated the
// default namespace).
func (s *Sandbox) startControllers(ctx context.Context, logw io.Writer) error {
	tlsConfig, err := adminTLS(s.pki)
	if err != nil {
		return err
	}
	kcmKubeconfig, err := s.componentKubeconfig("kube-controller-manager", s.pki.controllerManager)
	if err != nil {
		return err
	}
	schedKubeconfig, err := s.componentKubeconfig("kube-scheduler", s.pki.scheduler)
	if err != nil {
		return err
	}
	type result struct {
		proc *process
		err  error
	}
	kcm, sched := make(chan result, 1), make(chan result, 1)
	go func() {
		p, _, err := startComponent(ctx, component{
			name: "kube-controller-manager", binary: s.binPath("kube-controller-manager"), dir: s.dir,
			args:   func(port int) []string { return controllerManagerArgs(s.pki, kcmKubeconfig, port) },
			health: "/healthz", tls: tlsConfig,
		}, logw)
		kcm <- result{p, err}
	}()
	go func() {
		p, _, err := startComponent(ctx, component{
			name: "kube-scheduler", binary: s.binPath("kube-scheduler"), dir: s.dir,
			args:   func(port int) []string { return schedulerArgs(s.pki, schedKubeconfig, port) },
			health: "/healthz", tls: tlsConfig,
		}, logw)
		sched <- result{p, err}
	}()
	k, sc := <-kcm, <-sched
	s.controllerManager, s.scheduler = k.proc, sc.proc
	if k.err != nil {
		return k.err
	}
	if sc.err != nil {
		return sc.err
	}
	return s.waitControllersWorking(ctx)
}

// waitControllersWorking waits for objects only controllers create: the
// ServiceAccount "default" and the ConfigMap "kube-root-ca.crt" in the
// default namespace.
func (s *Sandbox) waitControllersWorking(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	for {
		_, errSA := s.client.CoreV1().ServiceAccounts(metav1.NamespaceDefault).Get(ctx, "default", metav1.GetOptions{})
		_, errCM := s.client.CoreV1().ConfigMaps(metav1.NamespaceDefault).Get(ctx, "kube-root-ca.crt", metav1.GetOptions{})
		if errSA == nil && errCM == nil {
			return nil
		}
		for _, err := range []error{errSA, errCM} {
			if err != nil && !apierrors.IsNotFound(err) && ctx.Err() == nil {
				return fmt.Errorf("waiting for the controllers: %w", err)
			}
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("kube-controller-manager did not create ServiceAccount default/default and ConfigMap default/kube-root-ca.crt (see %s): %w", s.controllerManager.logPath, ctx.Err())
		case <-time.After(100 * time.Millisecond):
		}
	}
}
