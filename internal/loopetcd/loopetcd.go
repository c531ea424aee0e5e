// Package loopetcd rebuilds a one-member etcd from a plain snapshot,
// keeping its revision, and serves it on loopback only: the throwaway
// member a restore drill asks questions of and a delta replay writes
// into. Nothing outside the process can reach it and nothing it writes
// needs to survive a crash.
//
// The member serves TLS with client-certificate authentication, from a
// CA made for it alone (see Member.Config): a snapshot of an etcd with
// authentication enabled keeps it enabled when restored, and the
// client's certificate names etcd's root user, so the member answers a
// backup with auth exactly as one without.
package loopetcd

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"sync"
	"syscall"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/server/v3/embed"
	"go.uber.org/zap"

	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/snapshot"
)

// Options say what to serve and where.
type Options struct {
	// Snapshot is a plain etcd snapshot file.
	Snapshot string
	// DataDir is the member's data directory; it must not exist or be
	// empty. Its parent also holds etcd.log and, while the member runs,
	// its throwaway TLS files.
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
	// QuotaBackendBytes is the member's backend quota (etcd's
	// --quota-backend-bytes): a write that would grow the database past
	// it fails with "database space exceeded". 0 sizes it to the
	// snapshot alone, Quota(snapshot size, 0), or MaxQuotaBytes for a
	// snapshot larger than that (enough to read it); a member that is
	// written to is given Quota of what it will hold.
	QuotaBackendBytes int64
}

// Quota bounds.
const (
	// DefaultQuotaBytes is etcd's default backend quota, the least a
	// scratch member gets.
	DefaultQuotaBytes int64 = 2 << 30
	// MaxQuotaBytes is etcd's suggested maximum database size, the most
	// a scratch member gets (etcd warns above it and degrades).
	MaxQuotaBytes int64 = 8 << 30
)

// ErrTooLarge is returned (wrapped) by Quota when the work does not fit
// in a scratch etcd.
var ErrTooLarge = errors.New("too large for a scratch etcd")

// Quota is the backend quota of a scratch member that restores a base
// snapshot of baseBytes and has deltaBytes written into it (a replay:
// the plain delta segments' sizes; 0 for a drill): twice what it will
// hold — room for the new revisions' pages and the free pages bolt does
// not give back — but at least etcd's default of 2 GiB and at most its
// suggested maximum of 8 GiB. Every caller sizes its member with it, so
// they agree. More than 8 GiB of work is an error saying what to do.
func Quota(baseBytes, deltaBytes int64) (int64, error) {
	baseBytes, deltaBytes = max(0, baseBytes), max(0, deltaBytes)
	work := baseBytes + deltaBytes
	if work > MaxQuotaBytes {
		if deltaBytes == 0 {
			return 0, fmt.Errorf("%w: the snapshot is %s, more than etcd's suggested maximum database size of %s (the largest backend quota a scratch etcd gets): "+
				"compact and defragment the source etcd (etcdctl compact, etcdctl defrag) and take a new backup", ErrTooLarge, bytesString(baseBytes), bytesString(MaxQuotaBytes))
		}
		return 0, fmt.Errorf("%w: replaying %s of delta segments onto a %s snapshot makes %s, more than etcd's suggested maximum database size of %s (the largest backend quota a scratch etcd gets): "+
			"restore to a point nearer a full backup, or replay less per full (take full backups more often or fold chains sooner: deltas.compactAfterRevisions); "+
			"compacting and defragmenting the source etcd makes its snapshots smaller",
			ErrTooLarge, bytesString(deltaBytes), bytesString(baseBytes), bytesString(work), bytesString(MaxQuotaBytes))
	}
	return min(MaxQuotaBytes, max(DefaultQuotaBytes, 2*work)), nil
}

func bytesString(n int64) string {
	switch {
	case n >= 1<<30:
		return fmt.Sprintf("%.1f GiB", float64(n)/(1<<30))
	case n >= 1<<20:
		return fmt.Sprintf("%.1f MiB", float64(n)/(1<<20))
	}
	return fmt.Sprintf("%d bytes", n)
}

// Member is a served member.
type Member struct {
	// Endpoint is its client URL (TLS on 127.0.0.1, with client
	// certificates from the member's own CA only: use Config or Client).
	Endpoint string
	// Client is connected to the member as etcd's root user (Config);
	// Close closes it.
	Client *clientv3.Client

	e               *embed.Etcd
	tls             *memberTLS
	tlsDir          string
	maxRequestBytes uint
	closeOnce       sync.Once
}

// Config is a client configuration for the member: its endpoint, its
// CA and the client certificate that authenticates as etcd's root user
// (RootUser), with message size limits that fit Options.MaxRequestBytes.
// Callers may set more fields (Context, timeouts).
func (m *Member) Config() clientv3.Config {
	cfg := clientv3.Config{
		Endpoints: []string{m.Endpoint}, DialTimeout: 10 * time.Second, Logger: zap.NewNop(),
		TLS: m.tls.client.Clone(),
	}
	if m.maxRequestBytes > 0 {
		cfg.MaxCallSendMsgSize = int(m.maxRequestBytes) + (1 << 20)
		cfg.MaxCallRecvMsgSize = int(m.maxRequestBytes) + (1 << 20)
	}
	return cfg
}

// Close stops the member and removes its TLS files; calling it again
// does nothing.
func (m *Member) Close() {
	m.closeOnce.Do(func() {
		if m.Client != nil {
			m.Client.Close()
		}
		m.e.Close()
		_ = os.RemoveAll(m.tlsDir)
	})
}

// Start restores o.Snapshot into o.DataDir with etcd's restore code,
// without a revision bump (the member holds the snapshot's revision
// exactly), and serves it.
func Start(ctx context.Context, o Options) (*Member, error) {
	quota := o.QuotaBackendBytes
	if quota == 0 {
		st, err := os.Stat(o.Snapshot)
		if err != nil {
			return nil, fmt.Errorf("the snapshot to serve: %w", err)
		}
		if quota, err = Quota(st.Size(), 0); err != nil {
			// Enough to read it (a drill writes nothing).
			quota = MaxQuotaBytes
		}
	}
	peer, err := pickLoopbackURL("http")
	if err != nil {
		return nil, err
	}
	const name = "loopback"
	noBump := int64(0)
	sm := snapshot.Member{
		Name: name, DataDir: o.DataDir, BumpRevision: &noBump,
		InitialCluster:           name + "=" + peer.String(),
		InitialAdvertisePeerURLs: []string{peer.String()},
	}
	if _, err := snapshot.Restore(o.Snapshot, sm); err != nil {
		return nil, err
	}
	if o.RemoveSnapshot {
		_ = os.Remove(o.Snapshot)
	}

	tlsDir, err := os.MkdirTemp(filepath.Dir(o.DataDir), "loopetcd-tls-")
	if err != nil {
		return nil, fmt.Errorf("a directory for the restored member's TLS files: %w", err)
	}
	mtls, err := newMemberTLS(tlsDir)
	if err != nil {
		_ = os.RemoveAll(tlsDir)
		return nil, fmt.Errorf("TLS certificates for the restored member: %w", err)
	}
	cfg := embed.NewConfig()
	cfg.Name, cfg.Dir = name, o.DataDir
	cfg.Logger, cfg.LogLevel = "zap", "error"
	cfg.LogOutputs = []string{filepath.Join(filepath.Dir(o.DataDir), "etcd.log")}
	cfg.AdvertisePeerUrls = []url.URL{peer}
	cfg.ListenMetricsUrls = nil
	cfg.InitialCluster = sm.InitialCluster
	// Only clients holding a certificate of the member's own CA: the
	// one Config gives. No HTTP gateway: nothing uses it.
	cfg.ClientTLSInfo = mtls.server
	cfg.EnableGRPCGateway = false
	cfg.QuotaBackendBytes = quota
	if o.MaxTxnOps > 0 {
		cfg.MaxTxnOps = o.MaxTxnOps
	}
	if o.MaxRequestBytes > 0 {
		cfg.MaxRequestBytes = o.MaxRequestBytes
	}
	// The member is thrown away: nothing it writes needs to survive a crash.
	cfg.UnsafeNoFsync = true
	// The ports are picked free, then bound by etcd: another process may
	// take one in between, on a busy machine. etcd binds before it reads
	// the data, so it is started again on new ports; the member listens
	// for peers on any port (it has none), advertising the one its
	// restored membership records.
	var e *embed.Etcd
	var clientURL url.URL
	listenPeer := peer
	for attempt := 1; ; attempt++ {
		if clientURL, err = pickLoopbackURL("https"); err != nil {
			_ = os.RemoveAll(tlsDir)
			return nil, err
		}
		cfg.ListenPeerUrls = []url.URL{listenPeer}
		cfg.ListenClientUrls, cfg.AdvertiseClientUrls = []url.URL{clientURL}, []url.URL{clientURL}
		if e, err = embed.StartEtcd(cfg); err == nil {
			break
		}
		if !errors.Is(err, syscall.EADDRINUSE) || attempt == maxStartAttempts {
			_ = os.RemoveAll(tlsDir)
			return nil, fmt.Errorf("start etcd on the restored data: %w", err)
		}
		if listenPeer, err = pickLoopbackURL("http"); err != nil {
			_ = os.RemoveAll(tlsDir)
			return nil, err
		}
	}
	m := &Member{Endpoint: clientURL.String(), e: e, tls: mtls, tlsDir: tlsDir, maxRequestBytes: o.MaxRequestBytes}
	timeout := o.StartTimeout
	if timeout <= 0 {
		timeout = 2 * time.Minute
	}
	select {
	case <-e.Server.ReadyNotify():
		if err = m.connect(ctx); err == nil {
			return m, nil
		}
	case err = <-e.Err():
		err = fmt.Errorf("etcd on the restored data stopped: %w", err)
	case <-time.After(timeout):
		err = fmt.Errorf("etcd on the restored data did not serve within %s", timeout)
	case <-ctx.Done():
		err = ctx.Err()
	}
	m.Close()
	return nil, err
}

// connect opens m.Client and disarms a NOSPACE alarm the snapshot
// carries: the source had run out of its own quota when it was taken,
// which would leave this member, with a quota of its own, read-only.
func (m *Member) connect(ctx context.Context) error {
	c, err := clientv3.New(m.Config())
	if err != nil {
		return fmt.Errorf("connect to the restored member: %w", err)
	}
	m.Client = c
	actx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	alarms, err := c.AlarmList(actx)
	if err != nil {
		return fmt.Errorf("list the restored member's alarms: %w", err)
	}
	for _, a := range alarms.Alarms {
		if a.Alarm != pb.AlarmType_NOSPACE {
			continue
		}
		if _, err := c.AlarmDisarm(actx, (*clientv3.AlarmMember)(a)); err != nil {
			return fmt.Errorf("disarm the NOSPACE alarm the snapshot carries: %w", err)
		}
	}
	return nil
}

// maxStartAttempts is how many times Start picks new ports when one it
// picked was taken before etcd bound it.
const maxStartAttempts = 5

// pickLoopbackURL is freeLoopbackURL; a test makes it pick a taken port.
var pickLoopbackURL = freeLoopbackURL

func freeLoopbackURL(scheme string) (url.URL, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return url.URL{}, fmt.Errorf("a loopback port for the restored member: %w", err)
	}
	defer l.Close()
	return url.URL{Scheme: scheme, Host: l.Addr().String()}, nil
}
