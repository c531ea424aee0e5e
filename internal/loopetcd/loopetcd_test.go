package loopetcd_test

import (
	"context"
	"crypto/tls"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	clientsnapshot "go.etcd.io/etcd/client/v3/snapshot"
	"go.uber.org/zap"

	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/internal/etcdtest"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/internal/loopetcd"
)

func TestQuota(t *testing.T) {
	const gib = int64(1) << 30
	for _, tc := range []struct {
		base, deltas, want int64
	}{
		{0, 0, 2 * gib},
		{100 << 20, 0, 2 * gib},
		{gib, 0, 2 * gib},
		{gib, gib / 2, 3 * gib},
		{3 * gib, gib, 8 * gib},
		{6 * gib, 2 * gib, 8 * gib},
	} {
		got, err := loopetcd.Quota(tc.base, tc.deltas)
		if err != nil || got != tc.want {
			t.Errorf("Quota(%d, %d) = %d, %v; want %d", tc.base, tc.deltas, got, err, tc.want)
		}
	}
	_, err := loopetcd.Quota(7*gib, 2*gib)
	if !errors.Is(err, loopetcd.ErrTooLarge) || !strings.Contains(err.Error(), "2.0 GiB of delta segments onto a 7.0 GiB snapshot makes 9.0 GiB") ||
		!strings.Contains(err.Error(), "restore to a point nearer a full backup") {
		t.Errorf("9 GiB of work: %v", err)
	}
	_, err = loopetcd.Quota(9*gib, 0)
	if !errors.Is(err, loopetcd.ErrTooLarge) || !strings.Contains(err.Error(), "the snapshot is 9.0 GiB") || !strings.Contains(err.Error(), "etcdctl defrag") {
		t.Errorf("a 9 GiB snapshot: %v", err)
	}
}

func start(t *testing.T, o loopetcd.Options) *loopetcd.Member {
	t.Helper()
	o.DataDir = filepath.Join(t.TempDir(), "member")
	m, err := loopetcd.Start(context.Background(), o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(m.Close)
	return m
}

func save(t *testing.T, cfg clientv3.Config) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	path := filepath.Join(t.TempDir(), "snapshot.db")
	if _, err := clientsnapshot.SaveWithVersion(ctx, zap.NewNop(), cfg, path); err != nil {
		t.Fatalf("snapshot: %v", err)
	}
	return path
}

// TestQuotaApplied: the member gets the quota asked for — a write past a
// small one fails as etcd's own does, the same write within Quota's
// succeeds — and a NOSPACE alarm a snapshot carries does not leave the
// member it is restored into read-only.
func TestQuotaApplied(t *testing.T) {
	ctx := context.Background()
	base := filepath.Join(t.TempDir(), "base.db")
	etcdtest.SnapshotFile(t, base, 0)
	big := strings.Repeat("x", 2<<20)

	// etcd counts the database file (28 KiB restored from an empty
	// snapshot) and each write against the quota.
	small := start(t, loopetcd.Options{Snapshot: base, QuotaBackendBytes: 1 << 20, MaxRequestBytes: 8 << 20})
	if st, err := small.Client.Status(ctx, small.Endpoint); err != nil || st.DbSizeQuota != 1<<20 {
		t.Fatalf("status: %v, %v; want a quota of 1 MiB", st, err)
	}
	if _, err := small.Client.Put(ctx, "/small", "v"); err != nil {
		t.Fatalf("a small write within a 1 MiB quota: %v", err)
	}
	_, err := small.Client.Put(ctx, "/big", big)
	if !errors.Is(err, rpctypes.ErrNoSpace) || !strings.Contains(err.Error(), "database space exceeded") {
		t.Fatalf("2 MiB written past a 1 MiB quota: %v, want database space exceeded", err)
	}
	// etcd raised its NOSPACE alarm: the snapshot carries it.
	alarmed := save(t, small.Config())

	st, err := os.Stat(alarmed)
	if err != nil {
		t.Fatal(err)
	}
	quota, err := loopetcd.Quota(st.Size(), int64(len(big)))
	if err != nil || quota != loopetcd.DefaultQuotaBytes {
		t.Fatalf("Quota: %d, %v", quota, err)
	}
	roomy := start(t, loopetcd.Options{Snapshot: alarmed, QuotaBackendBytes: quota, MaxRequestBytes: 8 << 20})
	if _, err := roomy.Client.Put(ctx, "/big", big); err != nil {
		t.Fatalf("2 MiB written within a %d-byte quota: %v", quota, err)
	}
	if r, err := roomy.Client.Get(ctx, "/small"); err != nil || len(r.Kvs) != 1 {
		t.Fatalf("the restored key: %v %v", r, err)
	}
}

// TestAuthEnabled restores a snapshot of an etcd with authentication
// enabled: everything a drill, a replay and a fold ask of the member
// works through its client, as etcd's root user.
func TestAuthEnabled(t *testing.T) {
	ctx := context.Background()
	src := etcdtest.Start(t, false)
	c := src.Client(t)
	if _, err := c.Put(ctx, "/before-auth", "1"); err != nil {
		t.Fatal(err)
	}
	if _, err := c.UserAdd(ctx, "root", "s3cret"); err != nil {
		t.Fatal(err)
	}
	if _, err := c.RoleAdd(ctx, "root"); err != nil {
		t.Fatal(err)
	}
	if _, err := c.UserGrantRole(ctx, "root", "root"); err != nil {
		t.Fatal(err)
	}
	if _, err := c.AuthEnable(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Put(ctx, "/after-auth", "x"); !errors.Is(err, rpctypes.ErrUserEmpty) {
		t.Fatalf("a write without a user on the source after auth enable: %v, want %v", err, rpctypes.ErrUserEmpty)
	}
	cfg := src.Config(t)
	cfg.Username, cfg.Password = "root", "s3cret"
	root, err := clientv3.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer root.Close()
	for _, k := range []string{"/a", "/b", "/a"} {
		if _, err := root.Put(ctx, k, "v"); err != nil {
			t.Fatal(err)
		}
	}
	snap := save(t, cfg)
	srcRev, err := root.Get(ctx, "/a")
	if err != nil {
		t.Fatal(err)
	}
	rev := srcRev.Header.Revision

	m := start(t, loopetcd.Options{Snapshot: snap})
	if !strings.HasPrefix(m.Endpoint, "https://127.0.0.1:") {
		t.Errorf("endpoint %s: want TLS on loopback", m.Endpoint)
	}
	as, err := m.Client.AuthStatus(ctx)
	if err != nil || !as.Enabled {
		t.Fatalf("auth status of the restored member: %+v, %v; want enabled", as, err)
	}
	got, err := m.Client.Get(ctx, "\x00", clientv3.WithFromKey(), clientv3.WithCountOnly())
	if err != nil || got.Header.Revision != rev || got.Count != 3 {
		t.Fatalf("count: %+v, %v; want 3 keys at revision %d", got, err, rev)
	}
	put, err := m.Client.Put(ctx, "/replayed", "r")
	if err != nil || put.Header.Revision != rev+1 {
		t.Fatalf("put: %+v, %v", put, err)
	}
	lease, err := m.Client.Grant(ctx, 60)
	if err != nil {
		t.Fatalf("lease grant: %v", err)
	}
	if _, err := m.Client.Put(ctx, "/leased", "l", clientv3.WithLease(lease.ID)); err != nil {
		t.Fatalf("leased put: %v", err)
	}
	if _, err := m.Client.Compact(ctx, rev+1, clientv3.WithCompactPhysical()); err != nil {
		t.Fatalf("compact: %v", err)
	}
	if _, err := m.Client.Get(ctx, "/a", clientv3.WithRev(rev)); !errors.Is(err, rpctypes.ErrCompacted) {
		t.Fatalf("get below the compaction: %v, want %v", err, rpctypes.ErrCompacted)
	}
	if _, err := m.Client.HashKV(ctx, m.Endpoint, rev+1); err != nil {
		t.Fatalf("HashKV: %v", err)
	}
	if _, err := m.Client.Defragment(ctx, m.Endpoint); err != nil {
		t.Fatalf("defragment: %v", err)
	}
	out := save(t, m.Config())

	// The member's own snapshot serves again, auth still on.
	again := start(t, loopetcd.Options{Snapshot: out, RemoveSnapshot: true})
	r, err := again.Client.Get(ctx, "/replayed")
	if err != nil || len(r.Kvs) != 1 || string(r.Kvs[0].Value) != "r" || r.Header.Revision != rev+2 {
		t.Fatalf("get from the member's snapshot: %+v, %v", r, err)
	}
	if _, err := os.Stat(out); !os.IsNotExist(err) {
		t.Errorf("RemoveSnapshot left %s: %v", out, err)
	}

	// Nothing without the member's client certificate gets in.
	bare := m.Config()
	bare.TLS = &tls.Config{RootCAs: bare.TLS.RootCAs, MinVersion: tls.VersionTLS12}
	bare.DialTimeout = 2 * time.Second
	if stranger, err := clientv3.New(bare); err == nil {
		sctx, cancel := context.WithTimeout(ctx, 3*time.Second)
		_, err = stranger.Get(sctx, "/a")
		cancel()
		stranger.Close()
		if err == nil {
			t.Error("a client without the member's certificate read a key")
		}
	}
}

// TestWithoutAuth: a snapshot of an etcd without authentication serves
// as before, through the member's client, and Close removes the TLS
// files.
func TestWithoutAuth(t *testing.T) {
	ctx := context.Background()
	base := filepath.Join(t.TempDir(), "base.db")
	etcdtest.SnapshotFile(t, base, 64<<10)
	dir := t.TempDir()
	m, err := loopetcd.Start(ctx, loopetcd.Options{Snapshot: base, DataDir: filepath.Join(dir, "member")})
	if err != nil {
		t.Fatal(err)
	}
	as, err := m.Client.AuthStatus(ctx)
	if err != nil || as.Enabled {
		t.Fatalf("auth status: %+v, %v; want disabled", as, err)
	}
	n, err := m.Client.Get(ctx, "/fill/", clientv3.WithPrefix(), clientv3.WithCountOnly())
	if err != nil || n.Count == 0 {
		t.Fatalf("count: %+v, %v", n, err)
	}
	if _, err := m.Client.Put(ctx, "/x", "y"); err != nil {
		t.Fatal(err)
	}
	m.Close()
	m.Close()
	tlsDirs, _ := filepath.Glob(filepath.Join(dir, "loopetcd-tls-*"))
	if len(tlsDirs) != 0 {
		t.Errorf("TLS files left after Close: %v", tlsDirs)
	}
}
