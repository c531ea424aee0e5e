package agenttls

import (
	"context"
	"crypto/tls"
	"fmt"
	"log/slog"
	"slices"
	"time"

	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
)

// Options are what Setup needs.
type Options struct {
	Client kubernetes.Interface
	// Namespace is the server's: the CA Secret's, and backup agents'.
	Namespace string
	// AgentNamespaces are the other namespaces agents run in (restore
	// namespaces); each gets the CA ConfigMap.
	AgentNamespaces []string
	// ServerAddresses are the HOST:PORT agents are told to dial
	// (agents.serverAddress): the serving certificate covers their hosts.
	ServerAddresses []string
	Logger          *slog.Logger
	// RetryInterval is how often publishing to a namespace that refused is
	// tried again; 0 means 30 s.
	RetryInterval time.Duration
	// Now is the clock; nil is time.Now.
	Now func() time.Time
}

// Setup makes the agent listener's TLS configuration: it reads or creates
// the CA, issues the serving certificate and publishes the CA certificate
// in the server's namespace (an error if that fails) and in the others
// (one that refuses, missing or not yet allowed, is tried again in the
// background until ctx ends: restore Jobs there cannot start until it
// succeeds).
func Setup(ctx context.Context, o Options) (*tls.Config, *CA, error) {
	now := time.Now
	if o.Now != nil {
		now = o.Now
	}
	ca, err := EnsureCA(ctx, o.Client, o.Namespace, now())
	if err != nil {
		return nil, nil, err
	}
	dns, ips := HostsFor(o.Namespace, o.ServerAddresses...)
	cert, err := ca.ServingCert(dns, ips, now())
	if err != nil {
		return nil, nil, err
	}
	if err := Publish(ctx, o.Client, o.Namespace, ca.CertPEM); err != nil {
		return nil, nil, err
	}
	var pending []string
	for _, ns := range o.AgentNamespaces {
		if ns == o.Namespace || slices.Contains(pending, ns) {
			continue
		}
		if err := Publish(ctx, o.Client, ns, ca.CertPEM); err != nil {
			pending = append(pending, ns)
			if o.Logger != nil {
				o.Logger.Warn("cannot publish the agent CA yet; restore agents there cannot verify the server until it is", "namespace", ns, "error", err.Error())
			}
		}
	}
	if len(pending) > 0 {
		go retryPublish(ctx, o, ca.CertPEM, pending)
	}
	return ca.RenewingServerConfig(cert, dns, ips, now), ca, nil
}

func retryPublish(ctx context.Context, o Options, certPEM []byte, pending []string) {
	interval := o.RetryInterval
	if interval == 0 {
		interval = 30 * time.Second
	}
	_ = wait.PollUntilContextCancel(ctx, interval, false, func(ctx context.Context) (bool, error) {
		pending = slices.DeleteFunc(pending, func(ns string) bool {
			err := Publish(ctx, o.Client, ns, certPEM)
			if err == nil && o.Logger != nil {
				o.Logger.Info("agent CA published", "namespace", ns)
			}
			return err == nil
		})
		return len(pending) == 0, nil
	})
}

// Describe says what the serving certificate covers, for the server's log.
func Describe(cfg *tls.Config) string {
	if cfg == nil || len(cfg.Certificates) == 0 || cfg.Certificates[0].Leaf == nil {
		return "plaintext"
	}
	l := cfg.Certificates[0].Leaf
	return fmt.Sprintf("TLS for %v %v until %s", l.DNSNames, l.IPAddresses, l.NotAfter.UTC().Format(time.RFC3339))
}
