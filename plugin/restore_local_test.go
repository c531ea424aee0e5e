package plugin

import (
	"context"
	"fmt"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	etcdsnapshot "go.etcd.io/etcd/client/v3/snapshot"
	"go.etcd.io/etcd/server/v3/embed"
	"go.uber.org/zap"

	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/snapshot"
)

func freeURL(t *testing.T) url.URL {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return url.URL{Scheme: "http", Host: l.Addr().String()}
}

// startEtcd runs a real single-member etcd on dataDir, named name with
// peer URL peer, and returns a client to it.
func startEtcd(t *testing.T, dataDir, name string, peer url.URL) *clientv3.Client {
	t.Helper()
	cfg := embed.NewConfig()
	cfg.Name = name
	cfg.Dir = dataDir
	cfg.LogLevel = "error"
	cfg.LogOutputs = []string{filepath.Join(t.TempDir(), "etcd.log")}
	cfg.UnsafeNoFsync = true
	client := freeURL(t)
	cfg.ListenClientUrls, cfg.AdvertiseClientUrls = []url.URL{client}, []url.URL{client}
	cfg.ListenPeerUrls, cfg.AdvertisePeerUrls = []url.URL{peer}, []url.URL{peer}
	cfg.InitialCluster = name + "=" + peer.String()
	e, err := embed.StartEtcd(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(e.Close)
	select {
	case <-e.Server.ReadyNotify():
	case <-time.After(30 * time.Second):
		t.Fatal("etcd not ready")
	}
	c, err := clientv3.New(clientv3.Config{Endpoints: []string{client.String()}, DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// etcdSnapshot writes keys into a real etcd and saves a snapshot of it, as
// `etcdctl snapshot save` does.
func etcdSnapshot(t *testing.T, keys map[string]string) string {
	t.Helper()
	c := startEtcd(t, filepath.Join(t.TempDir(), "data"), "source", freeURL(t))
	ctx := context.Background()
	for k, v := range keys {
		if _, err := c.Put(ctx, k, v); err != nil {
			t.Fatal(err)
		}
	}
	path := filepath.Join(t.TempDir(), "snapshot.db")
	if _, err := etcdsnapshot.SaveWithVersion(ctx, zap.NewNop(), clientv3.Config{Endpoints: c.Endpoints(), Logger: zap.NewNop()}, path); err != nil {
		t.Fatal(err)
	}
	return path
}

// restore --local, end to end: an etcd snapshot uploaded through the
// plugin is downloaded, verified and rebuilt into a data directory that a
// new etcd member starts from, with the keys of the original.
func TestRestoreLocalRebuildsDataDir(t *testing.T) {
	addr := startServer(t)
	snap := etcdSnapshot(t, map[string]string{"/registry/foo": "1", "/registry/bar": "2"})
	st, err := snapshot.Check(snap)
	if err != nil {
		t.Fatal(err)
	}
	mustRun(t, addr, "upload", snap, "--name", "snap")

	dataDir := filepath.Join(t.TempDir(), "etcd")
	peer := freeURL(t)
	cluster := "m1=" + peer.String()
	args := []string{addr, "restore", "snap", "--local", "--data-dir", dataDir, "--member-name", "m1",
		"--initial-cluster", cluster, "--initial-advertise-peer-urls", peer.String()}
	// Read at the start, the download's last byte, the checks' end and
	// the rebuild's end.
	r := runRestoreAt(t, []time.Duration{0, 41 * time.Second, 47 * time.Second, 83 * time.Second}, args...)
	if r.err != nil {
		t.Fatalf("restore: %v\n%s", r.err, r.errOut)
	}
	want := fmt.Sprintf("restored %q into %s for member %q; start etcd with --data-dir %s --name m1 --initial-cluster %s --initial-advertise-peer-urls %s\n",
		"snap", dataDir, "m1", dataDir, cluster, peer.String()) +
		// Every restore bumps the revision by default.
		fmt.Sprintf("revision bumped by 1000000000 (from %d to %d) and marked compacted (watchers and informers will relist)\n", st.Revision, st.Revision+1_000_000_000) +
		"restored in 1m23s: download 41s, verify 6s, rebuild 36s\n"
	if r.out != want {
		t.Fatalf("restore stdout\n %q\nwant\n %q", r.out, want)
	}
	if !strings.Contains(r.errOut, `backup "snap" verified: sha256 `) || !strings.Contains(r.errOut, "keys") {
		t.Fatalf("restore stderr does not report the verification: %q", r.errOut)
	}
	if _, err := os.Stat(filepath.Join(filepath.Dir(dataDir), ".etcdbackup-restore-snap")); !os.IsNotExist(err) {
		t.Fatalf("work directory left behind: %v", err)
	}

	// A second restore over it is refused, then moved aside on request.
	mustFail(t, "not empty", args...)
	r = mustRun(t, append(args, "--move-aside")...)
	if !strings.Contains(r.errOut, "the old data directory was moved to "+dataDir+".before-restore-") {
		t.Fatalf("--move-aside does not say where the old data went: %q", r.errOut)
	}
	// On the real clock too.
	if !regexp.MustCompile(`\nrestored in [0-9.hms]+: download [0-9.hms]+, verify [0-9.hms]+, rebuild [0-9.hms]+\n$`).MatchString(r.out) {
		t.Fatalf("restore --move-aside does not end with its elapsed time:\n%s", r.out)
	}

	c := startEtcd(t, dataDir, "m1", peer)
	resp, err := c.Get(context.Background(), "/registry/", clientv3.WithPrefix())
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]string{}
	for _, kv := range resp.Kvs {
		got[string(kv.Key)] = string(kv.Value)
	}
	if len(got) != 2 || got["/registry/foo"] != "1" || got["/registry/bar"] != "2" {
		t.Fatalf("restored member holds %v, want the snapshot's two keys", got)
	}
	if resp.Header.Revision != st.Revision+snapshot.DefaultRevisionBump {
		t.Fatalf("restored member at revision %d, want the snapshot's %d + %d", resp.Header.Revision, st.Revision, snapshot.DefaultRevisionBump)
	}
}

// --bump-revision 0 keeps the snapshot's revisions, and says what that
// risks; a negative bump is a usage error that names the flag.
func TestRestoreLocalBumpRevision(t *testing.T) {
	snap := etcdSnapshot(t, map[string]string{"/registry/foo": "1"})
	st, err := snapshot.Check(snap)
	if err != nil {
		t.Fatal(err)
	}
	dataDir := filepath.Join(t.TempDir(), "etcd")
	peer := freeURL(t)
	args := []string{"--server-address", nowhere, "restore", "snap", "--local", "--from-file", snap, "--data-dir", dataDir, "--member-name", "m1",
		"--initial-cluster", "m1=" + peer.String(), "--initial-advertise-peer-urls", peer.String()}

	r := run(t, append(args, "--bump-revision", "-1")...)
	if r.err == nil || ExitCode(r.err) != ExitUsage || !strings.Contains(r.err.Error(), "--bump-revision -1 is negative") {
		t.Fatalf("negative bump: %v (exit %d), want a usage error naming --bump-revision", r.err, ExitCode(r.err))
	}
	if _, err := os.Stat(dataDir); !os.IsNotExist(err) {
		t.Fatalf("a refused restore created the data directory: %v", err)
	}

	r = mustRun(t, append(args, "--bump-revision", "0")...)
	if !strings.Contains(r.out, "\nrevisions kept as in the snapshot (--bump-revision 0), nothing marked compacted: Kubernetes clients of this etcd (the API server's watch cache, informers, kubelets) may keep stale caches") {
		t.Fatalf("restore --bump-revision 0 does not say what it kept: %q", r.out)
	}
	resp, err := startEtcd(t, dataDir, "m1", peer).Get(context.Background(), "/registry/foo")
	if err != nil || len(resp.Kvs) != 1 || resp.Header.Revision != st.Revision {
		t.Fatalf("restored member: %+v %v, want /registry/foo at the snapshot's revision %d", resp, err, st.Revision)
	}
}

// --from-file restores without the server (nothing listens at the
// address), and refuses a file that is not an etcd snapshot.
func TestRestoreLocalFromFile(t *testing.T) {
	snap := etcdSnapshot(t, map[string]string{"k": "v"})
	dataDir := filepath.Join(t.TempDir(), "etcd")
	args := []string{"--server-address", nowhere, "restore", "snap", "--local", "--data-dir", dataDir, "--member-name", "m1",
		"--initial-cluster", "m1=http://127.0.0.1:2380", "--initial-advertise-peer-urls", "http://127.0.0.1:2380"}

	junk, _, _ := writeRandom(t, "junk.db", 4096)
	r := runRestoreAt(t, []time.Duration{0, 1500 * time.Millisecond}, append(args, "--from-file", junk)...)
	if r.err == nil || !strings.Contains(r.err.Error(), junk+" is not a usable etcd snapshot, refusing to restore it") {
		t.Fatalf("restore of a junk file: %v", r.err)
	}
	if !strings.HasSuffix(r.errOut, "restore failed after 1.5s\n") || strings.Contains(r.out, "restored in") {
		t.Fatalf("a failed restore does not say how long it ran: stdout %q, stderr %q", r.out, r.errOut)
	}
	if _, err := os.Stat(filepath.Join(dataDir, "member")); !os.IsNotExist(err) {
		t.Fatalf("a refused restore wrote the data directory: %v", err)
	}

	// No download: the file's checks are the first step.
	r = runRestoreAt(t, []time.Duration{0, 2340 * time.Millisecond, 12600 * time.Millisecond}, append(args, "--from-file", snap)...)
	if r.err != nil {
		t.Fatalf("restore --from-file: %v\n%s", r.err, r.errOut)
	}
	if !strings.Contains(r.errOut, snap+" verified: etcd trailer and database consistent") {
		t.Fatalf("stderr %q", r.errOut)
	}
	if !strings.HasSuffix(r.out, "\nrestored in 13s: verify 2.3s, rebuild 10s\n") {
		t.Fatalf("restore --from-file stdout does not end with its elapsed time:\n%s", r.out)
	}
	if _, err := os.Stat(filepath.Join(dataDir, "member", "snap", "db")); err != nil {
		t.Fatalf("no member database after restore: %v", err)
	}
}
