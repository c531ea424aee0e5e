package backup_test

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/klauspost/compress/zstd"
	"go.etcd.io/etcd/client/pkg/v3/transport"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/snapshot"
	etcdutl "go.etcd.io/etcd/etcdutl/v3/snapshot"
	"go.uber.org/zap"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/agents/backup"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/api/agentjob"
	ebv1 "github.com/kubectl-etcdbackup/kubectl-etcdbackup/api/etcdbackup/v1"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/client"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/internal/etcdtest"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/server/servertest"
)

type dataServer struct {
	client *client.Client
	dir    string
}

func startServer(t *testing.T) *dataServer {
	s := servertest.Start(t, "")
	return &dataServer{client: s.Client, dir: s.Dir}
}

func (s *dataServer) download(t *testing.T, name string) []byte {
	t.Helper()
	var buf bytes.Buffer
	if _, err := s.client.Download(context.Background(), &buf, client.DownloadRequest{Name: name}); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

func (s *dataServer) names(t *testing.T) []string {
	resp, err := s.client.Backups.ListBackups(context.Background(), &ebv1.ListBackupsRequest{})
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, b := range resp.GetBackups() {
		out = append(out, b.GetName())
	}
	return out
}

func sha(b []byte) string {
	s := sha256.Sum256(b)
	return hex.EncodeToString(s[:])
}

func TestBackupEqualsSnapshotSave(t *testing.T) {
	for _, tc := range []struct {
		name        string
		tls         bool
		compression string
	}{
		{"plain", false, ""},
		{"tls", true, ""},
		{"tls-zstd", true, "zstd"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			te := etcdtest.Start(t, tc.tls)
			c := te.Client(t)
			etcdtest.Fill(t, c, 2000, 512)
			if _, err := c.Put(context.Background(), "foo", "1"); err != nil {
				t.Fatal(err)
			}
			// Through the agent listener, as the Job's agent the guard admitted.
			srv := servertest.StartWith(t, servertest.Options{AgentGuard: servertest.AsAgent{
				Kind: agentjob.Backup, JobNamespace: "etcdbackup-system", JobName: "backup-b1-0123456789",
				Backup: "b1", Location: "default", Target: "test-etcd",
			}})

			scratch := t.TempDir()
			b, err := backup.Run(context.Background(), c, srv.AgentClient, backup.Options{
				Endpoint: te.Endpoint, Name: "b1", Target: "test-etcd", Compression: tc.compression,
				Labels: map[string]string{"by": "test"}, ScratchDir: scratch,
			})
			if err != nil {
				t.Fatal(err)
			}
			// etcd's own tool on the same member at the same revision.
			ref := filepath.Join(t.TempDir(), "ref.db")
			if _, err := snapshot.SaveWithVersion(context.Background(), zap.NewNop(), te.Config(t), ref); err != nil {
				t.Fatal(err)
			}
			want, err := os.ReadFile(ref)
			if err != nil {
				t.Fatal(err)
			}
			got := (&dataServer{client: srv.Client, dir: srv.Dir}).download(t, "b1")
			if tc.compression == "zstd" {
				if len(got) >= len(want) {
					t.Errorf("zstd backup is %d bytes, raw snapshot %d: not compressed", len(got), len(want))
				}
				dec, err := zstd.NewReader(bytes.NewReader(got))
				if err != nil {
					t.Fatal(err)
				}
				if got, err = io.ReadAll(dec); err != nil {
					t.Fatal(err)
				}
				dec.Close()
			}
			// Two snapshots of one revision differ in bolt's page layout
			// (etcd's backend commits in between), so compare what etcd
			// itself reports: the SHA-256 trailer, and etcdutl's status —
			// revision, key count and the hash of every key and value.
			gotPath := filepath.Join(t.TempDir(), "got.db")
			if err := os.WriteFile(gotPath, got, 0o600); err != nil {
				t.Fatal(err)
			}
			gotSt, wantSt := status(t, gotPath), status(t, ref)
			if gotSt.Hash != wantSt.Hash || gotSt.Revision != wantSt.Revision || gotSt.TotalKey != wantSt.TotalKey {
				t.Fatalf("etcd status of the backup %+v, of snapshot.Save %+v", gotSt, wantSt)
			}
			if err := verifyTrailer(got); err != nil {
				t.Fatal(err)
			}
			// Metadata the issue asks for.
			e := b.GetEtcd()
			st, _ := c.Status(context.Background(), te.Endpoint)
			if e.GetClusterId() != st.Header.ClusterId || e.GetMemberId() != st.Header.MemberId || e.GetMemberName() != "member-1" ||
				e.GetRevision() != st.Header.Revision || e.GetVersion() == "" || e.GetDbSize() == 0 {
				t.Errorf("etcd info %+v; status %+v", e, st.Header)
			}
			// The snapshot's own status, as etcdutl reads it from the file.
			if !e.GetSnapshotStatus() || e.GetRevision() != gotSt.Revision || e.GetTotalKeys() != int64(gotSt.TotalKey) || e.GetHash() != gotSt.Hash {
				t.Errorf("recorded revision %d, keys %d, hash %d (read from the snapshot: %v); etcdutl status of the backup %+v",
					e.GetRevision(), e.GetTotalKeys(), e.GetHash(), e.GetSnapshotStatus(), gotSt)
			}
			// The keyspace fingerprint is the member's at that revision.
			hk, err := c.HashKV(context.Background(), te.Endpoint, e.GetRevision())
			if err != nil {
				t.Fatal(err)
			}
			count, err := c.Get(context.Background(), "\x00", clientv3.WithFromKey(), clientv3.WithCountOnly(), clientv3.WithRev(e.GetRevision()))
			if err != nil {
				t.Fatal(err)
			}
			if !e.GetKeyspace() || e.GetHashKv() != hk.Hash || e.GetKeyspaceKeys() != count.Count || e.GetCompactRevision() != max(0, hk.CompactRevision) {
				t.Errorf("recorded keyspace %d keys, HashKV %d, compacted at %d (recorded: %v); the member: %d keys, HashKV %d, compacted at %d",
					e.GetKeyspaceKeys(), e.GetHashKv(), e.GetCompactRevision(), e.GetKeyspace(), count.Count, hk.Hash, hk.CompactRevision)
			}
			if left, _ := os.ReadDir(scratch); len(left) != 0 {
				t.Errorf("scratch space keeps %d files after the backup", len(left))
			}
			if b.GetRawSize() != int64(len(got)) || b.GetRawSha256() != sha(got) || b.GetCompression() != tc.compression {
				t.Errorf("raw size/sha/compression = %d %s %q; want %d %s %q", b.GetRawSize(), b.GetRawSha256(), b.GetCompression(), len(got), sha(got), tc.compression)
			}
			if b.GetSource().GetKind() != ebv1.SourceAgent || b.GetSource().GetTarget() != "test-etcd" || b.GetSource().GetStartTime() == nil ||
				b.GetSource().GetDescription() != "job etcdbackup-system/backup-b1-0123456789" {
				t.Errorf("source %+v", b.GetSource())
			}
		})
	}
}

// etcd going away mid-snapshot fails the backup and stores nothing, stored
// as is (relayed) or compressed (read through the verifier).
func TestEtcdDiesMidSnapshot(t *testing.T) {
	for _, compression := range []string{"", "zstd"} {
		t.Run("compression="+compression, func(t *testing.T) {
			te := etcdtest.Start(t, false)
			c := te.Client(t)
			etcdtest.Fill(t, c, 4000, 4096) // ~16 MiB: the stream takes many messages
			srv := startServer(t)
			killed := false
			_, err := backup.Run(context.Background(), c, srv.client, backup.Options{
				Endpoint: te.Endpoint, Name: "doomed", Compression: compression,
				Progress: func(n int64) {
					if n > 1<<20 && !killed {
						killed = true
						te.Stop()
					}
				},
			})
			if err == nil {
				t.Fatal("backup succeeded although etcd died mid-snapshot")
			}
			if !killed {
				t.Fatal("the test did not kill etcd mid-stream")
			}
			if !strings.Contains(err.Error(), "snapshot of etcd member "+te.Endpoint) || !strings.Contains(err.Error(), "nothing was stored") {
				t.Errorf("error %q does not say the snapshot of %s broke and nothing was stored", err, te.Endpoint)
			}
			if names := srv.names(t); len(names) != 0 {
				t.Fatalf("listed after a failed backup: %v", names)
			}
			// The server notices the cancel asynchronously: it aborts the
			// upload a moment after the agent returned.
			var entries []os.DirEntry
			if err := wait.PollUntilContextTimeout(context.Background(), 10*time.Millisecond, 10*time.Second, true, func(context.Context) (bool, error) {
				entries, _ = os.ReadDir(filepath.Join(srv.dir, ".tmp"))
				return len(entries) == 0, nil
			}); err != nil {
				t.Fatalf("half-written upload left in .tmp: %v", entries)
			}
		})
	}
}

func TestPlaintextNeedsNoCertsButTLSRefusesStrangers(t *testing.T) {
	te := etcdtest.Start(t, true)
	cfg := clientv3.Config{Endpoints: []string{te.Endpoint}, DialTimeout: 2 * time.Second, Logger: zap.NewNop()}
	info := transport.TLSInfo{TrustedCAFile: te.TLS.TrustedCAFile} // no client cert
	tlsCfg, err := info.ClientConfig()
	if err != nil {
		t.Fatal(err)
	}
	cfg.TLS = tlsCfg
	c, err := clientv3.New(cfg)
	if err == nil {
		defer c.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
		defer cancel()
		_, err = backup.Run(ctx, c, startServer(t).client, backup.Options{Endpoint: te.Endpoint, Name: "x"})
	}
	if err == nil {
		t.Fatal("etcd with client-cert auth accepted a client without a certificate")
	}
}

func status(t *testing.T, path string) etcdutl.Status {
	t.Helper()
	st, err := etcdutl.NewV3(zap.NewNop()).Status(path)
	if err != nil {
		t.Fatalf("etcdutl status %s: %v", path, err)
	}
	return st
}

// verifyTrailer checks etcd's snapshot trailer: the last 32 bytes are the
// SHA-256 of the rest.
func verifyTrailer(b []byte) error {
	if len(b) < 32 {
		return fmt.Errorf("snapshot of %d bytes has no trailer", len(b))
	}
	s := sha256.Sum256(b[:len(b)-32])
	if !bytes.Equal(s[:], b[len(b)-32:]) {
		return fmt.Errorf("snapshot trailer does not match its data")
	}
	return nil
}

func TestConnectRefusesWhatItCannotUse(t *testing.T) {
	for _, tc := range []struct {
		etcd backup.Etcd
		want string
	}{
		{backup.Etcd{}, "--endpoint or --endpoints is required"},
		{backup.Etcd{Endpoint: "https://a:2379", Endpoints: []string{"https://b:2379"}}, "not both"},
		{backup.Etcd{Endpoint: "http://127.0.0.1:1"}, "pass --insecure-plaintext"},
		{backup.Etcd{Endpoint: "127.0.0.1:2379"}, "must start with https://"},
		{backup.Etcd{Endpoint: "https://127.0.0.1:1", CACert: "/nonexistent/ca.crt"}, "etcd TLS files"},
	} {
		c, _, err := tc.etcd.Connect(context.Background())
		if err == nil {
			c.Close()
		}
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%+v: got %v, want %q", tc.etcd, err, tc.want)
		}
	}
}

func TestConnectChoosesAnAnsweringMember(t *testing.T) {
	te := etcdtest.Start(t, false)
	// The first endpoint answers nothing; the agent moves on to the member
	// that answers (the leader of a one-member cluster).
	e := backup.Etcd{Endpoints: []string{"http://127.0.0.1:1", te.Endpoint}, InsecurePlaintext: true, DialTimeout: time.Second}
	c, ep, err := e.Connect(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if ep != te.Endpoint {
		t.Fatalf("chose %s, want %s", ep, te.Endpoint)
	}
}

// Under writes the member's revision before the snapshot is only a lower
// bound: the backup records the revision, keys and hash read from the
// snapshot it stored, whatever was written around it.
func TestBackupRecordsTheSnapshotsOwnStatus(t *testing.T) {
	te := etcdtest.Start(t, false)
	c := te.Client(t)
	etcdtest.Fill(t, c, 2000, 1024)
	srv := servertest.StartWith(t, servertest.Options{AgentGuard: servertest.AsAgent{
		Kind: agentjob.Backup, JobNamespace: "etcdbackup-system", JobName: "backup-b1-0123456789",
		Backup: "b1", Location: "default", Target: "test-etcd",
	}})
	ctx, cancel := context.WithCancel(context.Background())
	writes := make(chan int)
	go func() {
		n := 0
		for ctx.Err() == nil {
			if _, err := c.Put(ctx, fmt.Sprintf("/during/%d", n), "x"); err == nil {
				n++
			}
		}
		writes <- n
	}()
	b, err := backup.Run(context.Background(), c, srv.AgentClient, backup.Options{
		Endpoint: te.Endpoint, Name: "b1", Target: "test-etcd", ScratchDir: t.TempDir(),
	})
	cancel()
	t.Logf("%d writes during the backup", <-writes)
	if err != nil {
		t.Fatal(err)
	}
	got := (&dataServer{client: srv.Client, dir: srv.Dir}).download(t, "b1")
	path := filepath.Join(t.TempDir(), "got.db")
	if err := os.WriteFile(path, got, 0o600); err != nil {
		t.Fatal(err)
	}
	st := status(t, path)
	e := b.GetEtcd()
	if e.GetRevision() != st.Revision || e.GetTotalKeys() != int64(st.TotalKey) || e.GetHash() != st.Hash || !e.GetSnapshotStatus() {
		t.Fatalf("recorded %+v; the stored snapshot's status %+v", e, st)
	}
	// What list and get show is the same.
	resp, err := srv.Client.Backups.GetBackup(context.Background(), &ebv1.GetBackupRequest{Name: "b1"})
	if err != nil {
		t.Fatal(err)
	}
	if g := resp.GetBackup().GetEtcd(); g.GetRevision() != st.Revision || g.GetTotalKeys() != int64(st.TotalKey) || g.GetHash() != st.Hash {
		t.Errorf("get shows %+v; the stored snapshot's status %+v", g, st)
	}
}

// A snapshot copy that cannot be written fails the backup: nothing is
// stored without its status.
func TestBackupFailsWithoutScratchSpace(t *testing.T) {
	te := etcdtest.Start(t, false)
	c := te.Client(t)
	etcdtest.Fill(t, c, 200, 1024)
	srv := servertest.StartWith(t, servertest.Options{AgentGuard: servertest.AsAgent{
		Kind: agentjob.Backup, JobNamespace: "etcdbackup-system", JobName: "backup-b1-0123456789",
		Backup: "b1", Location: "default", Target: "test-etcd",
	}})
	_, err := backup.Run(context.Background(), c, srv.AgentClient, backup.Options{
		Endpoint: te.Endpoint, Name: "b1", Target: "test-etcd", ScratchDir: filepath.Join(t.TempDir(), "missing"),
	})
	if err == nil || !strings.Contains(err.Error(), "scratch copy of the snapshot") {
		t.Fatalf("backup with missing scratch space: %v", err)
	}
	if names := (&dataServer{client: srv.Client, dir: srv.Dir}).names(t); len(names) != 0 {
		t.Errorf("stored %v", names)
	}
}
