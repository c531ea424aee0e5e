package e2e

import (
	"context"
	"fmt"
	"net"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/server/v3/embed"
	"go.uber.org/zap"

	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/tests/world"
)

// etcdMember is one member of a real etcd cluster run in this process.
type etcdMember struct {
	name, dataDir      string
	clientURL, peerURL url.URL
	e                  *embed.Etcd
}

func freeLoopbackURL(t *testing.T) url.URL {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return url.URL{Scheme: "http", Host: l.Addr().String()}
}

func newMembers(t *testing.T, n int) []*etcdMember {
	dir := t.TempDir()
	var ms []*etcdMember
	for i := 1; i <= n; i++ {
		ms = append(ms, &etcdMember{
			name: fmt.Sprintf("m%d", i), dataDir: filepath.Join(dir, fmt.Sprintf("m%d.etcd", i)),
			clientURL: freeLoopbackURL(t), peerURL: freeLoopbackURL(t),
		})
	}
	t.Cleanup(func() { stopMembers(ms) })
	return ms
}

func initialCluster(ms []*etcdMember) string {
	var parts []string
	for _, m := range ms {
		parts = append(parts, m.name+"="+m.peerURL.String())
	}
	return strings.Join(parts, ",")
}

func endpoints(ms []*etcdMember) []string {
	var eps []string
	for _, m := range ms {
		eps = append(eps, m.clientURL.String())
	}
	return eps
}

// startMembers starts every member concurrently (a new cluster needs a
// quorum to become ready) and waits until all are ready.
func startMembers(t *testing.T, ms []*etcdMember) {
	t.Helper()
	ic := initialCluster(ms)
	errs := make(chan error, len(ms))
	for _, m := range ms {
		cfg := embed.NewConfig()
		cfg.Name, cfg.Dir = m.name, m.dataDir
		cfg.ListenClientUrls, cfg.AdvertiseClientUrls = []url.URL{m.clientURL}, []url.URL{m.clientURL}
		cfg.ListenPeerUrls, cfg.AdvertisePeerUrls = []url.URL{m.peerURL}, []url.URL{m.peerURL}
		cfg.InitialCluster, cfg.InitialClusterToken = ic, "e2e-cluster"
		cfg.LogLevel, cfg.LogOutputs = "error", []string{filepath.Join(filepath.Dir(m.dataDir), m.name+".log")}
		cfg.UnsafeNoFsync = true
		e, err := embed.StartEtcd(cfg)
		if err != nil {
			t.Fatalf("start %s: %v", m.name, err)
		}
		m.e = e
		go func() {
			select {
			case <-e.Server.ReadyNotify():
				errs <- nil
			case err := <-e.Err():
				errs <- err
			case <-time.After(60 * time.Second):
				errs <- fmt.Errorf("%s not ready after 60s", m.name)
			}
		}()
	}
	for range ms {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
}

func stopMembers(ms []*etcdMember) {
	for _, m := range ms {
		if m.e != nil {
			m.e.Close()
			m.e = nil
		}
	}
}

func etcdClient(t *testing.T, ms []*etcdMember) *clientv3.Client {
	t.Helper()
	c, err := clientv3.New(clientv3.Config{Endpoints: endpoints(ms), DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

func put(t *testing.T, c *clientv3.Client, k, v string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := c.Put(ctx, k, v); err != nil {
		t.Fatal(err)
	}
}

func get(t *testing.T, c *clientv3.Client, k string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	r, err := c.Get(ctx, k)
	if err != nil {
		t.Fatal(err)
	}
	if len(r.Kvs) == 0 {
		return ""
	}
	return string(r.Kvs[0].Value)
}

// runAgent runs the real agent binary.
func runAgent(t *testing.T, args ...string) world.Result {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	return world.RunCommand(exec.CommandContext(ctx, filepath.Join(binDir, world.AgentBinary), args...))
}

// The seed's disaster-recovery test with local restore: write foo=1, back
// up, set foo=2, destroy every member's data, restore each member locally
// through the API server, start the cluster again: foo reads 1.
func TestLocalRestoreDisasterRecovery(t *testing.T) {
	c := startCluster(t)
	ms := newMembers(t, 3)
	startMembers(t, ms)
	ec := etcdClient(t, ms)
	put(t, ec, "foo", "1")
	for i := 0; i < 200; i++ {
		put(t, ec, fmt.Sprintf("/bulk/%03d", i), strings.Repeat("x", 1024))
	}

	for _, compression := range []string{"", "zstd"} {
		name := "dr-" + map[string]string{"": "raw", "zstd": "zstd"}[compression]
		r := runAgent(t, "backup", "--server", c.serverAddr(t), "--name", name, "--target", "e2e",
			"--endpoints", strings.Join(endpoints(ms), ","), "--insecure-plaintext", "--compression", compression)
		mustSucceed(t, r, "agent backup")
		r = mustSucceed(t, c.run(t, nil, "etcdbackup", "verify", name), "verify")
		if !strings.Contains(r.Stdout, "is intact") || !strings.Contains(r.Stdout, "keys") {
			t.Fatalf("verify output: %s", r)
		}
	}
	// A copy downloaded while the API server still answered, for restoring
	// one member with --from-file as the runbook does on a dead control plane.
	saved := filepath.Join(t.TempDir(), "saved.db")
	mustSucceed(t, c.run(t, nil, "etcdbackup", "download", "dr-zstd", "-o", saved), "download for later")
	put(t, ec, "foo", "2")
	stopMembers(ms)
	for _, m := range ms {
		if err := os.RemoveAll(m.dataDir); err != nil {
			t.Fatal(err)
		}
	}

	// A data dir that is not empty is refused and left untouched.
	busy := ms[0].dataDir
	if err := os.MkdirAll(busy, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(busy, "precious"), []byte("keep me"), 0o600); err != nil {
		t.Fatal(err)
	}
	restoreArgs := func(m *etcdMember) []string {
		return []string{"etcdbackup", "restore", "dr-zstd", "--local", "--data-dir", m.dataDir, "--member-name", m.name,
			"--initial-cluster", initialCluster(ms), "--initial-advertise-peer-urls", m.peerURL.String(), "--initial-cluster-token", "e2e-cluster"}
	}
	r := mustFail(t, c.run(t, nil, restoreArgs(ms[0])...), "restore into a non-empty data dir")
	if !strings.Contains(r.Stderr, "not empty") || !strings.Contains(r.Stderr, "move-aside") {
		t.Fatalf("non-empty refusal does not explain: %s", r)
	}
	if b, err := os.ReadFile(filepath.Join(busy, "precious")); err != nil || string(b) != "keep me" {
		t.Fatalf("refused restore touched the data dir: %q %v", b, err)
	}
	// With --move-aside it is kept beside, and the restore goes ahead.
	r = mustSucceed(t, c.run(t, nil, append(restoreArgs(ms[0]), "--move-aside")...), "restore --move-aside")
	if !strings.Contains(r.Stderr, "moved to") {
		t.Fatalf("move-aside not reported: %s", r)
	}
	moved, _ := filepath.Glob(busy + ".before-restore-*")
	if len(moved) != 1 {
		t.Fatalf("old data dir not kept: %v", moved)
	}
	mustSucceed(t, c.run(t, nil, restoreArgs(ms[1])...), "restore "+ms[1].name)
	r = mustSucceed(t, c.run(t, nil, append(restoreArgs(ms[2]), "--from-file", saved, "--server", "https://127.0.0.1:1")...), "restore --from-file with no API server")
	if !strings.Contains(r.Stderr, "verified") {
		t.Fatalf("--from-file did not verify: %s", r)
	}

	startMembers(t, ms)
	ec2 := etcdClient(t, ms)
	if got := get(t, ec2, "foo"); got != "1" {
		t.Fatalf("after restore foo = %q, want 1", got)
	}
	if got := get(t, ec2, "/bulk/199"); len(got) != 1024 {
		t.Fatalf("bulk data lost: %d bytes", len(got))
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	list, err := ec2.MemberList(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var got, want []string
	for _, m := range list.Members {
		got = append(got, m.Name+"="+strings.Join(m.PeerURLs, ","))
	}
	for _, m := range ms {
		want = append(want, m.name+"="+m.peerURL.String())
	}
	sort.Strings(got)
	if strings.Join(got, " ") != strings.Join(want, " ") {
		t.Fatalf("member list %v, want %v", got, want)
	}
	for _, ep := range endpoints(ms) {
		if _, err := ec2.Status(ctx, ep); err != nil {
			t.Fatalf("member %s unhealthy: %v", ep, err)
		}
	}
}

// One flipped byte in storage: verify, download and restore all refuse
// the backup and say it is corrupt.
func TestCorruptBackupIsRefused(t *testing.T) {
	c := startCluster(t)
	ms := newMembers(t, 1)
	startMembers(t, ms)
	put(t, etcdClient(t, ms), "foo", "1")
	server := c.serverAddr(t)
	mustSucceed(t, runAgent(t, "backup", "--server", server, "--name", "flip", "--endpoint", ms[0].clientURL.String(), "--insecure-plaintext"), "agent backup")
	mustSucceed(t, c.run(t, nil, "etcdbackup", "verify", "flip"), "verify before the flip")
	// The restore agent rebuilds a member's data dir from the intact backup.
	agentDir := filepath.Join(t.TempDir(), "agent-restored")
	mustSucceed(t, runAgent(t, "restore", "--server", server, "--name", "flip", "--data-dir", agentDir, "--member-name", "m1",
		"--initial-cluster", "m1="+ms[0].peerURL.String(), "--initial-advertise-peer-urls", ms[0].peerURL.String()), "agent restore")
	if _, err := os.Stat(filepath.Join(agentDir, "member", "snap", "db")); err != nil {
		t.Fatalf("agent restore did not build a member data dir: %v", err)
	}

	storage, err := c.sb.VolumePath(context.Background(), world.DefaultNamespace, "etcdbackup-data")
	if err != nil {
		t.Fatal(err)
	}
	data := filepath.Join(storage, "backups", "flip.db")
	b, err := os.ReadFile(data)
	if err != nil {
		t.Fatal(err)
	}
	b[len(b)/2] ^= 0x01
	if err := os.WriteFile(data, b, 0o600); err != nil {
		t.Fatal(err)
	}

	r := mustFail(t, c.run(t, nil, "etcdbackup", "verify", "flip"), "verify of a corrupt backup")
	if !strings.Contains(r.Stderr, "corrupt") {
		t.Errorf("verify: %s", r)
	}
	out := filepath.Join(t.TempDir(), "flip.db")
	r = mustFail(t, c.run(t, nil, "etcdbackup", "download", "flip", "-o", out), "download of a corrupt backup")
	if !strings.Contains(r.Stderr, "does not match the backup's SHA-256") {
		t.Errorf("download: %s", r)
	}
	if _, err := os.Stat(out); !os.IsNotExist(err) {
		t.Error("a corrupt download was put in place")
	}
	dataDir := filepath.Join(t.TempDir(), "restored")
	r = mustFail(t, c.run(t, nil, "etcdbackup", "restore", "flip", "--local", "--data-dir", dataDir, "--member-name", "m1",
		"--initial-cluster", "m1=http://127.0.0.1:2380", "--initial-advertise-peer-urls", "http://127.0.0.1:2380"), "restore of a corrupt backup")
	if !strings.Contains(r.Stderr, "corrupt") {
		t.Errorf("restore: %s", r)
	}
	if _, err := os.Stat(dataDir); !os.IsNotExist(err) {
		t.Error("restore of a corrupt backup created the data dir")
	}
}
