package agenttls

import (
	"bytes"
	"context"
	"crypto/tls"
	"fmt"
	"log/slog"
	"net"
	"slices"
	"sync"
	"time"

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
	// Now is the clock; nil is time.Now.
	Now func() time.Time
}

// Current is the CA the agent port serves certificates of now. It follows
// the CA Secret (Refresh, called by the server's key loop): a CA replaced by hand, or made anew after a restore of
// the cluster removed its Secret (snapshot.RevokeServerKeys), since every
// backup of the cluster holds the CA's key.
type Current struct {
	o       Options
	r       *renewing
	dns     []string
	ips     []net.IP
	pending []string // namespaces the CA is not published in yet
	mu      sync.Mutex
}

// CA is the CA in force.
func (c *Current) CA() *CA {
	c.r.mu.Lock()
	defer c.r.mu.Unlock()
	return c.r.ca
}

// Publish writes the CA in force into namespace's ConfigMap (Publish).
func (c *Current) Publish(ctx context.Context, namespace string) error {
	return Publish(ctx, c.o.Client, namespace, c.CA().CertPEM)
}

// Refresh reads the CA Secret again (making a new CA when it is gone):
// a CA other than the one in force is used from the next handshake on
// and published in every agent namespace. It says whether it changed.
// Agents started before trust the old CA and fail to connect: after a
// restore of the cluster those are agents of the past.
func (c *Current) Refresh(ctx context.Context) (bool, error) {
	ca, err := EnsureCA(ctx, c.o.Client, c.o.Namespace, c.now())
	if err != nil {
		return false, err
	}
	if bytes.Equal(ca.CertPEM, c.CA().CertPEM) {
		c.publishPending(ctx)
		return false, nil
	}
	cert, err := ca.ServingCert(c.dns, c.ips, c.now())
	if err != nil {
		return false, err
	}
	c.r.mu.Lock()
	c.r.ca, c.r.cur = ca, &cert
	c.r.mu.Unlock()
	c.mu.Lock()
	c.pending = append([]string{c.o.Namespace}, c.o.AgentNamespaces...)
	c.mu.Unlock()
	c.publishPending(ctx)
	return true, nil
}

func (c *Current) now() time.Time {
	if c.o.Now != nil {
		return c.o.Now()
	}
	return time.Now()
}

// publishPending publishes the CA in force where it is not yet.
func (c *Current) publishPending(ctx context.Context) {
	c.mu.Lock()
	defer c.mu.Unlock()
	pem := c.CA().CertPEM
	c.pending = slices.DeleteFunc(slices.Compact(c.pending), func(ns string) bool {
		err := Publish(ctx, c.o.Client, ns, pem)
		if err != nil && c.o.Logger != nil {
			c.o.Logger.Warn("cannot publish the agent CA yet; agents there cannot verify the server until it is", "namespace", ns, "error", err.Error())
		}
		return err == nil
	})
}

// Setup makes the agent listener's TLS configuration: it reads or creates
// the CA, issues the serving certificate and publishes the CA certificate
// in the server's namespace (an error if that fails) and in the others
// (one that refuses, missing or not yet allowed, is tried again until it
// succeeds: restore Jobs there cannot start until then, and
// Current.Refresh tries again). The caller follows the CA Secret by
// calling Current.Refresh, which also publishes where it was refused.
func Setup(ctx context.Context, o Options) (*tls.Config, *Current, error) {
	c := &Current{o: o}
	ca, err := EnsureCA(ctx, o.Client, o.Namespace, c.now())
	if err != nil {
		return nil, nil, err
	}
	c.dns, c.ips = HostsFor(o.Namespace, o.ServerAddresses...)
	cert, err := ca.ServingCert(c.dns, c.ips, c.now())
	if err != nil {
		return nil, nil, err
	}
	if err := Publish(ctx, o.Client, o.Namespace, ca.CertPEM); err != nil {
		return nil, nil, err
	}
	cfg, r := ca.renewingServerConfig(cert, c.dns, c.ips, c.now)
	c.r = r
	for _, ns := range o.AgentNamespaces {
		if ns != o.Namespace {
			c.pending = append(c.pending, ns)
		}
	}
	c.publishPending(ctx)
	return cfg, c, nil
}

// Describe says what the serving certificate covers, for the server's log.
func Describe(cfg *tls.Config) string {
	if cfg == nil || len(cfg.Certificates) == 0 || cfg.Certificates[0].Leaf == nil {
		return "plaintext"
	}
	l := cfg.Certificates[0].Leaf
	return fmt.Sprintf("TLS for %v %v until %s", l.DNSNames, l.IPAddresses, l.NotAfter.UTC().Format(time.RFC3339))
}
