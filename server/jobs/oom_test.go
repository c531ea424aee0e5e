package jobs_test

import (
	"context"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/server/config"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/server/jobs"
)

// An agent the kernel killed for its memory limit (a drill of a large
// database) fails saying so, with the limit and the setting to raise,
// rather than with whatever it logged last.
func TestOOMKilledAgentMessage(t *testing.T) {
	limits := corev1.ResourceList{corev1.ResourceMemory: resource.MustParse("512Mi")}
	l, cs := newLauncher(t, config.Agents{Resources: &corev1.ResourceRequirements{Limits: limits}})
	ctx := context.Background()
	job, err := l.StartDrill(ctx, jobs.DrillSpec{Backup: "b", Location: "default", Target: target.Name,
		SHA256: "6794a8ff9654e821ba067dda207cf98ec8f022ce1c001fd07cd542530cd173f5"})
	if err != nil {
		t.Fatal(err)
	}
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: job.Name + "-x", Labels: podLabels(job)},
		Spec:       *job.Spec.Template.Spec.DeepCopy(),
		Status: corev1.PodStatus{ContainerStatuses: []corev1.ContainerStatus{{Name: "agent", State: corev1.ContainerState{
			Terminated: &corev1.ContainerStateTerminated{ExitCode: 137, Reason: "OOMKilled", Message: "restoring the snapshot into scratch\n"},
		}}}},
	}
	if _, err := cs.CoreV1().Pods(ns).Create(ctx, pod, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	setFailed(t, cs, job)
	synced(t, l)
	runs, err := l.Drills(ctx)
	if err != nil {
		t.Fatal(err)
	}
	want := "agent exited with code 137: the agent was OOM-killed (memory limit 512Mi): raise agents.resources.limits.memory in the server's config"
	if len(runs) != 1 || runs[0].Phase != jobs.PhaseFailed || runs[0].Message != want {
		t.Fatalf("runs %+v, want message %q", runs, want)
	}

	// Without a memory limit the message says there was none.
	if err := cs.CoreV1().Pods(ns).Delete(ctx, pod.Name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	pod.Spec.Containers[0].Resources = corev1.ResourceRequirements{}
	pod.ResourceVersion = ""
	if _, err := cs.CoreV1().Pods(ns).Create(ctx, pod, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	synced(t, l)
	runs, err = l.Drills(ctx)
	if err != nil {
		t.Fatal(err)
	}
	want = "agent exited with code 137: the agent was OOM-killed (memory limit none): raise agents.resources.limits.memory in the server's config"
	if len(runs) != 1 || runs[0].Message != want {
		t.Fatalf("runs %+v, want message %q", runs, want)
	}
}
