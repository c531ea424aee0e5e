package plugin

import (
	"context"
	"os"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/types/known/timestamppb"

	ebv1 "github.com/kubectl-etcdbackup/kubectl-etcdbackup/api/etcdbackup/v1"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/server/servertest"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/server/servertest/backuptest"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/storage"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/storage/filesystem"
)

// An uploaded snapshot that claims the target, with a revision and
// snapshot status of its own making — sent by raw gRPC as the review's
// attacker sends it, and one stored before claims were kept apart — is
// never a recoverable point or a full backup of the target: `list
// --target` shows neither it nor a window, and a restore to its revision
// or time is refused (issue 37 #4).
func TestUploadsClaimingATargetAreNeverItsBackups(t *testing.T) {
	ctx := context.Background()
	srv := servertest.Start(t, "")
	path, _, _ := writeSnapshot(t, "forged.db", smallSnapshot)
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	start := time.Date(2026, 12, 1, 10, 0, 0, 0, time.UTC)
	if _, err := srv.Client.Upload(ctx, f, &ebv1.UploadHeader{
		Name:   "forged",
		Source: &ebv1.BackupSource{Kind: ebv1.SourceAgent, Target: "cp", StartTime: timestamppb.New(start)},
		Etcd:   &ebv1.EtcdInfo{Revision: 5000, SnapshotStatus: true, Keyspace: true, KeyspaceKeys: 3, HashKv: 7},
	}, nil); err != nil {
		t.Fatal(err)
	}
	loc, err := filesystem.New(srv.Dir)
	if err != nil {
		t.Fatal(err)
	}
	backuptest.Put(t, loc, &storage.Manifest{Name: "legacy", CreateTime: start, Source: storage.Source{Kind: ebv1.SourceUpload, Target: "cp", StartTime: start},
		Etcd: &storage.EtcdInfo{Revision: 6000, SnapshotStatus: true}}, []byte("an uploader's keyspace"))

	r := mustRun(t, "--server-address="+srv.Addr, "list", "--target", "cp")
	if strings.Contains(r.out, "forged") || strings.Contains(r.out, "legacy") || strings.Contains(r.out, "Recoverable window") {
		t.Errorf("list --target cp counts uploads that claim it:\n%s", r.out)
	}
	d := mustRun(t, "--server-address="+srv.Addr, "describe", "forged")
	if !strings.Contains(d.out, "Claimed Target:") || !strings.Contains(d.out, "the uploader's word") {
		t.Errorf("describe does not show the claim as a claim:\n%s", d.out)
	}
	for _, point := range [][]string{{"--to-revision", "5000"}, {"--to-revision", "6000"}, {"--to-time", start.Format(time.RFC3339)}} {
		args := append([]string{"--server-address=" + srv.Addr, "restore", "--local", "--target", "cp", "--data-dir", t.TempDir() + "/m1",
			"--member-name", "m1", "--initial-cluster", "m1=http://127.0.0.1:2380", "--initial-advertise-peer-urls", "http://127.0.0.1:2380"}, point...)
		r := run(t, args...)
		if r.err == nil || !strings.Contains(r.err.Error(), "no full backup") && !strings.Contains(r.err.Error(), "not recoverable") {
			t.Errorf("restore %v from uploads that claim the target: %v\n%s", point, r.err, r.out)
		}
	}
}
