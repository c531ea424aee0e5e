package rpc_test

import (
	"context"
	"slices"
	"strconv"
	"strings"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	ebv1 "github.com/kubectl-etcdbackup/kubectl-etcdbackup/api/etcdbackup/v1"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/server/config"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/server/jobs"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/server/servertest"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/server/servertest/backuptest"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/storage"
)

func TestRestoreStartsOneJobPerMember(t *testing.T) {
	w := servertest.NewRestoreWorld(t, servertest.ClosedURL(t), servertest.SilentURL(t))
	ctx := context.Background()
	resp, err := w.Server.RestoreBackup(ctx, &ebv1.RestoreBackupRequest{Name: "b1", Target: "app", MoveAside: true})
	if err != nil {
		t.Fatal(err)
	}
	if len(resp.GetMembers()) != 2 {
		t.Fatalf("plan: %v", resp)
	}
	// No bump_revision in the request: etcd's recommendation.
	for _, m := range resp.GetMembers() {
		if m.GetBumpRevision() != 1_000_000_000 || !m.GetMarkCompacted() {
			t.Errorf("member %s: bump %d, mark compacted %v; want 1000000000 and marked", m.GetMember(), m.GetBumpRevision(), m.GetMarkCompacted())
		}
	}
	list := w.Jobs(t)
	if len(list) != 2 {
		t.Fatalf("%d jobs, want 2", len(list))
	}
	for _, j := range list {
		spec := j.Spec.Template.Spec
		if spec.ServiceAccountName != "etcdbackup-agent" || *spec.AutomountServiceAccountToken {
			t.Errorf("job %s: service account %q, token %v", j.Name, spec.ServiceAccountName, *spec.AutomountServiceAccountToken)
		}
		args := strings.Join(spec.Containers[0].Args, " ")
		for _, want := range []string{
			"--initial-cluster=m0=http://m0.app.svc:2380,m1=http://m1.app.svc:2380", "--initial-cluster-token=tok",
			"--data-dir=/var/lib/etcd-restore/data", "--move-aside", "--server=etcdbackup.etcdbackup-system.svc:" + config.DefaultAgentPort,
			// Pinned to the stored backup's content, authenticated by its own token.
			"--sha256=" + w.SHA256, "--token-file=" + jobs.TokenPath,
			"--bump-revision=1000000000",
		} {
			if !strings.Contains(args, want) {
				t.Errorf("job %s args %q lack %q", j.Name, args, want)
			}
		}
		if j.Annotations[jobs.AnnotationSHA256] != w.SHA256 || j.Spec.Template.Annotations[jobs.AnnotationSHA256] != w.SHA256 {
			t.Errorf("job %s: SHA-256 annotations %q (job) and %q (pod), want %s", j.Name,
				j.Annotations[jobs.AnnotationSHA256], j.Spec.Template.Annotations[jobs.AnnotationSHA256], w.SHA256)
		}
		if spec.Volumes[0].PersistentVolumeClaim == nil || !strings.HasPrefix(spec.Volumes[0].PersistentVolumeClaim.ClaimName, "data-m") {
			t.Errorf("job %s does not mount the member's claim: %+v", j.Name, spec.Volumes[0])
		}
	}

	// Running: a second restore is refused; GetRestore follows the Jobs.
	if _, err := w.Server.RestoreBackup(ctx, &ebv1.RestoreBackupRequest{Name: "b1", Target: "app"}); status.Code(err) != codes.AlreadyExists {
		t.Fatalf("second restore while running: %v", err)
	}
	get := func() []*ebv1.MemberRestore {
		r, err := w.Server.GetRestore(ctx, &ebv1.GetRestoreRequest{Name: "b1", Target: "app"})
		if err != nil {
			t.Fatal(err)
		}
		return r.GetMembers()
	}
	for _, m := range get() {
		if m.GetPhase() != ebv1.RestorePhase_RESTORE_PHASE_RUNNING {
			t.Fatalf("member %s: %v, want running", m.GetMember(), m.GetPhase())
		}
		if m.GetBumpRevision() != 1_000_000_000 || !m.GetMarkCompacted() {
			t.Errorf("GetRestore of member %s: bump %d, mark compacted %v; want what its Job was started with", m.GetMember(), m.GetBumpRevision(), m.GetMarkCompacted())
		}
	}
	for i, j := range list {
		cond := batchv1.JobComplete
		if i == 1 {
			cond = batchv1.JobFailed
		}
		j.Status.Conditions = []batchv1.JobCondition{{Type: cond, Status: corev1.ConditionTrue, Reason: "BackoffLimitExceeded"}}
		if _, err := w.Clientset.BatchV1().Jobs("app").UpdateStatus(ctx, &j, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	w.Synced(t)
	phases := map[string]ebv1.RestorePhase{}
	for _, m := range get() {
		phases[m.GetMember()] = m.GetPhase()
	}
	if len(phases) != 2 || phases["m0"] == phases["m1"] {
		t.Fatalf("phases after the jobs ended: %v", phases)
	}
}

// bump_revision reaches every member's Job and comes back from
// GetRestore; 0 turns the bump and the mark off; negative is refused
// before anything is created.
func TestRestoreBumpRevision(t *testing.T) {
	w := servertest.NewRestoreWorld(t, servertest.ClosedURL(t), servertest.ClosedURL(t))
	ctx := context.Background()
	bump := func(b *ebv1.MemberRestore) string {
		return b.GetMember() + ":" + strconv.FormatInt(b.GetBumpRevision(), 10) + ":" + strconv.FormatBool(b.GetMarkCompacted())
	}

	_, err := w.Server.RestoreBackup(ctx, &ebv1.RestoreBackupRequest{Name: "b1", Target: "app", BumpRevision: proto.Int64(-1)})
	if status.Code(err) != codes.InvalidArgument || !strings.Contains(status.Convert(err).Message(), "--bump-revision -1 is negative") {
		t.Fatalf("negative bump: %v, want InvalidArgument naming --bump-revision", err)
	}
	if j := w.Jobs(t); len(j) != 0 {
		t.Fatalf("a refused restore created %d jobs", len(j))
	}

	// The dry run's plan says what each member would get.
	plan, err := w.Server.RestoreBackup(ctx, &ebv1.RestoreBackupRequest{Name: "b1", Target: "app", DryRun: true, BumpRevision: proto.Int64(42)})
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range plan.GetMembers() {
		if got := bump(m); got != m.GetMember()+":42:true" {
			t.Errorf("dry run plan: %s", got)
		}
	}

	resp, err := w.Server.RestoreBackup(ctx, &ebv1.RestoreBackupRequest{Name: "b1", Target: "app", BumpRevision: proto.Int64(0)})
	if err != nil {
		t.Fatal(err)
	}
	got, err := w.Server.GetRestore(ctx, &ebv1.GetRestoreRequest{Name: "b1", Target: "app"})
	if err != nil {
		t.Fatal(err)
	}
	for _, ms := range [][]*ebv1.MemberRestore{resp.GetMembers(), got.GetMembers()} {
		if len(ms) != 2 || bump(ms[0]) != "m0:0:false" || bump(ms[1]) != "m1:0:false" {
			t.Errorf("members %v, want no bump and no mark", ms)
		}
	}
	for _, j := range w.Jobs(t) {
		if args := j.Spec.Template.Spec.Containers[0].Args; !slices.Contains(args, "--bump-revision=0") || j.Annotations[jobs.AnnotationBumpRevision] != "0" {
			t.Errorf("job %s: args %q, annotations %v; want --bump-revision=0", j.Name, args, j.Annotations)
		}
	}
}

func TestRestoreRequestErrors(t *testing.T) {
	w := servertest.NewRestoreWorld(t, servertest.ClosedURL(t))
	ctx := context.Background()
	for _, tc := range []struct {
		req  *ebv1.RestoreBackupRequest
		code codes.Code
	}{
		{&ebv1.RestoreBackupRequest{Name: "b1"}, codes.InvalidArgument},
		{&ebv1.RestoreBackupRequest{Name: "b1", Target: "nope"}, codes.NotFound},
		{&ebv1.RestoreBackupRequest{Name: "missing", Target: "app"}, codes.NotFound},
		{&ebv1.RestoreBackupRequest{Name: "../x", Target: "app"}, codes.InvalidArgument},
	} {
		if _, err := w.Server.RestoreBackup(ctx, tc.req); status.Code(err) != tc.code {
			t.Errorf("%v: %v, want %v", tc.req, err, tc.code)
		}
	}
	if _, err := w.Server.GetRestore(ctx, &ebv1.GetRestoreRequest{Name: "b1", Target: "app"}); status.Code(err) != codes.NotFound {
		t.Errorf("GetRestore of a restore never started: %v", err)
	}
}

// An encrypted backup is restored only with an identity Secret, which the
// Jobs mount; the request without one says how to make it.
func TestRestoreOfEncryptedBackupNeedsIdentitySecret(t *testing.T) {
	w := servertest.NewRestoreWorld(t, servertest.ClosedURL(t))
	ctx := context.Background()
	backuptest.Put(t, w.Location, &storage.Manifest{Name: "enc", Encryption: "age",
		AgeRecipients: []string{"age1ql3z7hjy54pw3hyww5ayyfg7zqgvc7w3j2elw8zmrj2kg5sfn9aqmcac8p"}}, []byte("age-encryption.org/v1\n"))
	_, err := w.Server.RestoreBackup(ctx, &ebv1.RestoreBackupRequest{Name: "enc", Target: "app"})
	if status.Code(err) != codes.FailedPrecondition || !strings.Contains(err.Error(), "--identity-secret") || !strings.Contains(err.Error(), `namespace "app"`) {
		t.Fatalf("without identity Secret: %v", err)
	}
	if len(w.Jobs(t)) != 0 {
		t.Fatal("jobs created")
	}
	if _, err := w.Server.RestoreBackup(ctx, &ebv1.RestoreBackupRequest{Name: "enc", Target: "app", IdentitySecret: "Bad_Name"}); status.Code(err) != codes.InvalidArgument {
		t.Fatalf("bad Secret name: %v", err)
	}
	if _, err := w.Server.RestoreBackup(ctx, &ebv1.RestoreBackupRequest{Name: "enc", Target: "app", IdentitySecret: "etcd-age-key"}); err != nil {
		t.Fatal(err)
	}
	for _, j := range w.Jobs(t) {
		spec := j.Spec.Template.Spec
		mounted := false
		for _, v := range spec.Volumes {
			mounted = mounted || (v.Secret != nil && v.Secret.SecretName == "etcd-age-key")
		}
		if !mounted || !strings.Contains(strings.Join(spec.Containers[0].Args, " "), "--identity-dir=") {
			t.Errorf("job %s: identity Secret mounted %v, args %v", j.Name, mounted, spec.Containers[0].Args)
		}
	}
}

// A Job whose pod the API refuses (Pod Security forbids hostPath in a
// restricted namespace) is Failed with the API's reason, not Running.
func TestRestoreJobRefusedByTheAPIIsFailed(t *testing.T) {
	w := servertest.NewRestoreWorld(t, servertest.ClosedURL(t), servertest.ClosedURL(t))
	ctx := context.Background()
	if _, err := w.Server.RestoreBackup(ctx, &ebv1.RestoreBackupRequest{Name: "b1", Target: "app"}); err != nil {
		t.Fatal(err)
	}
	list := w.Jobs(t)
	refused := list[0]
	const why = `Error creating: pods "restore-m0-abc" is forbidden: violates PodSecurity "restricted:latest": hostPath volumes (volume "data")`
	for _, e := range []*corev1.Event{
		{ObjectMeta: metav1.ObjectMeta{Name: "e1", Namespace: "app"}, InvolvedObject: corev1.ObjectReference{Kind: "Job", Name: refused.Name, UID: refused.UID},
			Reason: "FailedCreate", Message: why, Type: corev1.EventTypeWarning, LastTimestamp: metav1.Now()},
		// An event of another Job: no evidence about the other member.
		{ObjectMeta: metav1.ObjectMeta{Name: "e2", Namespace: "app"}, InvolvedObject: corev1.ObjectReference{Kind: "Job", Name: "restore-elsewhere"},
			Reason: "FailedCreate", Message: why, Type: corev1.EventTypeWarning},
	} {
		if _, err := w.Clientset.CoreV1().Events("app").Create(ctx, e, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	w.Synced(t)
	r, err := w.Server.GetRestore(ctx, &ebv1.GetRestoreRequest{Name: "b1", Target: "app"})
	if err != nil {
		t.Fatal(err)
	}
	byMember := map[string]*ebv1.MemberRestore{}
	for _, m := range r.GetMembers() {
		byMember[m.GetMember()] = m
	}
	m0, m1 := byMember[refused.Annotations[jobs.AnnotationMember]], byMember[list[1].Annotations[jobs.AnnotationMember]]
	if m0.GetPhase() != ebv1.RestorePhase_RESTORE_PHASE_FAILED {
		t.Fatalf("refused job: %v, want failed", m0)
	}
	servertest.MustSay(t, m0.GetMessage(), `violates PodSecurity "restricted:latest": hostPath volumes`, "pod-security.kubernetes.io/enforce=privileged")
	if m1.GetPhase() != ebv1.RestorePhase_RESTORE_PHASE_RUNNING {
		t.Fatalf("other job: %v, want running", m1)
	}

	// Once the pod exists, the old refusal is no longer evidence.
	refused.Status.Active = 1
	if _, err := w.Clientset.BatchV1().Jobs("app").UpdateStatus(ctx, &refused, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	w.Synced(t)
	r, err = w.Server.GetRestore(ctx, &ebv1.GetRestoreRequest{Name: "b1", Target: "app"})
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range r.GetMembers() {
		if m.GetPhase() != ebv1.RestorePhase_RESTORE_PHASE_RUNNING {
			t.Fatalf("member %s: %v once its pod runs", m.GetMember(), m)
		}
	}
}

// A restore of a target stops its delta agent first: it must not go on
// appending the restored etcd's writes to the chain of the etcd before.
func TestRestoreStopsTheTargetsDeltaAgent(t *testing.T) {
	w := servertest.NewRestoreWorld(t, servertest.ClosedURL(t))
	ctx := context.Background()
	start := func(target string) string {
		t.Helper()
		j, err := w.Agents.StartDelta(ctx, jobs.DeltaSpec{Target: config.Target{Name: target}, Chain: target + "-full", Location: "default", FromRevision: 10})
		if err != nil {
			t.Fatal(err)
		}
		return j.Name
	}
	app, other := start("app"), start("other")
	w.Synced(t)
	if _, err := w.Server.RestoreBackup(ctx, &ebv1.RestoreBackupRequest{Name: "b1", Target: "app"}); err != nil {
		t.Fatal(err)
	}
	jobsLeft := map[string]bool{}
	list, err := w.Clientset.BatchV1().Jobs("etcdbackup-system").List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, j := range list.Items {
		jobsLeft[j.Name] = true
	}
	if jobsLeft[app] || !jobsLeft[other] {
		t.Fatalf("after the restore of app, delta Jobs left: %v; want %s stopped and %s running", jobsLeft, app, other)
	}
}
