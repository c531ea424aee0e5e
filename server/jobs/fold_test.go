package jobs_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"

	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/api/agentjob"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/server/config"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/server/jobs"
)

func foldInputs(n int) jobs.FoldInputs {
	in := jobs.FoldInputs{Full: jobs.FoldRef{Name: "control-plane-full", SHA256: strings.Repeat("a", 64)}, ToRevision: 5000}
	for i := range n {
		in.Segments = append(in.Segments, jobs.FoldRef{Name: fmt.Sprintf("control-plane-full.delta-%d", 100+i), SHA256: strings.Repeat("b", 64)})
	}
	return in
}

// A fold Job reads its chain from its own signed annotation, mounted by
// the downward API; it stores one backup, encoded as the target's are,
// and mounts the fold identity when one is given.
func TestFoldJob(t *testing.T) {
	l, cs := newLauncher(t, config.Agents{ServerAddress: "etcdbackup.etcdbackup-system.svc:50052"})
	putSecret(t, cs, "fold-key", map[string]string{"identity.txt": fakeAgeIdentity})
	in := foldInputs(3)
	j, err := l.StartFold(context.Background(), jobs.FoldSpec{
		Target: target, Backup: jobs.FoldName(target.Name, 5000), Location: "default", Inputs: in,
		Compression: "zstd", AgeRecipients: []string{"age1xyz"}, IdentitySecret: "fold-key",
	})
	if err != nil {
		t.Fatal(err)
	}
	if j.Labels[jobs.LabelComponent] != jobs.ComponentFold || j.Namespace != ns {
		t.Fatalf("labels %v in %s", j.Labels, j.Namespace)
	}
	c := jobs.ClaimsOf(j)
	if c.Kind != agentjob.Fold || c.Backup != "control-plane-fold-5000" || c.Target != target.Name || c.Location != "default" {
		t.Fatalf("claims %+v", c)
	}
	got, err := jobs.ParseFoldInputs(j.Annotations[jobs.AnnotationFoldInputs])
	if err != nil || got.Full != in.Full || !slices.Equal(got.Segments, in.Segments) || got.ToRevision != in.ToRevision {
		t.Fatalf("inputs annotation %s: %+v, %v", j.Annotations[jobs.AnnotationFoldInputs], got, err)
	}
	if j.Spec.Template.Annotations[jobs.AnnotationFoldInputs] != j.Annotations[jobs.AnnotationFoldInputs] {
		t.Fatal("the pod does not carry the inputs: the downward API reads the pod's annotations")
	}
	pod := j.Spec.Template.Spec
	args := strings.Join(pod.Containers[0].Args, " ")
	for _, want := range []string{"fold ", "--target=control-plane", "--name=control-plane-fold-5000", "--location=default",
		"--inputs-file=/etc/etcdbackup/fold/inputs.json", "--compression=zstd", "--encrypt-to=age1xyz", "--identity-dir=", "--scratch-dir="} {
		if !strings.Contains(args, want) {
			t.Errorf("args %q lack %q", args, want)
		}
	}
	if strings.Contains(args, "--endpoints") || strings.Contains(args, "delta-100") {
		t.Errorf("a fold reaches no etcd and takes its segments from the annotation: args %q", args)
	}
	var downward *corev1.DownwardAPIVolumeSource
	var identity bool
	for _, v := range pod.Volumes {
		if v.DownwardAPI != nil {
			downward = v.DownwardAPI
		}
		identity = identity || v.Secret != nil && v.Secret.SecretName == "fold-key"
	}
	if downward == nil || len(downward.Items) != 1 || downward.Items[0].FieldRef.FieldPath != "metadata.annotations['"+jobs.AnnotationFoldInputs+"']" {
		t.Fatalf("downward API volume %+v", downward)
	}
	if !identity {
		t.Error("the fold identity Secret is not mounted")
	}
	if pod.Containers[0].TerminationMessagePolicy != corev1.TerminationMessageReadFile {
		t.Error("the verdict does not travel in the termination message")
	}
	if ptrTrue(pod.AutomountServiceAccountToken) {
		t.Error("a fold agent needs no API token")
	}

	// Signed with its inputs: a changed list is not the server's.
	if err := l.Signer().Verify(j); err != nil {
		t.Fatalf("the server's fold Job: %v", err)
	}
	tampered := j.DeepCopy()
	tampered.Annotations[jobs.AnnotationFoldInputs] = strings.Replace(tampered.Annotations[jobs.AnnotationFoldInputs], "delta-101", "delta-999", 1)
	if err := l.Signer().Verify(tampered); err == nil {
		t.Fatal("a fold Job whose inputs changed after signing still verifies")
	}

	// A second fold to the same revision while this one runs is refused.
	if _, err := l.StartFold(context.Background(), jobs.FoldSpec{Target: target, Backup: jobs.FoldName(target.Name, 5000), Location: "default", Inputs: in}); !errors.Is(err, jobs.ErrRunning) || !strings.Contains(err.Error(), "fold agent's Job") {
		t.Fatalf("second fold: %v, want ErrRunning", err)
	}
	synced(t, l)
	folds, err := l.Folds(context.Background())
	if err != nil || len(folds) != 1 || folds[0].Chain != in.Full.Name || folds[0].ToRevision != 5000 || folds[0].Target != target.Name || folds[0].Phase != jobs.PhaseRunning {
		t.Fatalf("Folds: %+v, %v", folds, err)
	}
}

// Inputs an annotation cannot hold, or that pin nothing, make no Job.
func TestFoldJobRefusesBadInputs(t *testing.T) {
	l, _ := newLauncher(t, config.Agents{})
	for name, in := range map[string]jobs.FoldInputs{
		"too many segments": foldInputs(jobs.MaxFoldSegments + 1),
		"no segments":       foldInputs(0),
		"unpinned full":     {Full: jobs.FoldRef{Name: "f"}, Segments: foldInputs(1).Segments, ToRevision: 10},
	} {
		if _, err := l.StartFold(context.Background(), jobs.FoldSpec{Target: target, Backup: "x", Location: "default", Inputs: in}); err == nil {
			t.Errorf("%s: a fold Job was created", name)
		}
	}
	in := foldInputs(jobs.MaxFoldSegments)
	j, err := l.StartFold(context.Background(), jobs.FoldSpec{Target: target, Backup: "x", Location: "default", Inputs: in})
	if err != nil {
		t.Fatal(err)
	}
	size := 0
	for k, v := range j.Annotations {
		size += len(k) + len(v)
	}
	if size > 200<<10 {
		t.Fatalf("annotations of a fold of %d segments take %d bytes: too close to the API server's 256 KiB", jobs.MaxFoldSegments, size)
	}
}

func ptrTrue(b *bool) bool { return b != nil && *b }
