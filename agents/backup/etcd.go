package backup

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"go.etcd.io/etcd/client/pkg/v3/transport"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/internal/grpcbuf"
)

// snapshotBuffers are the receive buffers of every etcd connection: the
// transport's frames (experimental.WithBufferPool), in which the relay
// keeps etcd's messages until they are sent.
var snapshotBuffers = &grpcbuf.Pool{}

// Etcd says how the agent reaches etcd: one member (Endpoint), or the
// cluster's members (Endpoints) of which it picks one.
type Etcd struct {
	Endpoint  string
	Endpoints []string
	// CACert, Cert and Key are files (a mounted Secret): the CA that signed
	// etcd's serving certificate, and the client certificate and key.
	CACert, Cert, Key string
	// InsecurePlaintext allows an http:// endpoint.
	InsecurePlaintext bool
	// InsecureSkipVerify does not verify etcd's serving certificate.
	InsecureSkipVerify bool
	// DialTimeout bounds connecting to and asking each member; 0 is 10 s.
	DialTimeout time.Duration
}

// Connect returns a client of the one member to snapshot and its endpoint:
// Endpoint, or among Endpoints a healthy follower, else the leader. A
// snapshot is one member's state, so the client talks to that member only.
func (e Etcd) Connect(ctx context.Context) (*clientv3.Client, string, error) {
	switch {
	case e.Endpoint != "" && len(e.Endpoints) > 0:
		return nil, "", errors.New("give --endpoint or --endpoints, not both")
	case e.Endpoint == "" && len(e.Endpoints) == 0:
		return nil, "", errors.New("--endpoint or --endpoints is required")
	case e.Endpoint == "":
		return e.choose(ctx)
	}
	c, err := e.connect(e.Endpoint)
	return c, e.Endpoint, err
}

func (e Etcd) timeout() time.Duration {
	if e.DialTimeout == 0 {
		return 10 * time.Second
	}
	return e.DialTimeout
}

// choose snapshots a follower when it can, to spare the leader the load of
// streaming the database.
func (e Etcd) choose(ctx context.Context) (*clientv3.Client, string, error) {
	var leader *clientv3.Client
	var leaderEndpoint string
	var errs []error
	for _, ep := range e.Endpoints {
		c, err := e.connect(ep)
		if err != nil {
			if leader != nil {
				leader.Close()
			}
			return nil, "", err
		}
		sctx, cancel := context.WithTimeout(ctx, e.timeout())
		st, err := c.Status(sctx, ep)
		cancel()
		switch {
		case err != nil:
			errs = append(errs, fmt.Errorf("%s: %w", ep, err))
			c.Close()
		case st.Leader != st.Header.MemberId:
			if leader != nil {
				leader.Close()
			}
			return c, ep, nil
		case leader == nil:
			leader, leaderEndpoint = c, ep
		default:
			c.Close()
		}
	}
	if leader != nil {
		return leader, leaderEndpoint, nil
	}
	return nil, "", fmt.Errorf("no etcd member answered: %w", errors.Join(errs...))
}

func (e Etcd) connect(endpoint string) (*clientv3.Client, error) {
	cfg := clientv3.Config{Endpoints: []string{endpoint}, DialTimeout: e.timeout(), Logger: zap.NewNop(),
		DialOptions: etcdDialOptions()}
	switch {
	case strings.HasPrefix(endpoint, "http://"):
		if !e.InsecurePlaintext {
			return nil, fmt.Errorf("etcd endpoint %s is plain http: pass --insecure-plaintext to allow it, or use https", endpoint)
		}
	case strings.HasPrefix(endpoint, "https://"):
		info := transport.TLSInfo{TrustedCAFile: e.CACert, CertFile: e.Cert, KeyFile: e.Key, InsecureSkipVerify: e.InsecureSkipVerify}
		tlsCfg, err := info.ClientConfig()
		if err != nil {
			return nil, fmt.Errorf("etcd TLS files: %w", err)
		}
		cfg.TLS = tlsCfg
	default:
		return nil, fmt.Errorf("etcd endpoint %q must start with https:// (or http:// with --insecure-plaintext)", endpoint)
	}
	return clientv3.New(cfg)
}
