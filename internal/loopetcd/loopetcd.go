// Package loopetcd rebuilds a one-member etcd from a plain snapshot,
// keeping its revision, and serves it on loopback only: the throwaway
// member a restore drill asks questions of and a delta replay writes
// into. Nothing outside the process can reach it and nothing it writes
// needs to survive a crash.
package loopetcd

import (
	"context"
	"fmt"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"time"

	"go.etcd.io/etcd/server/v3/embed"

	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/snapshot"
)

// Options say what to serve and where.
type Options struct {
	// Snapshot is a plain etcd snapshot file.
	Snapshot string
	// DataDir is the member's data directory; it must not exist or be
	// empty. Its parent also holds etcd.log.
	DataDir string
	// RemoveSnapshot removes Snapshot once restored, so that the scratch
	// space holds one copy of the data at a time.
	RemoveSnapshot bool
	// StartTimeout bounds how long the member may take to serve (default
	// two minutes).
	StartTimeout time.Duration
	// MaxTxnOps and MaxRequestBytes raise etcd's limits on one request
	// (0: etcd's defaults, 128 operations and 1.5 MiB). A replay writes
	// each revision as one transaction, which can be as large as the
	// source's biggest (a lease revoked with its thousands of keys).
	MaxTxnOps, MaxRequestBytes uint
}

// Member is a served member.
type Member struct {
	// Endpoint is its client URL (plain HTTP on 127.0.0.1).
	Endpoint string
	e        *embed.Etcd
}

// Close stops the member.
func (m *Member) Close() { m.e.Close() }

// Start restores o.Snapshot into o.DataDir with etcd's restore code,
// without a revision bump (the member holds the snapshot's revision
// exactly), and serves it.
func Start(ctx context.Context, o Options) (*Member, error) {
	peer, err := freeLoopbackURL()
	if err != nil {
		return nil, err
	}
	const name = "loopback"
	noBump := int64(0)
	m := snapshot.Member{
		Name: name, DataDir: o.DataDir, BumpRevision: &noBump,
		InitialCluster:           name + "=" + peer.String(),
		InitialAdvertisePeerURLs: []string{peer.String()},
	}
	if _, err := snapshot.Restore(o.Snapshot, m); err != nil {
		return nil, err
	}
	if o.RemoveSnapshot {
		_ = os.Remove(o.Snapshot)
	}

	clientURL, err := freeLoopbackURL()
	if err != nil {
		return nil, err
	}
	cfg := embed.NewConfig()
	cfg.Name, cfg.Dir = name, o.DataDir
	cfg.Logger, cfg.LogLevel = "zap", "error"
	cfg.LogOutputs = []string{filepath.Join(filepath.Dir(o.DataDir), "etcd.log")}
	cfg.ListenPeerUrls, cfg.AdvertisePeerUrls = []url.URL{peer}, []url.URL{peer}
	cfg.ListenClientUrls, cfg.AdvertiseClientUrls = []url.URL{clientURL}, []url.URL{clientURL}
	cfg.ListenMetricsUrls = nil
	cfg.InitialCluster = m.InitialCluster
	if o.MaxTxnOps > 0 {
		cfg.MaxTxnOps = o.MaxTxnOps
	}
	if o.MaxRequestBytes > 0 {
		cfg.MaxRequestBytes = o.MaxRequestBytes
	}
	// The member is thrown away: nothing it writes needs to survive a crash.
	cfg.UnsafeNoFsync = true
	e, err := embed.StartEtcd(cfg)
	if err != nil {
		return nil, fmt.Errorf("start etcd on the restored data: %w", err)
	}
	timeout := o.StartTimeout
	if timeout <= 0 {
		timeout = 2 * time.Minute
	}
	select {
	case <-e.Server.ReadyNotify():
		return &Member{Endpoint: clientURL.String(), e: e}, nil
	case err = <-e.Err():
		err = fmt.Errorf("etcd on the restored data stopped: %w", err)
	case <-time.After(timeout):
		err = fmt.Errorf("etcd on the restored data did not serve within %s", timeout)
	case <-ctx.Done():
		err = ctx.Err()
	}
	e.Close()
	return nil, err
}

func freeLoopbackURL() (url.URL, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return url.URL{}, fmt.Errorf("a loopback port for the restored member: %w", err)
	}
	defer l.Close()
	return url.URL{Scheme: "http", Host: l.Addr().String()}, nil
}
