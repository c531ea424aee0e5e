package rpc_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/timestamppb"

	ebv1 "github.com/kubectl-etcdbackup/kubectl-etcdbackup/api/etcdbackup/v1"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/server/jobs"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/server/servertest"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/server/servertest/backuptest"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/storage"
)

var pointT0 = time.Date(2026, 3, 1, 10, 0, 0, 0, time.UTC)

// pointWorld is a restore world whose location holds target app's full
// backup f1 (revision 10) with segments 11..20 and 21..30, and f2
// (revision 100) with none: revisions 31..99 are a gap.
func pointWorld(t *testing.T) (*servertest.RestoreWorld, map[string]string) {
	t.Helper()
	w := servertest.NewRestoreWorld(t, servertest.ClosedURL(t), servertest.ClosedURL(t))
	sums := map[string]string{}
	full := func(name string, rev int64, at time.Time) {
		m := &storage.Manifest{Name: name, CreateTime: at.Add(time.Minute),
			Source: storage.Source{Kind: ebv1.SourceAgent, Target: "app", StartTime: at},
			Etcd:   &storage.EtcdInfo{Revision: rev, SnapshotStatus: true}}
		backuptest.Put(t, w.Location, m, []byte("full "+name))
		sums[name] = m.SHA256
	}
	segment := func(chain string, first, last int64, from time.Time) {
		name := storage.SegmentName(chain, first)
		m := &storage.Manifest{Name: name, CreateTime: from, Compression: "zstd",
			Source: storage.Source{Kind: ebv1.SourceDelta, Target: "app"},
			Delta:  &storage.Delta{Chain: chain, Epoch: 1, FirstRevision: first, LastRevision: last, FirstTime: from, LastTime: from.Add(9 * time.Minute), Events: last - first + 1}}
		backuptest.Put(t, w.Location, m, []byte("segment "+name))
		sums[name] = m.SHA256
	}
	full("f1", 10, pointT0)
	segment("f1", 11, 20, pointT0.Add(time.Minute))
	segment("f1", 21, 30, pointT0.Add(11*time.Minute))
	full("f2", 100, pointT0.Add(time.Hour))
	return w, sums
}

func TestRestoreToARevisionInTheCluster(t *testing.T) {
	w, sums := pointWorld(t)
	ctx := context.Background()
	resp, err := w.Server.RestoreBackup(ctx, &ebv1.RestoreBackupRequest{Target: "app", ToRevision: 25, AllowLeaseLoss: true})
	if err != nil {
		t.Fatal(err)
	}
	if resp.GetBackup() != "f1" || strings.Join(resp.GetSegments(), ",") != "f1.delta-11,f1.delta-21" || resp.GetToRevision() != 25 {
		t.Fatalf("plan: backup %q, segments %v, to revision %d; want f1, both segments, 25", resp.GetBackup(), resp.GetSegments(), resp.GetToRevision())
	}
	list := w.Jobs(t)
	if len(list) != 2 {
		t.Fatalf("%d jobs, want one per member", len(list))
	}
	for _, j := range list {
		if j.Annotations[jobs.AnnotationBackup] != "f1" || j.Annotations[jobs.AnnotationSHA256] != sums["f1"] || j.Annotations[jobs.AnnotationToRevision] != "25" {
			t.Errorf("job %s annotations %v: not the full f1 pinned, to revision 25", j.Name, j.Annotations)
		}
		segs, err := jobs.DecodeSegments(j.Annotations[jobs.AnnotationDeltaSegments])
		if err != nil || len(segs) != 2 || segs[0] != (jobs.SegmentPin{Name: "f1.delta-11", SHA256: sums["f1.delta-11"]}) ||
			segs[1] != (jobs.SegmentPin{Name: "f1.delta-21", SHA256: sums["f1.delta-21"]}) {
			t.Errorf("job %s segments %v, %v; want both of f1's, pinned", j.Name, segs, err)
		}
		args := strings.Join(j.Spec.Template.Spec.Containers[0].Args, " ")
		for _, want := range []string{"--name=f1", "--sha256=" + sums["f1"], "--to-revision=25", "--allow-lease-loss", "--segments-file="} {
			if !strings.Contains(args, want) {
				t.Errorf("job %s args %s lack %s", j.Name, args, want)
			}
		}
	}
	// GetRestore follows it under the full's name, as --wait asks.
	if r, err := w.Server.GetRestore(ctx, &ebv1.GetRestoreRequest{Name: "f1", Target: "app"}); err != nil || len(r.GetMembers()) != 2 {
		t.Fatalf("GetRestore of f1: %v, %v", r, err)
	}
}

// A time inside f1's chain plans f1 and the segments seen by then; a dry
// run creates nothing. A name restricts the full backup picked.
func TestRestoreToATimeDryRunAndNamedFull(t *testing.T) {
	w, _ := pointWorld(t)
	ctx := context.Background()
	resp, err := w.Server.RestoreBackup(ctx, &ebv1.RestoreBackupRequest{Target: "app", DryRun: true, ToTime: timestamppb.New(pointT0.Add(5 * time.Minute))})
	if err != nil {
		t.Fatal(err)
	}
	if resp.GetBackup() != "f1" || strings.Join(resp.GetSegments(), ",") != "f1.delta-11" || len(resp.GetMembers()) != 2 {
		t.Fatalf("dry-run plan: %v", resp)
	}
	for _, m := range resp.GetMembers() {
		if m.GetPhase() != ebv1.RestorePhase_RESTORE_PHASE_PENDING || !strings.Contains(m.GetJobName(), "restore-") {
			t.Errorf("member %v", m)
		}
	}
	if n := len(w.Jobs(t)); n != 0 {
		t.Fatalf("a dry run created %d jobs", n)
	}
	resp, err = w.Server.RestoreBackup(ctx, &ebv1.RestoreBackupRequest{Name: "f2", Target: "app", DryRun: true, ToRevision: 100})
	if err != nil || resp.GetBackup() != "f2" || len(resp.GetSegments()) != 0 || resp.GetToRevision() != 100 {
		t.Fatalf("restore of f2 to its own revision: %v, %v", resp, err)
	}
}

func TestRestoreToAPointRefusals(t *testing.T) {
	w, _ := pointWorld(t)
	ctx := context.Background()
	for _, c := range []struct {
		name string
		req  *ebv1.RestoreBackupRequest
		code codes.Code
		want string
	}{
		{"both", &ebv1.RestoreBackupRequest{Target: "app", ToRevision: 25, ToTime: timestamppb.New(pointT0)}, codes.InvalidArgument, "not both"},
		{"negative", &ebv1.RestoreBackupRequest{Target: "app", ToRevision: -1}, codes.InvalidArgument, "positive"},
		{"lease loss alone", &ebv1.RestoreBackupRequest{Name: "f1", Target: "app", AllowLeaseLoss: true}, codes.InvalidArgument, "--allow-lease-loss goes with"},
		{"no name, no point", &ebv1.RestoreBackupRequest{Target: "app"}, codes.InvalidArgument, "backup"},
		{"gap", &ebv1.RestoreBackupRequest{Target: "app", ToRevision: 50}, codes.FailedPrecondition, "recoverable: revisions 10..30"},
		{"before", &ebv1.RestoreBackupRequest{Target: "app", ToRevision: 5}, codes.FailedPrecondition, "before the oldest full backup"},
		{"after", &ebv1.RestoreBackupRequest{Target: "app", ToRevision: 500}, codes.FailedPrecondition, "after the newest event"},
		{"named full after the point", &ebv1.RestoreBackupRequest{Name: "f2", Target: "app", ToRevision: 25}, codes.FailedPrecondition, "before the oldest full backup"},
		{"not a chain's full", &ebv1.RestoreBackupRequest{Name: "b1", Target: "app", ToRevision: 25}, codes.FailedPrecondition, "no full backup of backup \"b1\""},
	} {
		_, err := w.Server.RestoreBackup(ctx, c.req)
		if status.Code(err) != c.code || !strings.Contains(status.Convert(err).Message(), c.want) {
			t.Errorf("%s: %v; want %s saying %q", c.name, err, c.code, c.want)
		}
	}
	if n := len(w.Jobs(t)); n != 0 {
		t.Fatalf("refused restores created %d jobs", n)
	}
}

// Segments encrypted need the identity Secret as the full does.
func TestRestoreToAPointOfEncryptedSegmentsNeedsIdentitySecret(t *testing.T) {
	w, _ := pointWorld(t)
	m := &storage.Manifest{Name: storage.SegmentName("f2", 101), Encryption: "age",
		Source: storage.Source{Kind: ebv1.SourceDelta, Target: "app"},
		Delta:  &storage.Delta{Chain: "f2", Epoch: 1, FirstRevision: 101, LastRevision: 110, FirstTime: pointT0.Add(61 * time.Minute), LastTime: pointT0.Add(62 * time.Minute)}}
	backuptest.Put(t, w.Location, m, []byte("encrypted segment"))
	_, err := w.Server.RestoreBackup(context.Background(), &ebv1.RestoreBackupRequest{Target: "app", ToRevision: 105, DryRun: true})
	if status.Code(err) != codes.FailedPrecondition || !strings.Contains(err.Error(), "--identity-secret") {
		t.Fatalf("restore to a point through an encrypted segment without a Secret: %v", err)
	}
}
