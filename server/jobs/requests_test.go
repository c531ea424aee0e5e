package jobs_test

import (
	"fmt"
	"io"
	"sort"
	"strings"
	"testing"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/server/config"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/server/jobs"
)

// The history the request counts are measured on: the Jobs of 500
// backups as a server with a busy schedule keeps them for a day
// (ttlAfterFinished), most finished.
const (
	historySucceeded = 440
	historyFailed    = 50 // each with its agent's pod
	historyRunning   = 5  // with a running pod
	historyPending   = 5  // no pod yet
	historyJobs      = historySucceeded + historyFailed + historyRunning + historyPending
)

// restoreTargets put restore Jobs in two namespaces besides the
// server's: one beside a claim, one for hostPath members.
var restoreTargets = []config.Target{
	restoreTarget,
	{Name: "cp", Members: []config.Member{{Name: "cp-1", NodeName: "cp-1", Volume: config.MemberVolume{HostPath: &config.HostPathRef{Path: "/var/lib"}}}}},
}

// history adds the Jobs (and pods) of historyJobs backups of target in
// location "default" to the fake's store without recording actions,
// and returns the backups' names by phase.
func history(t testing.TB, cs *fake.Clientset) map[jobs.Phase][]string {
	t.Helper()
	// The Jobs StartBackup would create, from a Launcher of their own.
	builder, err := jobs.New(fake.NewClientset(), ns, config.Agents{Image: "agent:dev"})
	if err != nil {
		t.Fatal(err)
	}
	out := map[jobs.Phase][]string{}
	for i := range historyJobs {
		name := fmt.Sprintf("cp-%04d", i)
		j := builder.BackupJobFor(jobs.BackupSpec{Name: name, Location: "default", Target: target})
		j.CreationTimestamp = metav1.Unix(int64(1_800_000_000+60*i), 0)
		pod := func(state corev1.ContainerState) {
			p := &corev1.Pod{
				ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: j.Name + "-x", Labels: podLabels(j)},
				Status:     corev1.PodStatus{ContainerStatuses: []corev1.ContainerStatus{{Name: "agent", State: state}}},
			}
			if err := cs.Tracker().Add(p); err != nil {
				t.Fatal(err)
			}
		}
		phase := jobs.PhaseRunning
		switch {
		case i < historySucceeded:
			phase = jobs.PhaseSucceeded
			j.Status.Succeeded = 1
			j.Status.Conditions = []batchv1.JobCondition{{Type: batchv1.JobComplete, Status: corev1.ConditionTrue}}
		case i < historySucceeded+historyFailed:
			phase = jobs.PhaseFailed
			j.Status.Failed = 1
			j.Status.Conditions = []batchv1.JobCondition{{Type: batchv1.JobFailed, Status: corev1.ConditionTrue, Reason: "BackoffLimitExceeded"}}
			pod(corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{ExitCode: 1, Message: "etcd refused"}})
		case i < historySucceeded+historyFailed+historyRunning:
			j.Status.Active = 1
			pod(corev1.ContainerState{Running: &corev1.ContainerStateRunning{}})
		}
		if err := cs.Tracker().Add(j); err != nil {
			t.Fatal(err)
		}
		out[phase] = append(out[phase], name)
	}
	return out
}

// podLabels are what the Job controller gives j's pods: the template's
// labels and the Job's name.
func podLabels(j *batchv1.Job) map[string]string {
	l := map[string]string{batchv1.JobNameLabel: j.Name}
	for k, v := range j.Spec.Template.Labels {
		l[k] = v
	}
	return l
}

// requests are the API requests cs saw since the last call, as
// "verb resource" counts, and their number.
func requests(cs *fake.Clientset) (int, string) {
	n := map[string]int{}
	acts := cs.Actions()
	for _, a := range acts {
		n[a.GetVerb()+" "+a.GetResource().Resource]++
	}
	cs.ClearActions()
	var parts []string
	for k, c := range n {
		parts = append(parts, fmt.Sprintf("%d %s", c, k))
	}
	sort.Strings(parts)
	return len(acts), strings.Join(parts, ", ")
}

// TestRequestsPerRead counts the API requests of the Launcher's reads
// over the Jobs of 500 backups: a List (every scheduler round, every
// ListBackups, every GetBackup and Download of a backup not stored, as
// each poll of `backup --wait`), a scheduler-like round (List,
// then RunningRestores for each of 10 backups retention removes, as
// prune asks before each removal), describe's Events, ListRestores and
// Logs. Before the informers (commit 9edc694, reading the API) they were:
// List 56 (1 list jobs, 50 list pods: one per failed Job, 5 list events:
// one per Job without a pod), the round 76 (21 list jobs), Events 4,
// ListRestores 1, Logs 3. Now the caches answer: Start lists and watches
// jobs, pods and events once per namespace, then every read is free but
// the log itself.
func TestRequestsPerRead(t *testing.T) {
	cs := fake.NewClientset()
	byPhase := history(t, cs)
	l, err := jobs.New(cs, ns, config.Agents{Image: "agent:dev"})
	if err != nil {
		t.Fatal(err)
	}
	ctx := t.Context()
	if err := l.Start(ctx, restoreTargets); err != nil {
		t.Fatal(err)
	}
	// 3 namespaces (the server's, app, etcdbackup-restore) × 3 resources.
	n, what := requests(cs)
	t.Logf("Start: %d requests (%s)", n, what)
	if want := "3 list events, 3 list jobs, 3 list pods, 3 watch events, 3 watch jobs, 3 watch pods"; what != want {
		t.Errorf("Start: %s, want %s", what, want)
	}

	check := func(what string, want int) {
		t.Helper()
		n, which := requests(cs)
		t.Logf("%s: %d requests (%s)", what, n, which)
		if n != want {
			t.Errorf("%s: %d requests (%s), want %d", what, n, which, want)
		}
	}
	runs, err := l.List(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(runs) != historyJobs {
		t.Fatalf("%d runs, want %d", len(runs), historyJobs)
	}
	failed := 0
	for _, r := range runs {
		if r.Phase == jobs.PhaseFailed && r.Message == "agent exited with code 1: etcd refused" {
			failed++
		}
	}
	if failed != historyFailed {
		t.Errorf("%d failed runs with their agent's last words, want %d", failed, historyFailed)
	}
	check(fmt.Sprintf("List of %d backups' Jobs", historyJobs), 0)

	if _, err := l.List(ctx); err != nil {
		t.Fatal(err)
	}
	for _, b := range byPhase[jobs.PhaseSucceeded][:10] {
		if _, err := l.RunningRestores(ctx, "default", b, restoreTargets); err != nil {
			t.Fatal(err)
		}
	}
	check("scheduler-like round", 0)

	if _, _, err := l.Events(ctx, "default", byPhase[jobs.PhaseFailed][0]); err != nil {
		t.Fatal(err)
	}
	check("Events of a failed run", 0)

	if _, err := l.ListRestores(ctx, "default", byPhase[jobs.PhaseFailed][0], restoreTarget); err != nil {
		t.Fatal(err)
	}
	check("ListRestores", 0)

	if err := l.Logs(ctx, "default", byPhase[jobs.PhaseFailed][0], false, io.Discard); err != nil {
		t.Fatal(err)
	}
	check("Logs (the log itself)", 1)
}
