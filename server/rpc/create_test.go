package rpc_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"

	ebv1 "github.com/kubectl-etcdbackup/kubectl-etcdbackup/api/etcdbackup/v1"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/server"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/server/config"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/server/jobs"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/server/servertest"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/storage/filesystem"
)

// TestCreateBackupUsesTargetDefaults: a request naming no location or
// compression gets the target's, and the Job carries them.
func TestCreateBackupUsesTargetDefaults(t *testing.T) {
	ctx := context.Background()
	var locs []server.NamedLocation
	for _, n := range []string{"default", "s3"} {
		loc, err := filesystem.New(t.TempDir())
		if err != nil {
			t.Fatal(err)
		}
		locs = append(locs, server.NamedLocation{Name: n, Location: loc})
	}
	cs := fake.NewClientset()
	l, err := jobs.New(cs, "etcdbackup-system", config.Agents{Image: "agent:dev"})
	if err != nil {
		t.Fatal(err)
	}
	srv, err := server.New(server.Config{
		Locations: locs,
		Targets: []config.Target{
			{Name: "cp", Endpoints: []string{"https://etcd:2379"}, TLSSecret: "etcd-client", Location: "s3", Compression: "zstd"},
			// As the CLI and the manifests spell it.
			{Name: "cp-none", Endpoints: []string{"https://etcd:2379"}, TLSSecret: "etcd-client", Compression: "none"},
		},
		Agents: l,
		Now:    func() time.Time { return time.Date(2026, 1, 31, 12, 0, 0, 0, time.UTC) },
	})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := srv.CreateBackup(ctx, &ebv1.CreateBackupRequest{}); status.Code(err) != codes.FailedPrecondition || !strings.Contains(err.Error(), "etcdbackup-system/etcd-client does not exist") {
		t.Fatalf("without the TLS Secret: %v", err)
	}
	if _, err := cs.CoreV1().Secrets("etcdbackup-system").Create(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "etcd-client"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	resp, err := srv.CreateBackup(ctx, &ebv1.CreateBackupRequest{})
	if err != nil {
		t.Fatal(err)
	}
	b := resp.GetBackup()
	if b.GetName() != "cp-20260131-120000" || b.GetLocation() != "s3" || b.GetCompression() != "zstd" || b.GetSource().GetTarget() != "cp" {
		t.Fatalf("backup %+v", b)
	}
	resp, err = srv.CreateBackup(ctx, &ebv1.CreateBackupRequest{Name: "plain", Location: "default", Compression: "none"})
	if err != nil {
		t.Fatal(err)
	}
	if b := resp.GetBackup(); b.GetLocation() != "default" || b.GetCompression() != "" {
		t.Fatalf("backup %+v", b)
	}
	resp, err = srv.CreateBackup(ctx, &ebv1.CreateBackupRequest{Name: "target-none", Target: "cp-none"})
	if err != nil {
		t.Fatal(err)
	}
	if b := resp.GetBackup(); b.GetCompression() != "" {
		t.Fatalf("backup of a target with compression: none: %+v", b)
	}
	list, err := cs.BatchV1().Jobs("etcdbackup-system").List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	args := map[string]string{}
	for _, j := range list.Items {
		args[j.Annotations[jobs.AnnotationBackup]] = strings.Join(j.Spec.Template.Spec.Containers[0].Args, " ")
	}
	if a := args["cp-20260131-120000"]; !strings.Contains(a, "--location=s3") || !strings.Contains(a, "--compression=zstd") {
		t.Errorf("job args %q", a)
	}
	for _, name := range []string{"plain", "target-none"} {
		if a := args[name]; !strings.Contains(a, "--location=default") || strings.Contains(a, "--compression") {
			t.Errorf("job args of %s: %q", name, a)
		}
	}
}

// A target with encryption hands its public keys to the backup Job, and
// the running backup says it will be encrypted.
func TestCreateBackupOfAnEncryptedTarget(t *testing.T) {
	ctx := context.Background()
	loc, err := filesystem.New(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	cs := fake.NewClientset()
	l, err := jobs.New(cs, "etcdbackup-system", config.Agents{Image: "agent:dev"})
	if err != nil {
		t.Fatal(err)
	}
	const rcp = "age1ql3z7hjy54pw3hyww5ayyfg7zqgvc7w3j2elw8zmrj2kg5sfn9aqmcac8p"
	srv, err := server.New(server.Config{
		Locations: []server.NamedLocation{{Name: "default", Location: loc}},
		Targets:   []config.Target{{Name: "cp", Endpoints: []string{"http://etcd:2379"}, InsecurePlaintext: true, Encryption: &config.Encryption{AgeRecipients: []string{rcp}}}},
		Agents:    l,
	})
	if err != nil {
		t.Fatal(err)
	}
	resp, err := srv.CreateBackup(ctx, &ebv1.CreateBackupRequest{Name: "b"})
	if err != nil {
		t.Fatal(err)
	}
	if b := resp.GetBackup(); b.GetEncryption() != "age" || len(b.GetAgeRecipients()) != 1 {
		t.Fatalf("backup %v", b)
	}
	list, err := cs.BatchV1().Jobs("etcdbackup-system").List(ctx, metav1.ListOptions{})
	if err != nil || len(list.Items) != 1 {
		t.Fatalf("%v %v", list, err)
	}
	if args := strings.Join(list.Items[0].Spec.Template.Spec.Containers[0].Args, " "); !strings.Contains(args, "--encrypt-to="+rcp) {
		t.Fatalf("args %s", args)
	}
}

// An on-demand backup cannot carry the server's labels either: its agent
// would upload them.
func TestCreateBackupWithTheServersLabelsIsRefused(t *testing.T) {
	ctx := context.Background()
	loc, err := filesystem.New(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	cs := fake.NewClientset()
	l, err := jobs.New(cs, "etcdbackup-system", config.Agents{Image: "agent:dev"})
	if err != nil {
		t.Fatal(err)
	}
	srv, err := server.New(server.Config{
		Locations: []server.NamedLocation{{Name: "default", Location: loc}},
		Targets:   []config.Target{{Name: "cp", Endpoints: []string{"http://etcd:2379"}, InsecurePlaintext: true}},
		Agents:    l,
	})
	if err != nil {
		t.Fatal(err)
	}
	_, err = srv.CreateBackup(ctx, &ebv1.CreateBackupRequest{Name: "b", Labels: map[string]string{"etcdbackup.io/scheduled": "true"}})
	servertest.WantRefusal(t, err, codes.InvalidArgument, `label "etcdbackup.io/scheduled"`)
	if list, err := cs.BatchV1().Jobs("etcdbackup-system").List(ctx, metav1.ListOptions{}); err != nil || len(list.Items) != 0 {
		t.Fatalf("jobs after the refusal: %v %v", list, err)
	}
}
