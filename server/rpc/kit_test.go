package rpc_test

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"filippo.io/age"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/agents/kitagent"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/api/agentjob"
	ebv1 "github.com/kubectl-etcdbackup/kubectl-etcdbackup/api/etcdbackup/v1"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/client"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/internal/agetest"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/kit"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/server/config"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/server/servertest"
)

const kitCAKey = "the cluster CA's private key"

// controlPlaneHost is a node's root with kubeadm's /etc/kubernetes.
func controlPlaneHost(t *testing.T) string {
	t.Helper()
	host := t.TempDir()
	for name, body := range map[string]string{
		"etc/kubernetes/pki/ca.key":          kitCAKey,
		"etc/kubernetes/pki/ca.crt":          "CA certificate",
		"etc/kubernetes/manifests/etcd.yaml": "kind: Pod",
	} {
		p := filepath.Join(host, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	return host
}

// The kit agent reads a node's files, waits for its backup, and the
// server stores the kit beside it: listed with the backup, never as
// one, only as ciphertext, and removed with it.
func TestKitIsStoredBesideItsBackup(t *testing.T) {
	ctx := context.Background()
	key := agetest.NewKey(t)
	cp := config.Target{Name: "cp", Endpoints: []string{"https://10.0.0.1:2379"},
		Kit: &config.Kit{NodeName: "cp-1", AgeRecipients: []string{key.Recipient}}}
	dir := t.TempDir()
	srv := servertest.StartWith(t, servertest.Options{Dir: dir, Targets: []config.Target{cp}, AgentGuard: servertest.AsAgent{
		Kind: agentjob.Kit, JobNamespace: "etcdbackup-restore", JobName: "kit-b1", Backup: "b1", Location: "default", Target: "cp", Node: "cp-1",
	}})
	opts := kitagent.Options{Name: "b1", Location: "default", Target: "cp", Paths: []string{"/etc/kubernetes"}, HostRoot: controlPlaneHost(t),
		Recipients: []string{key.Recipient}, Node: "cp-1", KubeVersion: "v1.37.2", Poll: 10 * time.Millisecond}

	// Started before its backup is stored: it waits for it.
	done := make(chan error, 1)
	var stored *ebv1.Backup
	go func() {
		var err error
		stored, err = kitagent.Run(ctx, srv.AgentClient, opts)
		done <- err
	}()
	if _, err := srv.Client.Upload(ctx, bytes.NewReader(trailed(t, 1)), &ebv1.UploadHeader{Name: "b1"}, nil); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatalf("kit agent: %v", err)
	}
	got, err := srv.Client.Backups.GetBackup(ctx, &ebv1.GetBackupRequest{Name: "b1"})
	if err != nil {
		t.Fatal(err)
	}
	k := got.GetBackup().GetKit()
	if k.GetName() != "b1.kit" || k.GetSha256() != stored.GetSha256() || k.GetNode() != "cp-1" || k.GetVersions().GetKubernetes() != "v1.37.2" ||
		len(k.GetFiles()) != 6 || k.GetEntries() != 6 || k.GetAgeRecipients()[0] != key.Recipient {
		t.Fatalf("backup b1's kit: %v", k)
	}
	list, err := srv.Client.Backups.ListBackups(ctx, &ebv1.ListBackupsRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if bs := list.GetBackups(); len(bs) != 1 || bs[0].GetKit().GetEntries() != 6 || len(bs[0].GetKit().GetFiles()) != 0 {
		t.Fatalf("list: %v; want b1 alone, its kit's entries counted, not listed", bs)
	}

	// Stored as ciphertext only: the key opens it, nothing else shows it.
	var raw bytes.Buffer
	if _, err := srv.Client.Download(ctx, &raw, client.DownloadRequest{Name: "b1.kit"}); err != nil {
		t.Fatal(err)
	}
	if bytes.Contains(raw.Bytes(), []byte(kitCAKey)) {
		t.Fatal("the stored kit holds the CA key in plaintext")
	}
	c, err := kit.Open(bytes.NewReader(raw.Bytes()), []age.Identity{key.Identity})
	if err != nil || string(c.Data["/etc/kubernetes/pki/ca.key"]) != kitCAKey {
		t.Fatalf("open the stored kit: %v", err)
	}

	// The server's check sees a changed byte.
	file := filepath.Join(dir, "backups", "b1.kit.db")
	b, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	b[len(b)/2] ^= 1
	if err := os.WriteFile(file, b, 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := srv.Client.Backups.VerifyBackup(ctx, &ebv1.VerifyBackupRequest{Name: "b1.kit"}); status.Code(err) != codes.DataLoss {
		t.Errorf("verify of a kit with a flipped byte: %v, want DataLoss", err)
	}

	// A kit goes only with its backup.
	if _, err := srv.Client.Backups.DeleteBackup(ctx, &ebv1.DeleteBackupRequest{Name: "b1.kit"}); status.Code(err) != codes.FailedPrecondition || !strings.Contains(err.Error(), `delete "b1"`) {
		t.Errorf("delete of the kit alone: %v", err)
	}
	if _, err := srv.Client.Backups.DeleteBackup(ctx, &ebv1.DeleteBackupRequest{Name: "b1"}); err != nil {
		t.Fatal(err)
	}
	if _, err := srv.Client.Backups.GetBackup(ctx, &ebv1.GetBackupRequest{Name: "b1.kit"}); status.Code(err) != codes.NotFound {
		t.Errorf("the kit after its backup was deleted: %v, want NotFound", err)
	}
}

// Who may store a kit, and how: only the kit agent of the backup, under
// its backup's kit name, sealed to the target's recipients, after the
// backup; no user.
func TestKitUploadsAreHeldToTheirBackup(t *testing.T) {
	ctx := context.Background()
	key, other := agetest.NewKey(t), agetest.NewKey(t)
	cp := config.Target{Name: "cp", Endpoints: []string{"https://10.0.0.1:2379"},
		Kit: &config.Kit{NodeName: "cp-1", AgeRecipients: []string{key.Recipient}}}
	srv := servertest.StartWith(t, servertest.Options{Targets: []config.Target{cp}, AgentGuard: servertest.AsAgent{
		Kind: agentjob.Kit, JobNamespace: "etcdbackup-restore", JobName: "kit-b1", Backup: "b1", Location: "default", Target: "cp", Node: "cp-1",
	}})
	sealedTo := func(r string) []byte {
		c, err := kit.Collect(ctx, controlPlaneHost(t), []string{"/etc/kubernetes"}, kit.Index{Backup: "b1"})
		if err != nil {
			t.Fatal(err)
		}
		rec, _ := age.ParseX25519Recipient(r)
		s, err := c.Seal(ctx, []age.Recipient{rec})
		if err != nil {
			t.Fatal(err)
		}
		return s.Data
	}
	header := func(name, to string) *ebv1.UploadHeader {
		return &ebv1.UploadHeader{Name: name, Encryption: ebv1.EncryptionAge, AgeRecipients: []string{to}, RawSize: 10,
			Kit: &ebv1.Kit{Paths: []string{"/etc/kubernetes"}}}
	}
	// Before its backup.
	if _, err := srv.AgentClient.Upload(ctx, bytes.NewReader(sealedTo(key.Recipient)), header("b1.kit", key.Recipient), nil); status.Code(err) != codes.NotFound {
		t.Errorf("a kit before its backup: %v, want NotFound", err)
	}
	if _, err := srv.Client.Upload(ctx, bytes.NewReader(trailed(t, 1)), &ebv1.UploadHeader{Name: "b1"}, nil); err != nil {
		t.Fatal(err)
	}
	for what, c := range map[string]struct {
		up   func() error
		code codes.Code
	}{
		"another backup's kit": {func() error {
			_, err := srv.AgentClient.Upload(ctx, bytes.NewReader(sealedTo(key.Recipient)), header("b2.kit", key.Recipient), nil)
			return err
		}, codes.PermissionDenied},
		"a kit sealed to other recipients": {func() error {
			_, err := srv.AgentClient.Upload(ctx, bytes.NewReader(sealedTo(other.Recipient)), header("b1.kit", other.Recipient), nil)
			return err
		}, codes.InvalidArgument},
		"a user's kit": {func() error {
			_, err := srv.Client.Upload(ctx, bytes.NewReader(sealedTo(key.Recipient)), header("b1.kit", key.Recipient), nil)
			return err
		}, codes.PermissionDenied},
		"a user's upload named as a kit": {func() error {
			_, err := srv.Client.Upload(ctx, bytes.NewReader(trailed(t, 1)), &ebv1.UploadHeader{Name: "b1.kit"}, nil)
			return err
		}, codes.InvalidArgument},
	} {
		if err := c.up(); status.Code(err) != c.code {
			t.Errorf("%s: %v, want %s", what, err, c.code)
		}
	}
	if _, err := srv.Client.Backups.GetBackup(ctx, &ebv1.GetBackupRequest{Name: "b1.kit"}); status.Code(err) != codes.NotFound {
		t.Errorf("after the refused uploads, b1.kit: %v", err)
	}
	if _, err := srv.AgentClient.Upload(ctx, bytes.NewReader(sealedTo(key.Recipient)), header("b1.kit", key.Recipient), nil); err != nil {
		t.Errorf("the kit agent's own kit: %v", err)
	}
	// A second attempt of the same Job (its pod disrupted after it stored
	// the kit) finds it stored and succeeds.
	k, err := kitagent.Run(ctx, srv.AgentClient, kitagent.Options{Name: "b1", Location: "default", Target: "cp", Paths: []string{"/etc/kubernetes"},
		HostRoot: controlPlaneHost(t), Recipients: []string{key.Recipient}, Node: "cp-1"})
	if err != nil || k.GetName() != "b1.kit" {
		t.Errorf("a second attempt: %v %v", k, err)
	}
}

// A kit agent pod that runs on another node than its kit's is refused:
// the files it read are not the ones the kit names.
func TestKitFromAnotherNodeIsRefused(t *testing.T) {
	ctx := context.Background()
	key := agetest.NewKey(t)
	cp := config.Target{Name: "cp", Endpoints: []string{"https://10.0.0.1:2379"},
		Kit: &config.Kit{NodeName: "cp-1", AgeRecipients: []string{key.Recipient}}}
	srv := servertest.StartWith(t, servertest.Options{Targets: []config.Target{cp}, AgentGuard: servertest.AsAgent{
		Kind: agentjob.Kit, JobNamespace: "etcdbackup-restore", JobName: "kit-b1", Backup: "b1", Location: "default", Target: "cp", Node: "worker-7",
	}})
	if _, err := srv.Client.Upload(ctx, bytes.NewReader(trailed(t, 1)), &ebv1.UploadHeader{Name: "b1"}, nil); err != nil {
		t.Fatal(err)
	}
	_, err := kitagent.Run(ctx, srv.AgentClient, kitagent.Options{Name: "b1", Location: "default", Target: "cp", Paths: []string{"/etc/kubernetes"},
		HostRoot: controlPlaneHost(t), Recipients: []string{key.Recipient}, Node: "cp-1"})
	if status.Code(err) != codes.PermissionDenied || !strings.Contains(err.Error(), `runs on node "worker-7", not on node "cp-1"`) {
		t.Fatalf("a kit agent on another node: %v", err)
	}
	if _, err := srv.Client.Backups.GetBackup(ctx, &ebv1.GetBackupRequest{Name: "b1.kit"}); status.Code(err) != codes.NotFound {
		t.Errorf("b1.kit after the refusal: %v", err)
	}
}
