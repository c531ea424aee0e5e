package jobs_test

import (
	"bytes"
	"context"
	"maps"
	"slices"
	"strings"
	"testing"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/server/config"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/server/jobs"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/snapshot"
)

// The first server makes the key and stores it; every later one reads
// the same key back, so it recognises the Jobs signed before it started.
func TestSigningKeySurvivesRestart(t *testing.T) {
	cs := fake.NewClientset()
	ctx := context.Background()
	first, err := jobs.LoadSigner(ctx, cs, ns)
	if err != nil {
		t.Fatal(err)
	}
	s, err := cs.CoreV1().Secrets(ns).Get(ctx, jobs.SigningKeySecret, metav1.GetOptions{})
	if err != nil {
		t.Fatalf("the key's Secret: %v", err)
	}
	if n := len(s.Data[jobs.SigningKeyField]); n != 32 {
		t.Fatalf("key of %d bytes, want 32", n)
	}
	job := &batchv1.Job{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "backup-b1-0123456789", UID: types.UID("u1"),
		Labels:      map[string]string{jobs.LabelComponent: jobs.ComponentBackup},
		Annotations: map[string]string{jobs.AnnotationBackup: "b1", jobs.AnnotationLocation: "default", jobs.AnnotationTarget: "t"}}}
	job.Annotations[jobs.AnnotationSignature] = first.Sign(jobs.ClaimsOf(job))

	again, err := jobs.LoadSigner(ctx, cs, ns)
	if err != nil {
		t.Fatal(err)
	}
	if err := again.Verify(job); err != nil {
		t.Fatalf("after a restart: %v", err)
	}
	// What each claim covers: a change to any refuses.
	for what, change := range map[string]func(j *batchv1.Job){
		"uid":       func(j *batchv1.Job) { j.UID = "u2" },
		"namespace": func(j *batchv1.Job) { j.Namespace = "elsewhere" },
		"name":      func(j *batchv1.Job) { j.Name += "x" },
		"kind":      func(j *batchv1.Job) { j.Labels[jobs.LabelComponent] = jobs.ComponentRestore },
		"scheduled": func(j *batchv1.Job) { j.Labels[jobs.LabelScheduled] = "true" },
		"backup":    func(j *batchv1.Job) { j.Annotations[jobs.AnnotationBackup] = "b2" },
		"location":  func(j *batchv1.Job) { j.Annotations[jobs.AnnotationLocation] = "other" },
		"target":    func(j *batchv1.Job) { j.Annotations[jobs.AnnotationTarget] = "u" },
		"sha256":    func(j *batchv1.Job) { j.Annotations[jobs.AnnotationSHA256] = strings.Repeat("0", 64) },
		"garbage":   func(j *batchv1.Job) { j.Annotations[jobs.AnnotationSignature] = "not base64!" },
		"unsigned":  func(j *batchv1.Job) { delete(j.Annotations, jobs.AnnotationSignature) },
	} {
		j := job.DeepCopy()
		change(j)
		if err := again.Verify(j); err == nil {
			t.Errorf("%s changed: the signature still fits", what)
		}
	}
	// Other annotations (the counted mark) are not signed.
	j := job.DeepCopy()
	j.Annotations[jobs.AnnotationCounted] = "true"
	if err := again.Verify(j); err != nil {
		t.Errorf("counted: %v", err)
	}
}

// A key too short to trust is refused, and the refusal does not show it.
func TestSigningKeyTooShort(t *testing.T) {
	short := []byte("short-secret-key")
	cs := fake.NewClientset(&corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: jobs.SigningKeySecret},
		Data:       map[string][]byte{jobs.SigningKeyField: short},
	})
	_, err := jobs.LoadSigner(context.Background(), cs, ns)
	if err == nil || !strings.Contains(err.Error(), jobs.SigningKeySecret) {
		t.Fatalf("a 16-byte key: %v; want an error naming the Secret", err)
	}
	if bytes.Contains([]byte(err.Error()), short) {
		t.Fatalf("the error shows the key: %v", err)
	}
}

// The Launcher creates each Job suspended and lets it run only once it
// has signed it; a restarted Launcher (same Secret) recognises them.
func TestJobsAreSignedBeforeTheyRun(t *testing.T) {
	l, cs := newLauncher(t, config.Agents{})
	ctx := context.Background()
	if err := l.LoadSigningKey(ctx); err != nil {
		t.Fatal(err)
	}
	b, err := l.StartBackup(ctx, jobs.BackupSpec{Name: "b1", Location: "default", Target: target, Scheduled: true})
	if err != nil {
		t.Fatal(err)
	}
	rs, err := l.StartRestore(ctx, jobs.RestoreSpec{Name: "b1", Location: "default", Target: restoreTarget, SHA256: strings.Repeat("a", 64)})
	if err != nil {
		t.Fatal(err)
	}
	restarted, err := jobs.New(cs, ns, config.Agents{Image: "agent:dev"})
	if err != nil {
		t.Fatal(err)
	}
	if err := restarted.LoadSigningKey(ctx); err != nil {
		t.Fatal(err)
	}
	for _, j := range append(rs, b) {
		got, err := cs.BatchV1().Jobs(j.Namespace).Get(ctx, j.Name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if got.Spec.Suspend == nil || *got.Spec.Suspend {
			t.Errorf("job %s: suspend %v after signing, want false", j.Name, got.Spec.Suspend)
		}
		if !l.Signed(got) || !restarted.Signed(got) {
			t.Errorf("job %s: not signed, or not recognised after a restart (annotations %v)", j.Name, got.Annotations)
		}
		if c := jobs.ClaimsOf(got); c.Backup != "b1" || c.Kind == "" {
			t.Errorf("job %s claims %+v", j.Name, c)
		}
	}
}

// A Job someone else made with every label and annotation of a running
// restore Job (its signature too) does not hold the backup: delete and
// retention go on, and the restore's listing does not show it.
func TestForgedRestoreJobsDoNotCount(t *testing.T) {
	l, cs := newLauncher(t, config.Agents{})
	ctx := context.Background()
	rs, err := l.StartRestore(ctx, jobs.RestoreSpec{Name: "b1", Location: "default", Target: restoreTarget, SHA256: strings.Repeat("a", 64)})
	if err != nil {
		t.Fatal(err)
	}
	real := rs[0]
	forged := &batchv1.Job{ObjectMeta: metav1.ObjectMeta{
		Name: "restore-forged-0123456789", Namespace: real.Namespace, UID: "uid-of-the-forgery",
		Labels: maps.Clone(real.Labels), Annotations: maps.Clone(real.Annotations),
	}, Spec: *real.Spec.DeepCopy()}
	forged.Annotations[jobs.AnnotationBackup] = "b2"
	if _, err := cs.BatchV1().Jobs(real.Namespace).Create(ctx, forged, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	synced(t, l)
	running, err := l.RunningRestores(ctx, "default", "b2", restoreTargets)
	if err != nil || len(running) != 0 {
		t.Fatalf("running restores of b2, read only by a forged Job: %v, %v; want none", running, err)
	}
	runs, err := l.ListRestores(ctx, "default", "b2", restoreTarget)
	if err != nil || len(runs) != 0 {
		t.Fatalf("restores of b2: %v, %v; want none", runs, err)
	}
	// The server's own still counts.
	if running, err := l.RunningRestores(ctx, "default", "b1", restoreTargets); err != nil || len(running) != 1 {
		t.Fatalf("running restores of b1: %v, %v; want the server's own Job", running, err)
	}
}

// The key follows its Secret: removed by a restore of the cluster (every
// backup of it holds the key), the Secret is made anew with a new key,
// which the server uses from then on; a Job signed with the old one,
// such as a Job that came back with the restored cluster, is refused
// (issue 37).
func TestSigningKeyFollowsItsSecret(t *testing.T) {
	cs := fake.NewClientset()
	ctx := context.Background()
	l, err := jobs.New(cs, ns, config.Agents{Image: "agent:dev"})
	if err != nil {
		t.Fatal(err)
	}
	if err := l.LoadSigningKey(ctx); err != nil {
		t.Fatal(err)
	}
	job := &batchv1.Job{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "backup-b1-0123456789", UID: types.UID("u1"),
		Labels:      map[string]string{jobs.LabelComponent: jobs.ComponentBackup},
		Annotations: map[string]string{jobs.AnnotationBackup: "b1", jobs.AnnotationLocation: "default", jobs.AnnotationTarget: "t"}}}
	job.Annotations[jobs.AnnotationSignature] = l.Signer().Sign(jobs.ClaimsOf(job))
	if changed, err := l.RefreshSigningKey(ctx); err != nil || changed {
		t.Fatalf("refresh with the Secret unchanged: %v, %v", changed, err)
	}
	if err := l.Verify(job); err != nil {
		t.Fatal(err)
	}
	old, err := cs.CoreV1().Secrets(ns).Get(ctx, jobs.SigningKeySecret, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if err := cs.CoreV1().Secrets(ns).Delete(ctx, jobs.SigningKeySecret, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	if changed, err := l.RefreshSigningKey(ctx); err != nil || !changed {
		t.Fatalf("refresh after the Secret was removed: %v, %v", changed, err)
	}
	made, err := cs.CoreV1().Secrets(ns).Get(ctx, jobs.SigningKeySecret, metav1.GetOptions{})
	if err != nil || bytes.Equal(made.Data[jobs.SigningKeyField], old.Data[jobs.SigningKeyField]) {
		t.Fatalf("the Secret made anew: %v (a new key: %v)", err, err == nil && !bytes.Equal(made.Data[jobs.SigningKeyField], old.Data[jobs.SigningKeyField]))
	}
	if err := l.Verify(job); err == nil {
		t.Fatal("a Job signed with the removed key is still admitted")
	}
	job.Annotations[jobs.AnnotationSignature] = l.Signer().Sign(jobs.ClaimsOf(job))
	if err := l.Verify(job); err != nil {
		t.Fatalf("a Job signed with the new key: %v", err)
	}
	// The snapshot package removes the Secret by this name.
	if !slices.Contains(snapshot.ServerKeySecrets, jobs.SigningKeySecret) {
		t.Errorf("snapshot.ServerKeySecrets %q lacks %q", snapshot.ServerKeySecrets, jobs.SigningKeySecret)
	}
}
