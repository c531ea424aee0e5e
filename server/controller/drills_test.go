package controller

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	ebv1 "github.com/kubectl-etcdbackup/kubectl-etcdbackup/api/etcdbackup/v1"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/server/config"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/server/jobs"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/server/metrics"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/server/retention"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/server/servertest/backuptest"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/storage"
)

func drilledTarget() config.Target {
	return config.Target{Name: "cp", Endpoints: []string{"http://127.0.0.1:1"}, InsecurePlaintext: true,
		Drill: &config.Drill{Schedule: "*/10 * * * *", IdentitySecret: "cp-age-identity"}}
}

// storeFingerprinted puts an agent backup of the target that records its
// keyspace fingerprint, as every backup since it was recorded does.
func (sw *schedWorld) storeFingerprinted(name string, created time.Time) {
	sw.t.Helper()
	m := &storage.Manifest{Name: name, SHA256: strings.Repeat("a", 64), CreateTime: created,
		Source: storage.Source{Kind: ebv1.SourceAgent, Target: sw.target.Name, Scheduled: true, ScheduledTime: created},
		Etcd:   &storage.EtcdInfo{Revision: 42, KeyspaceKeys: 7, HashKV: 99, Keyspace: true}}
	backuptest.Put(sw.t, sw.loc, m, []byte("data of "+name))
}

func (sw *schedWorld) drillJobs() []batchv1.Job {
	var out []batchv1.Job
	for _, j := range sw.jobs() {
		if j.Labels[jobs.LabelComponent] == jobs.ComponentDrill {
			out = append(out, j)
		}
	}
	return out
}

// endDrill ends drill Job j as the Job controller would, its pod's
// container having written verdict (nil: none) as its termination message.
func (sw *schedWorld) endDrill(j batchv1.Job, verdict *jobs.DrillVerdict, exitCode int32) {
	sw.t.Helper()
	msg := ""
	if verdict != nil {
		b, _ := json.Marshal(verdict)
		msg = string(b)
	}
	sw.endAgent(j, msg, exitCode)
}

// endAgent ends agent Job j as the Job controller would, its pod's
// container having written msg as its termination message.
func (sw *schedWorld) endAgent(j batchv1.Job, msg string, exitCode int32) {
	sw.t.Helper()
	ctx := context.Background()
	labels := map[string]string{batchv1.JobNameLabel: j.Name}
	for k, v := range j.Spec.Template.Labels {
		labels[k] = v
	}
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: j.Name + "-x", Namespace: testNS, Labels: labels,
			OwnerReferences: []metav1.OwnerReference{{APIVersion: "batch/v1", Kind: "Job", Name: j.Name, UID: j.UID, Controller: new(true)}}},
		Status: corev1.PodStatus{ContainerStatuses: []corev1.ContainerStatus{{Name: "agent",
			State: corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{ExitCode: exitCode, Message: msg}}}}},
	}
	// A Job replaced under its name had its pods collected with it.
	_ = sw.cs.CoreV1().Pods(testNS).Delete(ctx, pod.Name, metav1.DeleteOptions{})
	if _, err := sw.cs.CoreV1().Pods(testNS).Create(ctx, pod, metav1.CreateOptions{}); err != nil {
		sw.t.Fatal(err)
	}
	cond := batchv1.JobComplete
	if exitCode != 0 {
		cond = batchv1.JobFailed
	}
	j.Status.Conditions = append(j.Status.Conditions, batchv1.JobCondition{Type: cond, Status: corev1.ConditionTrue, Reason: "BackoffLimitExceeded"})
	j.Status.CompletionTime = &metav1.Time{Time: sw.now}
	if _, err := sw.cs.BatchV1().Jobs(testNS).UpdateStatus(ctx, &j, metav1.UpdateOptions{}); err != nil {
		sw.t.Fatal(err)
	}
	sw.synced()
}

func (sw *schedWorld) verification(name string) *storage.Verification {
	sw.t.Helper()
	m, err := sw.loc.Stat(context.Background(), name)
	if err != nil {
		sw.t.Fatal(err)
	}
	return m.Verification
}

func (sw *schedWorld) drillRuns(result string) float64 {
	return testutil.ToFloat64(sw.metrics.DrillRuns.WithLabelValues(sw.target.Name, result))
}

// A drill schedule drills the newest backup of its target that records a
// fingerprint, pinned to its SHA-256, with the target's identity Secret;
// the verdict lands in the manifest and the metrics.
func TestScheduledDrillRecordsItsVerdict(t *testing.T) {
	sw := newSchedWorld(t, drilledTarget(), backuptest.MustTime(t, "2026-12-01T10:02:00Z"))
	sw.storeFingerprinted("cp-old", backuptest.MustTime(t, "2026-12-01T08:00:00Z"))
	sw.storeFingerprinted("cp-new", backuptest.MustTime(t, "2026-12-01T09:00:00Z"))
	backuptest.Store(t, sw.loc, "cp", "cp-newest-but-no-fingerprint", false, backuptest.MustTime(t, "2026-12-01T09:30:00Z"))
	sw.at("2026-12-01T10:02:00Z")
	if n := len(sw.drillJobs()); n != 0 {
		t.Fatalf("%d drill jobs before the drill's time", n)
	}
	sw.at("2026-12-01T10:10:01Z")
	ds := sw.drillJobs()
	if len(ds) != 1 || ds[0].Annotations[jobs.AnnotationBackup] != "cp-new" {
		t.Fatalf("drill jobs %v, want one of cp-new", ds)
	}
	args := ds[0].Spec.Template.Spec.Containers[0].Args
	for _, want := range []string{"drill", "--name=cp-new", "--sha256=" + strings.Repeat("a", 64), "--identity-dir=/etc/etcdbackup/age-identity"} {
		if !slices.Contains(args, want) {
			t.Errorf("drill args %q lack %q", args, want)
		}
	}
	if ds[0].Labels[jobs.LabelScheduled] != "true" {
		t.Errorf("drill job labels %v", ds[0].Labels)
	}
	// Another round while it runs starts nothing more.
	sw.at("2026-12-01T10:20:01Z")
	if n := len(sw.drillJobs()); n != 1 {
		t.Fatalf("%d drill jobs while one runs", n)
	}
	sw.endDrill(ds[0], &jobs.DrillVerdict{Succeeded: true, Revision: 42, Keys: 7, HashKV: 99, Message: "as recorded", Duration: 3 * time.Second}, 0)
	sw.at("2026-12-01T10:21:00Z")
	v := sw.verification("cp-new")
	if v == nil || v.Result != storage.VerificationSucceeded || v.Revision != 42 || v.Keys != 7 || v.HashKV != 99 || v.Job != ds[0].Name || v.Duration != 3*time.Second {
		t.Fatalf("verification %+v", v)
	}
	if got := sw.drillRuns(metrics.DrillSucceeded); got != 1 {
		t.Errorf("drill runs succeeded = %v", got)
	}
	if got := testutil.ToFloat64(sw.metrics.LastVerified.WithLabelValues("cp", "default")); got != float64(backuptest.MustTime(t, "2026-12-01T09:00:00Z").Unix()) {
		t.Errorf("last verified = %v", got)
	}
	// Counted once: another round records nothing again.
	sw.at("2026-12-01T10:22:00Z")
	if got := sw.drillRuns(metrics.DrillSucceeded); got != 1 {
		t.Errorf("drill runs succeeded after another round = %v", got)
	}
	// A restarted server knows the last verified backup from storage.
	sw.restart()
	sw.at("2026-12-01T10:23:00Z")
	if got := testutil.ToFloat64(sw.metrics.LastVerified.WithLabelValues("cp", "default")); got != float64(backuptest.MustTime(t, "2026-12-01T09:00:00Z").Unix()) {
		t.Errorf("last verified after a restart = %v", got)
	}
}

// A failed drill is recorded as failed with the agent's words; a drill
// agent that ends without a verdict is an error that says nothing was
// learned about the backup.
func TestFailedDrillsAndDrillsWithoutAVerdict(t *testing.T) {
	sw := newSchedWorld(t, drilledTarget(), backuptest.MustTime(t, "2026-12-01T10:02:00Z"))
	sw.storeFingerprinted("b1", backuptest.MustTime(t, "2026-12-01T08:00:00Z"))
	sw.storeFingerprinted("b2", backuptest.MustTime(t, "2026-12-01T07:00:00Z"))
	sw.at("2026-12-01T10:02:00Z")
	for _, name := range []string{"b1", "b2"} {
		if _, err := sw.srv.DrillBackup(context.Background(), &ebv1.DrillBackupRequest{Name: name}); err != nil {
			t.Fatal(err)
		}
	}
	sw.synced()
	for _, j := range sw.drillJobs() {
		switch j.Annotations[jobs.AnnotationBackup] {
		case "b1":
			sw.endDrill(j, &jobs.DrillVerdict{Revision: 42, Keys: 6, HashKV: 5, Message: "the restored keyspace differs"}, 3)
		case "b2":
			sw.endDrill(j, nil, 1)
		}
	}
	sw.at("2026-12-01T10:03:00Z")
	if v := sw.verification("b1"); v == nil || v.Result != storage.VerificationFailed || v.Message != "the restored keyspace differs" {
		t.Fatalf("verification of b1 %+v", v)
	}
	if v := sw.verification("b2"); v == nil || v.Result != storage.VerificationError || !strings.Contains(v.Message, "nothing was learned") {
		t.Fatalf("verification of b2 %+v", v)
	}
	if sw.drillRuns(metrics.DrillFailed) != 1 || sw.drillRuns(metrics.DrillError) != 1 || sw.drillRuns(metrics.DrillSucceeded) != 0 {
		t.Errorf("drill runs: failed %v error %v succeeded %v", sw.drillRuns(metrics.DrillFailed), sw.drillRuns(metrics.DrillError), sw.drillRuns(metrics.DrillSucceeded))
	}
	// A drill of the same backup again replaces the finished Job.
	if _, err := sw.srv.DrillBackup(context.Background(), &ebv1.DrillBackupRequest{Name: "b1"}); err != nil {
		t.Fatal(err)
	}

	// A backup a drill verified keeps that verdict when a later drill of
	// it learns nothing (its agent evicted, say): retention counts on it.
	if _, err := sw.srv.DrillBackup(context.Background(), &ebv1.DrillBackupRequest{Name: "b2"}); err != nil {
		t.Fatal(err)
	}
	sw.synced()
	for _, j := range sw.drillJobs() {
		if j.Annotations[jobs.AnnotationBackup] == "b2" {
			sw.endDrill(j, &jobs.DrillVerdict{Succeeded: true, Revision: 42, Keys: 6, HashKV: 5, Message: "as recorded"}, 0)
		}
	}
	sw.at("2026-12-01T10:04:00Z")
	if v := sw.verification("b2"); v == nil || v.Result != storage.VerificationSucceeded {
		t.Fatalf("verification of b2 after a successful drill %+v", v)
	}
	if _, err := sw.srv.DrillBackup(context.Background(), &ebv1.DrillBackupRequest{Name: "b2"}); err != nil {
		t.Fatal(err)
	}
	sw.synced()
	for _, j := range sw.drillJobs() {
		if j.Annotations[jobs.AnnotationBackup] == "b2" {
			sw.endDrill(j, nil, 1)
		}
	}
	sw.at("2026-12-01T10:05:00Z")
	if v := sw.verification("b2"); v == nil || v.Result != storage.VerificationSucceeded || v.Message != "as recorded" {
		t.Fatalf("verification of b2 after a drill without a verdict %+v, want the earlier success kept", v)
	}
	if sw.drillRuns(metrics.DrillError) != 2 {
		t.Errorf("drill runs with an error: %v, want 2 (the one that kept the verdict counts)", sw.drillRuns(metrics.DrillError))
	}
}

// Retention keeps the newest verified backup beyond keepLast; once a drill
// verifies a newer one, the older is removed at once, not at the next
// scheduled run.
func TestRetentionAfterASuccessfulDrill(t *testing.T) {
	target := drilledTarget()
	target.Retention = &config.Retention{KeepLast: 1}
	sw := newSchedWorld(t, target, backuptest.MustTime(t, "2026-12-01T10:02:00Z"))
	sw.storeFingerprinted("cp-1", backuptest.MustTime(t, "2026-12-01T08:00:00Z"))
	if err := sw.loc.(storage.VerificationWriter).SetVerification(context.Background(), "cp-1",
		&storage.Verification{Result: storage.VerificationSucceeded, Time: sw.now}); err != nil {
		t.Fatal(err)
	}
	sw.storeFingerprinted("cp-2", backuptest.MustTime(t, "2026-12-01T09:00:00Z"))
	sw.at("2026-12-01T10:02:00Z")
	if _, err := sw.srv.DrillBackup(context.Background(), &ebv1.DrillBackupRequest{Name: "cp-2"}); err != nil {
		t.Fatal(err)
	}
	sw.synced()
	backuptest.Equal(t, "stored while cp-2 is being drilled (keepLast 1 keeps the newest verified too)", sw.stored(), []string{"cp-1", "cp-2"})
	sw.endDrill(sw.drillJobs()[0], &jobs.DrillVerdict{Succeeded: true, Revision: 42, Keys: 7, HashKV: 99}, 0)
	sw.at("2026-12-01T10:03:00Z")
	backuptest.Equal(t, "stored after cp-2 was verified", sw.stored(), []string{"cp-2"})
}

// A drill whose identity Secret is missing or holds no identity starts no
// Job: on demand it is a FailedPrecondition that says what to create; on
// schedule the newest backup's verification is an Error (nothing was
// learned about it), never Failed, and a backup already verified keeps
// its verdict.
func TestDrillWithoutItsIdentitySecret(t *testing.T) {
	sw := newSchedWorld(t, drilledTarget(), backuptest.MustTime(t, "2026-12-01T10:02:00Z"))
	ctx := context.Background()
	if err := sw.cs.CoreV1().Secrets(testNS).Delete(ctx, "cp-age-identity", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	sw.storeFingerprinted("cp-old", backuptest.MustTime(t, "2026-12-01T08:00:00Z"))
	sw.storeFingerprinted("cp-new", backuptest.MustTime(t, "2026-12-01T09:00:00Z"))
	sw.at("2026-12-01T10:02:00Z")

	_, err := sw.srv.DrillBackup(ctx, &ebv1.DrillBackupRequest{Name: "cp-old"})
	if status.Code(err) != codes.FailedPrecondition {
		t.Fatalf("on-demand drill without its identity Secret: %v; want FailedPrecondition", err)
	}
	for _, w := range []string{"did not start", "nothing was learned", testNS + "/cp-age-identity does not exist", "create secret generic cp-age-identity"} {
		if !strings.Contains(status.Convert(err).Message(), w) {
			t.Errorf("on-demand drill error %q does not say %q", err, w)
		}
	}
	if v := sw.verification("cp-old"); v != nil {
		t.Errorf("an on-demand drill that did not start recorded %+v", v)
	}

	sw.at("2026-12-01T10:10:01Z")
	if n := len(sw.drillJobs()); n != 0 {
		t.Fatalf("%d drill jobs without the identity Secret", n)
	}
	v := sw.verification("cp-new")
	if v == nil || v.Result != storage.VerificationError || !strings.Contains(v.Message, "cp-age-identity does not exist") {
		t.Fatalf("verification of cp-new after a scheduled drill without its Secret: %+v; want Error saying the Secret is missing", v)
	}
	if sw.drillRuns(metrics.DrillError) != 1 || sw.drillRuns(metrics.DrillFailed) != 0 {
		t.Errorf("drill runs: error %v failed %v", sw.drillRuns(metrics.DrillError), sw.drillRuns(metrics.DrillFailed))
	}

	// A verified backup keeps its verdict.
	if err := setVerification(ctx, sw.loc, "cp-new", &storage.Verification{Time: sw.now, Result: storage.VerificationSucceeded, Message: "as recorded"}); err != nil {
		t.Fatal(err)
	}
	sw.at("2026-12-01T10:20:01Z")
	if v := sw.verification("cp-new"); v == nil || v.Result != storage.VerificationSucceeded {
		t.Fatalf("verification of a verified backup after a drill that could not start: %+v", v)
	}
}

// A drill that finds a verified backup damaged records Failed in place of
// the earlier success: list, describe and get show the newest verdict,
// the metrics count it failed and no longer call the backup verified,
// and retention no longer keeps it as the newest verified one. A drill
// that could not fetch a backup whose manifest is stored but whose data
// is not (missing, or not the object stored with it) is Failed too.
func TestAFailedDrillReplacesAVerification(t *testing.T) {
	target := drilledTarget()
	target.Retention = &config.Retention{KeepLast: 1}
	sw := newSchedWorld(t, target, backuptest.MustTime(t, "2026-12-01T10:02:00Z"))
	ctx := context.Background()
	sw.storeFingerprinted("cp-1", backuptest.MustTime(t, "2026-12-01T08:00:00Z"))
	sw.storeFingerprinted("cp-2", backuptest.MustTime(t, "2026-12-01T09:00:00Z"))
	if err := setVerification(ctx, sw.loc, "cp-1", &storage.Verification{Result: storage.VerificationSucceeded, Time: sw.now, Message: "as recorded"}); err != nil {
		t.Fatal(err)
	}
	sw.at("2026-12-01T10:02:00Z")
	removed := func() []string {
		manifests, err := sw.loc.List(ctx)
		if err != nil {
			t.Fatal(err)
		}
		var out []string
		for _, m := range retention.Select(manifests, retention.Policy{Target: "cp", Retention: *target.Retention, IncludeUnscheduled: false}, sw.now) {
			out = append(out, m.Name)
		}
		return out
	}
	backuptest.Equal(t, "retention removes, with cp-1 verified", removed(), nil)
	if got := testutil.ToFloat64(sw.metrics.LastVerified.WithLabelValues("cp", "default")); got != float64(backuptest.MustTime(t, "2026-12-01T08:00:00Z").Unix()) {
		t.Fatalf("last verified = %v, want cp-1's time", got)
	}

	if _, err := sw.srv.DrillBackup(ctx, &ebv1.DrillBackupRequest{Name: "cp-1"}); err != nil {
		t.Fatal(err)
	}
	sw.synced()
	msg := "the backup does not restore: the stored SHA-256 check failed — the bytes stored are not the ones recorded; do not restore it"
	sw.endDrill(sw.drillJobs()[0], &jobs.DrillVerdict{Message: msg}, 3)
	sw.at("2026-12-01T10:03:00Z")
	if v := sw.verification("cp-1"); v == nil || v.Result != storage.VerificationFailed || v.Message != msg {
		t.Fatalf("verification of cp-1 after a failed drill: %+v, want Failed replacing the success", v)
	}
	if sw.drillRuns(metrics.DrillFailed) != 1 {
		t.Errorf("drill runs failed = %v", sw.drillRuns(metrics.DrillFailed))
	}
	if got := testutil.ToFloat64(sw.metrics.LastVerified.WithLabelValues("cp", "default")); got != 0 {
		t.Errorf("last verified = %v after the only verified backup failed its drill, want 0", got)
	}
	backuptest.Equal(t, "retention removes once cp-1 failed its drill", removed(), []string{"cp-1"})

	// cp-2 verified, then its data removed behind the server's back: the
	// drill agent could not fetch it and ended without a verdict; the
	// server finds the manifest stored and the data not, and records
	// Failed, not "nothing was learned".
	if err := setVerification(ctx, sw.loc, "cp-2", &storage.Verification{Result: storage.VerificationSucceeded, Time: sw.now, Message: "as recorded"}); err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(filepath.Join(sw.dir, "backups", "cp-2.db")); err != nil {
		t.Fatal(err)
	}
	if _, err := sw.srv.DrillBackup(ctx, &ebv1.DrillBackupRequest{Name: "cp-2"}); err != nil {
		t.Fatal(err)
	}
	sw.synced()
	for _, j := range sw.drillJobs() {
		if j.Annotations[jobs.AnnotationBackup] == "cp-2" {
			sw.endDrill(j, &jobs.DrillVerdict{NoVerdict: true, Message: "the data server could not read the backup's stored data (NotFound)"}, 1)
		}
	}
	sw.at("2026-12-01T10:04:00Z")
	v := sw.verification("cp-2")
	if v == nil || v.Result != storage.VerificationFailed || !strings.Contains(v.Message, "cannot be read back as it was stored") || !strings.Contains(v.Message, "do not restore it") {
		t.Fatalf("verification of cp-2 whose data is gone: %+v, want Failed", v)
	}
	if sw.drillRuns(metrics.DrillFailed) != 2 || sw.drillRuns(metrics.DrillError) != 0 {
		t.Errorf("drill runs: failed %v error %v", sw.drillRuns(metrics.DrillFailed), sw.drillRuns(metrics.DrillError))
	}
}

// An upload that claims the target (as stored before claims were kept
// apart, or by hand in storage), newer than the target's own backup and
// verified: the drill schedule drills the target's own backup, and the
// last-verified metric never moves for the upload (issue 37 #4).
func TestScheduledDrillIgnoresUploadsClaimingTheTarget(t *testing.T) {
	sw := newSchedWorld(t, drilledTarget(), backuptest.MustTime(t, "2026-12-01T10:02:00Z"))
	sw.storeFingerprinted("cp-own", backuptest.MustTime(t, "2026-12-01T08:00:00Z"))
	upload := &storage.Manifest{Name: "cp-uploaded", SHA256: strings.Repeat("b", 64), CreateTime: backuptest.MustTime(t, "2026-12-01T09:00:00Z"),
		Source:       storage.Source{Kind: ebv1.SourceUpload, Target: "cp"},
		Etcd:         &storage.EtcdInfo{Revision: 9000, SnapshotStatus: true, KeyspaceKeys: 7, HashKV: 99, Keyspace: true},
		Verification: &storage.Verification{Result: storage.VerificationSucceeded, Time: backuptest.MustTime(t, "2026-12-01T09:10:00Z")}}
	backuptest.Put(t, sw.loc, upload, []byte("the uploader's keyspace"))
	sw.restart() // recalls the last verified backup from storage
	sw.at("2026-12-01T10:10:01Z")
	ds := sw.drillJobs()
	if len(ds) != 1 || ds[0].Annotations[jobs.AnnotationBackup] != "cp-own" {
		t.Fatalf("drill jobs %v, want one of the target's own cp-own", ds)
	}
	if got := testutil.ToFloat64(sw.metrics.LastVerified.WithLabelValues("cp", "default")); got != 0 {
		t.Errorf("last verified of cp = %v: the upload's verification counted", got)
	}
}
