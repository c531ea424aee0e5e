package rpc_test

import (
	"bytes"
	"context"
	"crypto/sha256"
	"io"
	"strings"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/api/agentjob"
	ebv1 "github.com/kubectl-etcdbackup/kubectl-etcdbackup/api/etcdbackup/v1"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/server/servertest"
)

func TestUserUploadCannotClaimToBeAnAgent(t *testing.T) {
	srv := servertest.Start(t, "")
	b, err := srv.Client.Upload(context.Background(), bytes.NewReader(trailed(t, 1)), &ebv1.UploadHeader{
		Name: "b1", Source: &ebv1.BackupSource{Kind: "agent", Target: "control-plane"},
	}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if b.GetSource().GetKind() != "upload" {
		t.Fatalf("a user's upload claiming kind agent is stored as %q, want upload", b.GetSource().GetKind())
	}
	// The target it names is its uploader's word, kept apart (issue 37
	// #4): no planner, drill, retention or metric of the target sees it.
	if s := b.GetSource(); s.GetTarget() != "" || s.GetClaimedTarget() != "control-plane" {
		t.Fatalf("a user's upload naming target control-plane: source %v, want no target and the claim kept apart", s)
	}
	got, err := srv.Client.Backups.GetBackup(context.Background(), &ebv1.GetBackupRequest{Name: "b1"})
	if err != nil {
		t.Fatal(err)
	}
	if s := got.GetBackup().GetSource(); s.GetTarget() != "" || s.GetClaimedTarget() != "control-plane" {
		t.Fatalf("get of the upload: source %v", s)
	}
}

// An agent's snapshot stored as is is checked against etcd's own SHA-256
// trailer by the server (the agent no longer hashes it): a damaged one is
// refused and nothing is stored; a good one is stored with the SHA-256 of
// the whole file, trailer included, as `sha256sum` gives.
func TestAgentSnapshotIsCheckedAgainstEtcdsTrailer(t *testing.T) {
	ctx := context.Background()
	db := bytes.Repeat([]byte("bolt page "), 60000)[:512*1024] // whole 512-byte pages
	etcdSum := sha256.Sum256(db)
	good := append(append([]byte{}, db...), etcdSum[:]...)
	agent := servertest.AsAgent{Kind: agentjob.Backup, JobNamespace: "etcdbackup", JobName: "backup-x", Backup: "b1", Location: "default"}
	srv := servertest.StartWith(t, servertest.Options{AgentGuard: agent})

	bad := append([]byte{}, good...)
	bad[1000] ^= 1
	_, err := srv.AgentClient.Upload(ctx, bytes.NewReader(bad), &ebv1.UploadHeader{Name: "b1"}, nil)
	if status.Code(err) != codes.DataLoss || !strings.Contains(err.Error(), "etcd's SHA-256 trailer does not match") || !strings.Contains(err.Error(), "nothing was stored") {
		t.Fatalf("agent upload of a damaged snapshot: %v; want DataLoss naming etcd's trailer", err)
	}
	if _, err := srv.Client.Backups.GetBackup(ctx, &ebv1.GetBackupRequest{Name: "b1"}); status.Code(err) != codes.NotFound {
		t.Fatalf("after the refused upload, b1: %v; want NotFound", err)
	}
	_, err = srv.AgentClient.Upload(ctx, bytes.NewReader(good[:len(good)-1]), &ebv1.UploadHeader{Name: "b1"}, nil)
	if status.Code(err) != codes.DataLoss || !strings.Contains(err.Error(), "not a whole database") {
		t.Fatalf("agent upload of a cut snapshot: %v; want DataLoss", err)
	}

	b, err := srv.AgentClient.Upload(ctx, bytes.NewReader(good), &ebv1.UploadHeader{Name: "b1"}, nil)
	if err != nil {
		t.Fatalf("agent upload of a whole snapshot: %v", err)
	}
	if b.GetSha256() != sha(good) || b.GetSize() != int64(len(good)) || b.GetSource().GetKind() != "agent" {
		t.Fatalf("stored %d bytes, SHA-256 %s, source %q; want %d, %s, agent", b.GetSize(), b.GetSha256(), b.GetSource().GetKind(), len(good), sha(good))
	}

	// A user's plain upload is held to etcd's trailer too: the damaged
	// snapshot is refused and nothing stored; the whole one is stored, as
	// an upload.
	_, err = srv.Client.Upload(ctx, bytes.NewReader(bad), &ebv1.UploadHeader{Name: "user-file"}, nil)
	if status.Code(err) != codes.DataLoss || !strings.Contains(err.Error(), "etcd's SHA-256 trailer does not match") || !strings.Contains(err.Error(), "nothing was stored") {
		t.Fatalf("user upload of a damaged snapshot: %v; want DataLoss naming etcd's trailer", err)
	}
	if _, err := srv.Client.Backups.GetBackup(ctx, &ebv1.GetBackupRequest{Name: "user-file"}); status.Code(err) != codes.NotFound {
		t.Fatalf("after the refused user upload, user-file: %v; want NotFound", err)
	}
	b, err = srv.Client.Upload(ctx, bytes.NewReader(good), &ebv1.UploadHeader{Name: "user-file"}, nil)
	if err != nil {
		t.Fatalf("user upload of a whole snapshot: %v", err)
	}
	if b.GetSha256() != sha(good) || b.GetSize() != int64(len(good)) || b.GetSource().GetKind() != "upload" {
		t.Fatalf("stored %d bytes, SHA-256 %s, source %q; want %d, %s, upload", b.GetSize(), b.GetSha256(), b.GetSource().GetKind(), len(good), sha(good))
	}
}

func TestRestoreAgentDownloadsOnlyItsPinnedBackup(t *testing.T) {
	data := trailed(t, 1) // the snapshot as stored now
	ctx := context.Background()
	download := func(t *testing.T, a servertest.AsAgent, name string) error {
		t.Helper()
		srv := servertest.StartWith(t, servertest.Options{AgentGuard: a})
		if _, err := srv.Client.Upload(ctx, bytes.NewReader(data), &ebv1.UploadHeader{Name: "b1"}, nil); err != nil {
			t.Fatal(err)
		}
		stream, err := srv.AgentClient.Backups.DownloadBackup(ctx, &ebv1.DownloadBackupRequest{Name: name})
		if err != nil {
			return err
		}
		for {
			if _, err := stream.Recv(); err != nil {
				if err == io.EOF {
					return nil
				}
				return err
			}
		}
	}
	agent := servertest.AsAgent{Kind: agentjob.Restore, JobNamespace: "app", JobName: "restore-m0-x", Backup: "b1", Location: "default", SHA256: sha(data)}
	if err := download(t, agent, "b1"); err != nil {
		t.Fatalf("the restore agent of b1 downloading b1 as pinned: %v", err)
	}

	old := sha([]byte("what b1 was when the restore started"))
	pinnedElsewhere := agent
	pinnedElsewhere.SHA256 = old
	err := download(t, pinnedElsewhere, "b1")
	// The hashes stay out of the refusal: the agent logs it.
	if msg := status.Convert(err).Message(); status.Code(err) != codes.PermissionDenied || !strings.Contains(msg, "another SHA-256") ||
		strings.Contains(msg, old) || strings.Contains(msg, sha(data)) {
		t.Fatalf("restore agent pinned to another SHA-256: %v; want PermissionDenied naming neither hash", err)
	}

	if err := download(t, agent, "b2"); status.Code(err) != codes.PermissionDenied || !strings.Contains(err.Error(), `not "b2"`) {
		t.Fatalf("restore agent of b1 downloading b2: %v", err)
	}
	// A restore to a point's agent reads what its Job lists besides its
	// full backup, each under its own pin.
	pointAgent := agent
	pointAgent.Backup, pointAgent.SHA256 = "full", sha([]byte("the full backup"))
	pointAgent.Segments = map[string]string{"b1": sha(data)}
	if err := download(t, pointAgent, "b1"); err != nil {
		t.Fatalf("the restore agent downloading a segment its Job lists: %v", err)
	}
	pointAgent.Segments = map[string]string{"b1": old}
	if err := download(t, pointAgent, "b1"); status.Code(err) != codes.PermissionDenied || !strings.Contains(err.Error(), "another SHA-256") {
		t.Fatalf("the restore agent downloading a listed segment replaced since: %v; want PermissionDenied", err)
	}
	pointAgent.Segments = map[string]string{"b0": sha(data)}
	if err := download(t, pointAgent, "b1"); status.Code(err) != codes.PermissionDenied || !strings.Contains(err.Error(), "delta segments its Job lists") {
		t.Fatalf("the restore agent downloading what its Job does not list: %v; want PermissionDenied", err)
	}

	backupAgent := agent
	backupAgent.Kind, backupAgent.SHA256 = agentjob.Backup, ""
	if err := download(t, backupAgent, "b1"); status.Code(err) != codes.PermissionDenied || !strings.Contains(err.Error(), "only restore agents") {
		t.Fatalf("backup agent downloading: %v", err)
	}
}

func TestDeleteRefusedWhileARestoreReadsTheBackup(t *testing.T) {
	w := servertest.NewRestoreWorld(t, servertest.ClosedURL(t))
	ctx := context.Background()
	if _, err := w.Server.RestoreBackup(ctx, &ebv1.RestoreBackupRequest{Name: "b1", Target: "app"}); err != nil {
		t.Fatal(err)
	}
	running := w.Jobs(t)
	if len(running) != 1 {
		t.Fatalf("%d restore jobs", len(running))
	}
	_, err := w.Server.DeleteBackup(ctx, &ebv1.DeleteBackupRequest{Name: "b1"})
	msg := status.Convert(err).Message()
	if status.Code(err) != codes.FailedPrecondition || !strings.Contains(msg, "app/"+running[0].Name) || !strings.Contains(msg, "kubectl -n app delete job "+running[0].Name) {
		t.Fatalf("delete while restore Job %s runs: %v; want FailedPrecondition naming the Job", running[0].Name, err)
	}
	if _, err := w.Location.Stat(ctx, "b1"); err != nil {
		t.Fatalf("the refused delete removed the backup: %v", err)
	}

	// Once the restore is over, the backup may go.
	j := running[0]
	j.Status.Conditions = []batchv1.JobCondition{{Type: batchv1.JobComplete, Status: corev1.ConditionTrue}}
	if _, err := w.Clientset.BatchV1().Jobs(j.Namespace).UpdateStatus(ctx, &j, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	w.Synced(t)
	if _, err := w.Server.DeleteBackup(ctx, &ebv1.DeleteBackupRequest{Name: "b1"}); err != nil {
		t.Fatalf("delete after the restore finished: %v", err)
	}
}

// Labels under etcdbackup.io/ are the server's: an upload carrying one
// (a user's or an agent's) is refused naming the label, and nothing is
// stored.
func TestUploadWithTheServersLabelsIsRefused(t *testing.T) {
	ctx := context.Background()
	srv := servertest.StartWith(t, servertest.Options{AgentGuard: servertest.AsAgent{
		Kind: agentjob.Backup, JobNamespace: "etcdbackup", JobName: "backup-x", Backup: "b1", Location: "default", Target: "cp"}})
	for _, labels := range []map[string]string{
		{"etcdbackup.io/scheduled": "true", "etcdbackup.io/target": "cp"},
		{"team": "a", "etcdbackup.io/target": "cp"},
		{"etcdbackup.io/anything": "x"},
	} {
		_, err := srv.Client.Upload(ctx, bytes.NewReader(trailed(t, 1)), &ebv1.UploadHeader{Name: "b1", Labels: labels}, nil)
		servertest.WantRefusal(t, err, codes.InvalidArgument, "label \"etcdbackup.io/", "are the server's own")
		_, err = srv.AgentClient.Upload(ctx, bytes.NewReader(trailed(t, 1)), &ebv1.UploadHeader{Name: "b1", Labels: labels}, nil)
		servertest.WantRefusal(t, err, codes.InvalidArgument, "label \"etcdbackup.io/")
	}
	if names := srv.Names(t, "default"); len(names) != 0 {
		t.Fatalf("stored after the refused uploads: %v", names)
	}
	// A user's upload is never a scheduled backup, whatever its header says.
	b, err := srv.Client.Upload(ctx, bytes.NewReader(trailed(t, 1)), &ebv1.UploadHeader{
		Name: "cp-20261201-100000", Source: &ebv1.BackupSource{Kind: "agent", Target: "cp", Scheduled: true}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if s := b.GetSource(); s.GetScheduled() || s.GetKind() != "upload" || len(b.GetLabels()) != 0 {
		t.Fatalf("a user's upload claiming to be scheduled: source %v labels %v", s, b.GetLabels())
	}
}

// The server, not the agent, says a backup is scheduled: an agent of a
// Job the schedule started (the signed Job says so) stores a backup
// whose source is scheduled at the time in its name, and GetBackup says
// so.
func TestScheduledAgentsBackupIsMarkedByTheServer(t *testing.T) {
	ctx := context.Background()
	srv := servertest.StartWith(t, servertest.Options{AgentGuard: servertest.AsAgent{
		Kind: agentjob.Backup, JobNamespace: "etcdbackup", JobName: "backup-x", Backup: "cp-20261201-100500", Location: "default",
		Target: "cp", Scheduled: true}})
	if _, err := srv.AgentClient.Upload(ctx, bytes.NewReader(trailed(t, 1)), &ebv1.UploadHeader{Name: "cp-20261201-100500"}, nil); err != nil {
		t.Fatal(err)
	}
	got, err := srv.Client.Backups.GetBackup(ctx, &ebv1.GetBackupRequest{Name: "cp-20261201-100500"})
	if err != nil {
		t.Fatal(err)
	}
	s := got.GetBackup().GetSource()
	if !s.GetScheduled() || s.GetTarget() != "cp" || s.GetScheduledTime().AsTime().Format("2006-01-02T15:04:05Z") != "2026-12-01T10:05:00Z" {
		t.Fatalf("source %v: want scheduled for cp at 2026-12-01T10:05:00Z", s)
	}
	if l := got.GetBackup().GetLabels(); l["etcdbackup.io/scheduled"] != "true" || l["etcdbackup.io/target"] != "cp" {
		t.Fatalf("labels %v: want the server's scheduled labels, for list -l", l)
	}
}

// A fold agent downloads only the chain its Job pins, each part at its
// pinned SHA-256, and uploads only its one new full backup, stored as
// an agent's backup of its target (not scheduled).
func TestFoldAgentReadsItsChainAndStoresItsOneBackup(t *testing.T) {
	ctx := context.Background()
	full, other := trailed(t, 1), trailed(t, 2)
	fold := servertest.AsAgent{Kind: agentjob.Fold, JobNamespace: "etcdbackup", JobName: "fold-cp-x", Backup: "cp-fold-20", Location: "default", Target: "cp",
		Inputs: map[string]string{"cp-full": sha(full), "cp-other": sha([]byte("what cp-other was when the fold started"))}}
	srv := servertest.StartWith(t, servertest.Options{AgentGuard: fold})
	for name, data := range map[string][]byte{"cp-full": full, "cp-other": other, "cp-unlisted": other} {
		if _, err := srv.Client.Upload(ctx, bytes.NewReader(data), &ebv1.UploadHeader{Name: name}, nil); err != nil {
			t.Fatal(err)
		}
	}
	download := func(name, location string) error {
		stream, err := srv.AgentClient.Backups.DownloadBackup(ctx, &ebv1.DownloadBackupRequest{Name: name, Location: location})
		if err != nil {
			return err
		}
		for {
			if _, err := stream.Recv(); err != nil {
				if err == io.EOF {
					return nil
				}
				return err
			}
		}
	}
	if err := download("cp-full", ""); err != nil {
		t.Fatalf("the fold agent downloading its pinned full backup: %v", err)
	}
	servertest.WantRefusal(t, download("cp-other", ""), codes.PermissionDenied, "another SHA-256")
	servertest.WantRefusal(t, download("cp-unlisted", ""), codes.PermissionDenied, "may download only the chain it folds", `not "cp-unlisted"`)
	servertest.WantRefusal(t, download("cp-fold-20", ""), codes.PermissionDenied, "may download only the chain it folds")

	// Its upload: its own name only, never a segment.
	_, err := srv.AgentClient.Upload(ctx, bytes.NewReader(trailed(t, 3)), &ebv1.UploadHeader{Name: "cp-fold-21"}, nil)
	servertest.WantRefusal(t, err, codes.PermissionDenied, `may upload only backup "cp-fold-20"`)
	_, err = srv.AgentClient.Upload(ctx, bytes.NewReader(trailed(t, 3)), &ebv1.UploadHeader{Name: "cp-full.delta-11", Compression: ebv1.CompressionZstd,
		Delta: &ebv1.DeltaSegment{Chain: "cp-full", FirstRevision: 11, LastRevision: 12}}, nil)
	servertest.WantRefusal(t, err, codes.PermissionDenied, "only a target's delta agent stores delta segments")
	b, err := srv.AgentClient.Upload(ctx, bytes.NewReader(trailed(t, 3)), &ebv1.UploadHeader{Name: "cp-fold-20",
		Source: &ebv1.BackupSource{Kind: "agent", Target: "someone-else", Scheduled: true}}, nil)
	if err != nil {
		t.Fatalf("the fold agent storing its backup: %v", err)
	}
	if s := b.GetSource(); s.GetKind() != "agent" || s.GetTarget() != "cp" || s.GetScheduled() || !strings.Contains(s.GetDescription(), "fold-cp-x") {
		t.Fatalf("the folded backup's source is %v; want an agent backup of target cp from job fold-cp-x, not scheduled", s)
	}
}
