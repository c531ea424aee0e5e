package plugin

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"regexp"
	"strings"
	"testing"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes/fake"

	ebv1 "github.com/kubectl-etcdbackup/kubectl-etcdbackup/api/etcdbackup/v1"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/internal/etcdtest"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/server/config"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/server/jobs"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/server/servertest"
)

const serverNS = "etcdbackup-system"

// agentWorld is a real server whose agents are Jobs in client-go's fake
// clientset: the test plays the agents (and the Job controller) by
// uploading what an agent would and setting the Jobs' status.
type agentWorld struct {
	srv *servertest.Server
	// agent is who the agent listener admits every call as.
	agent  *agentAs
	addr   string
	cs     *fake.Clientset
	agents *jobs.Launcher
}

// newAgentWorld serves locations (default: one, "default") and targets
// backupTarget (backed up by agents, keeping the last one by retention)
// and "app" (two members, restorable).
func newAgentWorld(t *testing.T, backupTarget string, locations ...string) *agentWorld {
	t.Helper()
	cs := fake.NewClientset(&corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "etcd-client", Namespace: serverNS}})
	l, err := jobs.New(cs, serverNS, config.Agents{Image: "agent:dev"})
	if err != nil {
		t.Fatal(err)
	}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	closed := "http://" + lis.Addr().String()
	lis.Close()
	app := config.Target{Name: "app", Endpoints: []string{closed}, InsecurePlaintext: true, Namespace: "app"}
	for _, m := range []string{"m0", "m1"} {
		app.Members = append(app.Members, config.Member{
			Name: m, PeerURL: "http://" + m + ".app.svc:2380", ClientURL: closed,
			Volume: config.MemberVolume{PersistentVolumeClaim: &config.ClaimRef{ClaimName: "data-" + m}},
		})
	}
	targets := []config.Target{{Name: backupTarget, Endpoints: []string{"https://etcd:2379"}, TLSSecret: "etcd-client", Retention: &config.Retention{KeepLast: 1}}, app}
	if err := l.Start(t.Context(), targets); err != nil {
		t.Fatal(err)
	}
	agent := &agentAs{}
	srv := servertest.StartWith(t, servertest.Options{Locations: locations, Targets: targets, Agents: l, AgentGuard: agent})
	return &agentWorld{srv: srv, agent: agent, addr: "--server-address=" + srv.Addr, cs: cs, agents: l}
}

// synced waits until the server's agent caches hold what the test
// changed through the fake clientset.
func (w *agentWorld) synced(t *testing.T) {
	t.Helper()
	if err := w.agents.Sync(t.Context()); err != nil {
		t.Error(err)
	}
}

// jobsOf waits for n Jobs of component in ns working on backup, each
// signed by the server (so that finish does not write back a Job from
// before its signature).
func (w *agentWorld) jobsOf(t *testing.T, ns, component, backup string, n int) []batchv1.Job {
	t.Helper()
	var items []batchv1.Job
	err := wait.PollUntilContextTimeout(context.Background(), 20*time.Millisecond, 20*time.Second, true, func(ctx context.Context) (bool, error) {
		list, err := w.cs.BatchV1().Jobs(ns).List(ctx, metav1.ListOptions{LabelSelector: jobs.LabelComponent + "=" + component})
		if err != nil {
			return false, err
		}
		items = nil
		for _, j := range list.Items {
			if j.Annotations[jobs.AnnotationBackup] == backup && j.Annotations[jobs.AnnotationSignature] != "" {
				items = append(items, j)
			}
		}
		return len(items) >= n, nil
	})
	if err != nil {
		t.Errorf("no %s Job: %v", component, err)
	}
	return items
}

// finish ends the Job as the Job controller would; a failed one gets a
// pod whose agent left lastWords as its termination message.
func (w *agentWorld) finish(t *testing.T, j batchv1.Job, ok bool, lastWords string) {
	t.Helper()
	ctx := context.Background()
	cond := batchv1.JobCondition{Type: batchv1.JobComplete, Status: corev1.ConditionTrue}
	if !ok {
		cond = batchv1.JobCondition{Type: batchv1.JobFailed, Status: corev1.ConditionTrue, Reason: "BackoffLimitExceeded"}
		// Labelled as the Job controller labels it: the template's
		// labels and the Job's name.
		labels := map[string]string{batchv1.JobNameLabel: j.Name}
		for k, v := range j.Spec.Template.Labels {
			labels[k] = v
		}
		pod := &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: j.Name + "-x", Namespace: j.Namespace, Labels: labels},
			Status: corev1.PodStatus{ContainerStatuses: []corev1.ContainerStatus{{Name: "agent", State: corev1.ContainerState{
				Terminated: &corev1.ContainerStateTerminated{ExitCode: 1, Message: lastWords},
			}}}},
		}
		if _, err := w.cs.CoreV1().Pods(j.Namespace).Create(ctx, pod, metav1.CreateOptions{}); err != nil {
			t.Error(err)
		}
		// The pod's end before the Job's, as the Job controller sees it.
		w.synced(t)
	}
	j.Status.Conditions = append(j.Status.Conditions, cond)
	if _, err := w.cs.BatchV1().Jobs(j.Namespace).UpdateStatus(ctx, &j, metav1.UpdateOptions{}); err != nil {
		t.Error(err)
	}
}

var elapsed = `after \d+s`

func TestBackupWaitShowsPhasesAndFailure(t *testing.T) {
	w := newAgentWorld(t, "cp")

	// A backup that fails: each phase with its elapsed time, the agent's
	// last log lines, exit code 5 and the logs command.
	cmd := start(w.addr, "backup", "--target", "cp", "--name", "down", "--wait")
	if j := w.jobsOf(t, serverNS, "backup-agent", "down", 1); len(j) > 0 {
		cmd.waitErrOut(t, `backup "down": Running`) // --wait sees Running first
		w.finish(t, j[0], false, "snapshot from https://etcd:2379: connection refused")
	}
	r := cmd.result()
	if r.err == nil || ExitCode(r.err) != ExitFailed || !strings.Contains(r.err.Error(), "kubectl etcdbackup logs down") {
		t.Fatalf("failed backup --wait: %v (exit %d)", r.err, ExitCode(r.err))
	}
	for _, re := range []string{
		`backup "down" of target "cp" started in location "default"\n`,
		`backup "down": Running ` + elapsed + `\n`,
		`backup "down": Failed ` + elapsed + `\n`,
		// The fake clientset's pod log is "fake logs".
		`last lines of the agent's log:\n  fake logs\n`,
	} {
		if !regexp.MustCompile(re).MatchString(r.errOut) {
			t.Errorf("stderr does not match %q:\n%s", re, r.errOut)
		}
	}
	if !strings.Contains(r.out, "Failed") {
		t.Errorf("stdout lacks the Failed row:\n%s", r.out)
	}

	describeShowsFailure(t, w)

	// A backup that completes: the agent's upload makes it Completed.
	cmd = start(w.addr, "backup", "--target", "cp", "--name", "up", "--wait", "-o", "jsonpath={.status.phase}")
	for _, job := range w.jobsOf(t, serverNS, "backup-agent", "up", 1) {
		cmd.waitErrOut(t, `backup "up": Running`)
		if _, err := w.srv.Client.Upload(context.Background(), bytes.NewReader(etcdtest.TrailedBytes(t, 544)), &ebv1.UploadHeader{Name: "up", Source: &ebv1.BackupSource{Kind: ebv1.SourceAgent, Target: "cp"}}, nil); err != nil {
			t.Error(err)
		}
		w.finish(t, job, true, "")
	}
	r = cmd.result()
	if r.err != nil || r.out != "Completed" {
		t.Fatalf("backup --wait: %v, stdout %q\n%s", r.err, r.out, r.errOut)
	}
	if !regexp.MustCompile(`backup "up": Running ` + elapsed + `\nbackup "up": Completed ` + elapsed + `\n`).MatchString(r.errOut) {
		t.Errorf("phase changes on stderr:\n%s", r.errOut)
	}
}

// A --wait that ends before its backup says how long it waited and
// why: past --timeout, or interrupted (Ctrl-C) — not the whole --timeout
// when it was interrupted long before it.
func TestBackupWaitSaysWhyItStopped(t *testing.T) {
	w := newAgentWorld(t, "cp")

	r := run(t, w.addr, "backup", "--target", "cp", "--name", "slow", "--wait", "--timeout", "1s")
	if r.err == nil || !regexp.MustCompile(`^backup "slow" is still running after \d+s \(--timeout\); follow it with .kubectl etcdbackup logs slow -f.$`).MatchString(r.err.Error()) {
		t.Errorf("backup --wait past --timeout: %v", r.err)
	}

	ctx, interrupt := context.WithCancel(context.Background())
	defer interrupt()
	cmd := startContext(ctx, w.addr, "backup", "--target", "cp", "--name", "stopped", "--wait", "--timeout", "1h")
	cmd.waitErrOut(t, `backup "stopped": Running`)
	interrupt()
	r = cmd.result()
	if r.err == nil || !regexp.MustCompile(`^stopped waiting after \d+s: backup "stopped" is still running in the cluster; follow it with .kubectl etcdbackup logs stopped -f.$`).MatchString(r.err.Error()) {
		t.Errorf("interrupted backup --wait: %v", r.err)
	}
}

// describeShowsFailure: describe of the failed backup "down" shows the
// failure, the agent Job and its events, oldest first (recorded here as
// the Job controller and kubelet would), and the next command to run.
func describeShowsFailure(t *testing.T, w *agentWorld) {
	t.Helper()
	j := w.jobsOf(t, serverNS, "backup-agent", "down", 1)[0]
	base := time.Now().Add(-2 * time.Minute)
	for i, e := range []struct{ kind, name, typ, reason, msg string }{
		{"Pod", j.Name + "-x", "Warning", "BackOff", "Back-off restarting failed container agent"},
		{"Job", j.Name, "Normal", "SuccessfulCreate", "Created pod: " + j.Name + "-x"},
		{"Job", j.Name, "Warning", "BackoffLimitExceeded", "Job has reached the specified backoff limit"},
		{"Job", "some-other-job", "Normal", "SuccessfulCreate", "not ours"},
	} {
		at := metav1.NewTime(base.Add(time.Duration([]int{2, 0, 3, 1}[i]) * time.Second))
		ev := &corev1.Event{
			ObjectMeta:     metav1.ObjectMeta{Name: fmt.Sprintf("e%d", i), Namespace: serverNS},
			InvolvedObject: corev1.ObjectReference{Kind: e.kind, Name: e.name, Namespace: serverNS},
			Type:           e.typ, Reason: e.reason, Message: e.msg, Count: 1, FirstTimestamp: at, LastTimestamp: at,
		}
		if _, err := w.cs.CoreV1().Events(serverNS).Create(context.Background(), ev, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	w.synced(t)
	r := mustRun(t, w.addr, "describe", "down")
	for _, re := range []string{
		`(?m)^Phase:\s+Failed$`,
		`(?m)^Message:\s+.*connection refused$`,
		`(?m)^  Target:\s+cp$`,
		`(?m)^Agent Job:\s+` + serverNS + `/` + j.Name + `$`,
		`(?m)^  Type\s+Reason\s+Age\s+Object\s+Message\n  ----.*\n` +
			`  Normal\s+SuccessfulCreate\s+\S+\s+job/` + j.Name + `\s+Created pod: ` + j.Name + `-x\n` +
			`  Warning\s+BackOff\s+\S+\s+pod/` + j.Name + `-x\s+Back-off restarting failed container agent\n` +
			`  Warning\s+BackoffLimitExceeded\s+\S+\s+job/` + j.Name + `\s+Job has reached the specified backoff limit\n$`,
		`(?m)^Next:\s+kubectl etcdbackup logs down --location default$`,
	} {
		if !regexp.MustCompile(re).MatchString(r.out) {
			t.Errorf("describe down does not match %q:\n%s", re, r.out)
		}
	}
	if strings.Contains(r.out, "not ours") {
		t.Errorf("describe shows another Job's events:\n%s", r.out)
	}
}

func TestRestoreWaitShowsMemberPhases(t *testing.T) {
	w := newAgentWorld(t, "cp")
	file, _, _ := writeSnapshot(t, "b1", smallSnapshot)
	mustRun(t, w.addr, "upload", file)

	// The dry run's plan as a Restore object.
	r := mustRun(t, w.addr, "restore", "b1", "--target", "app", "--dry-run", "-o", "jsonpath={.kind} {.status.phase} {.status.members[*].member}")
	if r.out != "Restore Pending m0 m1" {
		t.Fatalf("restore --dry-run -o jsonpath = %q", r.out)
	}

	cmd := start(w.addr, "restore", "b1", "--target", "app", "--wait")
	js := w.jobsOf(t, "app", "restore-agent", "b1", 2)
	// --wait sees both members Running first.
	cmd.waitErrOut(t, `member m0: Running`)
	cmd.waitErrOut(t, `member m1: Running`)
	for _, j := range js {
		w.finish(t, j, j.Annotations["etcdbackup.io/member"] == "m0", "restore m1: disk full")
	}
	r = cmd.result()
	if r.err == nil || ExitCode(r.err) != ExitFailed || !strings.Contains(r.err.Error(), "restore of member m1 failed") {
		t.Fatalf("failed restore --wait: %v (exit %d)\n%s", r.err, ExitCode(r.err), r.errOut)
	}
	for _, re := range []string{
		`member m0: Running ` + elapsed + `\n`,
		`member m1: Running ` + elapsed + `\n`,
		`member m0: Succeeded ` + elapsed + `\n`,
		`member m1: Failed ` + elapsed + `\n`,
		`last lines of the agent's log:\n  agent exited with code 1: restore m1: disk full\n`,
	} {
		if !regexp.MustCompile(re).MatchString(r.errOut) {
			t.Errorf("stderr does not match %q:\n%s", re, r.errOut)
		}
	}
}

// A backup removed by delete or by retention is gone from list, though
// its agent's finished Job is kept for its TTL: the Job must not bring it
// back as a Failed run ("the agent finished but the backup is not in
// storage").
func TestRemovedBackupsDoNotReappearFromTheirJobs(t *testing.T) {
	w := newAgentWorld(t, "cp")
	for _, name := range []string{"old", "older", "newest"} {
		mustRun(t, w.addr, "backup", "--target", "cp", "--name", name)
		job := w.jobsOf(t, serverNS, "backup-agent", name, 1)[0]
		// Stored by the target's agent: retention --all counts it.
		w.agent.set("cp", name, false)
		if _, err := w.srv.AgentClient.Upload(context.Background(), bytes.NewReader(etcdtest.TrailedBytes(t, 544)),
			&ebv1.UploadHeader{Name: name}, nil); err != nil {
			t.Fatal(err)
		}
		w.finish(t, job, true, "")
		w.synced(t)
	}
	listed := func() string { return mustRun(t, w.addr, "list", "-o", "name").out }
	if got := listed(); got != "backup/newest\nbackup/older\nbackup/old\n" {
		t.Fatalf("list of three completed backups: %q", got)
	}

	mustRun(t, w.addr, "delete", "old", "--yes")
	w.synced(t)
	if got := listed(); got != "backup/newest\nbackup/older\n" {
		t.Errorf("list after delete: %q (the deleted backup came back from its Job?)", got)
	}
	r := run(t, w.addr, "get", "old")
	if ExitCode(r.err) != ExitNotFound {
		t.Errorf("get of the deleted backup: %v (exit %d), want not found", r.err, ExitCode(r.err))
	}

	r = mustRun(t, w.addr, "prune", "--target", "cp", "--all", "-o", "name")
	if r.out != "backup/older\n" {
		t.Errorf("prune --all with keepLast 1 removed %q, want older", r.out)
	}
	w.synced(t)
	if got := listed(); got != "backup/newest\n" {
		t.Errorf("list after retention: %q (the pruned backup came back from its Job?)", got)
	}
}
