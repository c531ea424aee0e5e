package jobs_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"slices"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/utils/ptr"

	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/api/agentjob"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/server/config"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/server/jobs"
)

const (
	ns         = "etcdbackup-system"
	secretData = "-----BEGIN PRIVATE KEY----- not-really-a-key"
)

func newLauncher(t *testing.T, agents config.Agents) (*jobs.Launcher, *fake.Clientset) {
	t.Helper()
	cs := fake.NewClientset(&corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "etcd-client"},
		Data:       map[string][]byte{"ca.crt": []byte("ca"), "tls.crt": []byte("crt"), "tls.key": []byte(secretData)},
	})
	if agents.Image == "" {
		agents.Image = "agent:dev"
	}
	l, err := jobs.New(cs, ns, agents)
	if err != nil {
		t.Fatal(err)
	}
	if err := l.Start(t.Context(), restoreTargets); err != nil {
		t.Fatal(err)
	}
	return l, cs
}

// synced waits until l's caches hold what the test changed through cs.
func synced(t *testing.T, l *jobs.Launcher) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	if err := l.Sync(ctx); err != nil {
		t.Fatal(err)
	}
}

var target = config.Target{
	Name:      "control-plane",
	Endpoints: []string{"https://10.0.0.10:2379", "https://10.0.0.11:2379"},
	TLSSecret: "etcd-client",
}

func TestNewNeedsNamespaceAndImage(t *testing.T) {
	cs := fake.NewClientset()
	if _, err := jobs.New(cs, "", config.Agents{Image: "agent:dev"}); err == nil || !strings.Contains(err.Error(), "POD_NAMESPACE") {
		t.Errorf("no namespace: %v", err)
	}
	if _, err := jobs.New(cs, ns, config.Agents{}); err == nil || !strings.Contains(err.Error(), "image") {
		t.Errorf("no image: %v", err)
	}
}

func TestBackupJobSpec(t *testing.T) {
	l, cs := newLauncher(t, config.Agents{Image: "registry.example/agent:v1", ImagePullPolicy: corev1.PullIfNotPresent})
	ctx := context.Background()
	job, err := l.StartBackup(ctx, jobs.BackupSpec{
		Name: "etcd-2026-01-31", Location: "s3", Compression: "zstd", Labels: map[string]string{"team": "a"}, Target: target,
	})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := cs.BatchV1().Jobs(ns).Get(ctx, job.Name, metav1.GetOptions{}); err != nil {
		t.Fatalf("job not in the API: %v", err)
	}
	if !strings.HasPrefix(job.Name, "backup-etcd-2026-01-31-") {
		t.Errorf("job name %q does not start with backup-NAME-", job.Name)
	}
	if job.Annotations[jobs.AnnotationBackup] != "etcd-2026-01-31" || job.Annotations[jobs.AnnotationLocation] != "s3" || job.Annotations[jobs.AnnotationTarget] != "control-plane" {
		t.Errorf("annotations: %v", job.Annotations)
	}
	// The defaults of config.Agents.
	if got := *job.Spec.ActiveDeadlineSeconds; got != int64(config.DefaultDeadline/time.Second) {
		t.Errorf("deadline %ds", got)
	}
	if got := *job.Spec.TTLSecondsAfterFinished; got != int32(config.DefaultTTLAfterFinished/time.Second) {
		t.Errorf("TTL %ds", got)
	}
	if *job.Spec.BackoffLimit != 0 {
		t.Errorf("backoffLimit %d: a retry would upload the same name again", *job.Spec.BackoffLimit)
	}
	// Except after an eviction (a node drain): the upload was cut off.
	if p := job.Spec.PodFailurePolicy; p == nil || len(p.Rules) != 1 || p.Rules[0].Action != batchv1.PodFailurePolicyActionIgnore ||
		len(p.Rules[0].OnPodConditions) != 1 || p.Rules[0].OnPodConditions[0].Type != corev1.DisruptionTarget {
		t.Errorf("podFailurePolicy %+v: an evicted agent's pod must be replaced", p)
	}
	pod := job.Spec.Template.Spec
	if pod.ServiceAccountName != config.DefaultServiceAccount || pod.AutomountServiceAccountToken == nil || *pod.AutomountServiceAccountToken {
		t.Errorf("service account %q, automount %v", pod.ServiceAccountName, pod.AutomountServiceAccountToken)
	}
	if pod.RestartPolicy != corev1.RestartPolicyNever {
		t.Errorf("restartPolicy %s", pod.RestartPolicy)
	}
	psc := pod.SecurityContext
	if !*psc.RunAsNonRoot || *psc.RunAsUser != 65532 || psc.SeccompProfile.Type != corev1.SeccompProfileTypeRuntimeDefault {
		t.Errorf("pod security context: %+v", psc)
	}
	if len(pod.Containers) != 1 {
		t.Fatalf("%d containers", len(pod.Containers))
	}
	c := pod.Containers[0]
	if c.Image != "registry.example/agent:v1" || c.ImagePullPolicy != corev1.PullIfNotPresent {
		t.Errorf("image %s (%s)", c.Image, c.ImagePullPolicy)
	}
	sc := c.SecurityContext
	if *sc.AllowPrivilegeEscalation || !*sc.ReadOnlyRootFilesystem || len(sc.Capabilities.Drop) != 1 || sc.Capabilities.Drop[0] != "ALL" {
		t.Errorf("container security context: %+v", sc)
	}
	if len(c.Env) != 0 || len(c.EnvFrom) != 0 {
		t.Errorf("environment given to the agent: %v %v", c.Env, c.EnvFrom)
	}
	if len(pod.Volumes) != 4 || pod.Volumes[1].Secret == nil || pod.Volumes[1].Secret.SecretName != "etcd-client" {
		t.Fatalf("volumes %+v: want only scratch space, the target's TLS Secret, the server's CA and the agent's token", pod.Volumes)
	}
	checkScratch(t, pod)
	if len(c.VolumeMounts) != 4 || !c.VolumeMounts[1].ReadOnly {
		t.Errorf("mounts %+v", c.VolumeMounts)
	}
	checkAgentToken(t, pod)
	args := strings.Join(c.Args, " ")
	for _, want := range []string{
		"backup", "--server=etcdbackup." + ns + ".svc:" + config.DefaultAgentPort, "--name=etcd-2026-01-31", "--location=s3", "--target=control-plane",
		"--endpoints=https://10.0.0.10:2379,https://10.0.0.11:2379", "--compression=zstd", "--labels=team=a",
		"--cacert=/etc/etcdbackup/etcd-tls/ca.crt", "--key=/etc/etcdbackup/etcd-tls/tls.key",
	} {
		if !strings.Contains(args, want) {
			t.Errorf("args %q lack %q", args, want)
		}
	}
	all, err := json.Marshal(job)
	if err != nil {
		t.Fatal(err)
	}
	if bytes.Contains(all, []byte(secretData)) {
		t.Errorf("the Job carries the Secret's content")
	}
}

func TestBackupJobAgentsConfig(t *testing.T) {
	l, _ := newLauncher(t, config.Agents{
		ServiceAccount: "sa", ServerAddress: "server:1234",
		TTLAfterFinished: metav1.Duration{Duration: 90 * time.Second}, Deadline: metav1.Duration{Duration: time.Hour},
	})
	job, err := l.StartBackup(context.Background(), jobs.BackupSpec{
		Name: "b", Location: "default",
		Target: config.Target{Name: "plain", Endpoints: []string{"http://etcd:2379"}, InsecurePlaintext: true},
	})
	if err != nil {
		t.Fatal(err)
	}
	if *job.Spec.TTLSecondsAfterFinished != 90 || *job.Spec.ActiveDeadlineSeconds != 3600 || job.Spec.Template.Spec.ServiceAccountName != "sa" {
		t.Errorf("job spec: TTL %d, deadline %d, SA %s", *job.Spec.TTLSecondsAfterFinished, *job.Spec.ActiveDeadlineSeconds, job.Spec.Template.Spec.ServiceAccountName)
	}
	c := job.Spec.Template.Spec.Containers[0]
	args := strings.Join(c.Args, " ")
	if !strings.Contains(args, "--server=server:1234") || !strings.Contains(args, "--insecure-plaintext") || strings.Contains(args, "--cacert") {
		t.Errorf("args %q", args)
	}
	if len(job.Spec.Template.Spec.Volumes) != 3 || len(c.VolumeMounts) != 3 {
		t.Errorf("a target without TLS Secret mounts %+v, want only scratch space, the server's CA and the agent's token", job.Spec.Template.Spec.Volumes)
	}
	checkScratch(t, job.Spec.Template.Spec)
	checkAgentToken(t, job.Spec.Template.Spec)
}

// checkScratch checks that a backup agent has bounded scratch space for
// its copy of the snapshot, and is told where it is.
func checkScratch(t *testing.T, pod corev1.PodSpec) {
	t.Helper()
	v := pod.Volumes[0]
	if v.Name != "work" || v.EmptyDir == nil || v.EmptyDir.SizeLimit == nil || v.EmptyDir.SizeLimit.IsZero() {
		t.Errorf("scratch volume %+v: want a bounded emptyDir", v)
	}
	c := pod.Containers[0]
	if m := c.VolumeMounts[0]; m.Name != "work" || m.ReadOnly || !slices.Contains(c.Args, "--scratch-dir="+m.MountPath) {
		t.Errorf("scratch mount %+v, args %q", m, c.Args)
	}
}

// checkAgentToken checks that pod's only credential towards the server
// is a projected token for the server's audience, short-lived, mounted
// read-only where --token-file points.
func checkAgentToken(t *testing.T, pod corev1.PodSpec) {
	t.Helper()
	if pod.AutomountServiceAccountToken == nil || *pod.AutomountServiceAccountToken {
		t.Errorf("the API server's token is mounted too (automountServiceAccountToken %v)", pod.AutomountServiceAccountToken)
	}
	var tokens []corev1.Volume
	for _, v := range pod.Volumes {
		if v.Projected != nil {
			tokens = append(tokens, v)
		}
	}
	if len(tokens) != 1 || len(tokens[0].Projected.Sources) != 1 || tokens[0].Projected.Sources[0].ServiceAccountToken == nil {
		t.Fatalf("projected volumes %+v: want one with only a ServiceAccount token", tokens)
	}
	tok := tokens[0].Projected.Sources[0].ServiceAccountToken
	if tok.Audience != "etcdbackup" || tok.ExpirationSeconds == nil || *tok.ExpirationSeconds != 600 || tok.Path != "token" {
		t.Errorf("token projection: audience %q, expiration %v, path %q; want etcdbackup, 600, token", tok.Audience, tok.ExpirationSeconds, tok.Path)
	}
	c := pod.Containers[0]
	var mounted bool
	for _, m := range c.VolumeMounts {
		if m.Name == tokens[0].Name {
			mounted = m.ReadOnly && m.MountPath+"/"+tok.Path == jobs.TokenPath
		}
	}
	if !mounted {
		t.Errorf("token volume not mounted read-only at %s: %+v", jobs.TokenPath, c.VolumeMounts)
	}
	if !slices.Contains(c.Args, "--token-file=/var/run/secrets/etcdbackup.io/agent/token") {
		t.Errorf("args %q lack --token-file", c.Args)
	}
}

func TestJobNamesAreDNSLabels(t *testing.T) {
	l, _ := newLauncher(t, config.Agents{})
	long := strings.Repeat("a.b-", 50) // 200 characters
	names := map[string]bool{}
	for _, name := range []string{long, long[:199] + "c", "x", "a." + strings.Repeat("z", 198)} {
		job, err := l.StartBackup(context.Background(), jobs.BackupSpec{Name: name, Location: "default", Target: target})
		if err != nil {
			t.Fatal(err)
		}
		if errs := validation.IsDNS1123Label(job.Name); len(errs) > 0 {
			t.Errorf("job name %q of backup %q: %v", job.Name, name, errs)
		}
		if names[job.Name] {
			t.Errorf("job name %q used twice", job.Name)
		}
		names[job.Name] = true
	}
	for _, member := range []string{"Member_0", strings.Repeat("m", 100), "etcd-0.etcd.ns.svc"} {
		if n := jobs.RestoreJobName("default", long, "app", member); len(validation.IsDNS1123Label(n)) > 0 {
			t.Errorf("restore job name %q of member %q: %v", n, member, validation.IsDNS1123Label(n))
		}
	}
	if a, b := jobs.RestoreJobName("default", "b", "app", "m0"), jobs.RestoreJobName("s3", "b", "app", "m0"); a == b {
		t.Errorf("restores from two locations share job name %q", a)
	}
}

func setFailed(t *testing.T, cs *fake.Clientset, job *batchv1.Job) {
	t.Helper()
	job.Status.Failed = 1
	job.Status.Conditions = []batchv1.JobCondition{{Type: batchv1.JobFailed, Status: corev1.ConditionTrue, Reason: "DeadlineExceeded", Message: "Job was active longer than specified deadline"}}
	if _, err := cs.BatchV1().Jobs(job.Namespace).UpdateStatus(context.Background(), job, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
}

func TestStartBackupWhileRunningAndAfterFailure(t *testing.T) {
	l, cs := newLauncher(t, config.Agents{})
	ctx := context.Background()
	spec := jobs.BackupSpec{Name: "b1", Location: "default", Target: target}
	job, err := l.StartBackup(ctx, spec)
	if err != nil {
		t.Fatal(err)
	}
	job.Status.Active = 1
	if _, err := cs.BatchV1().Jobs(ns).UpdateStatus(ctx, job, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := l.StartBackup(ctx, spec); !errors.Is(err, jobs.ErrRunning) {
		t.Fatalf("second start while the first runs: %v, want ErrRunning", err)
	}
	runs, err := l.List(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(runs) != 1 || runs[0].Phase != jobs.PhaseRunning || runs[0].Name != "b1" || runs[0].Location != "default" || runs[0].Target != "control-plane" || runs[0].JobName != job.Name {
		t.Fatalf("runs %+v", runs)
	}

	// A failed run is replaced by a new one.
	setFailed(t, cs, job)
	again, err := l.StartBackup(ctx, spec)
	if err != nil {
		t.Fatalf("start after a failed run: %v", err)
	}
	if again.Name != job.Name || len(again.Status.Conditions) != 0 {
		t.Errorf("replacement %s: %+v", again.Name, again.Status)
	}
}

func TestFailedRunMessage(t *testing.T) {
	l, cs := newLauncher(t, config.Agents{})
	ctx := context.Background()
	job, err := l.StartBackup(ctx, jobs.BackupSpec{Name: "b1", Location: "default", Target: target})
	if err != nil {
		t.Fatal(err)
	}
	setFailed(t, cs, job)
	synced(t, l)
	runs, err := l.List(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(runs) != 1 || runs[0].Phase != jobs.PhaseFailed || runs[0].Message != "DeadlineExceeded: Job was active longer than specified deadline" {
		t.Fatalf("without a pod: %+v", runs)
	}
	// With the agent's pod, its last words are the message.
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: job.Name + "-x", Labels: podLabels(job)},
		Status: corev1.PodStatus{ContainerStatuses: []corev1.ContainerStatus{{Name: "agent", State: corev1.ContainerState{
			Terminated: &corev1.ContainerStateTerminated{ExitCode: 1, Reason: "Error", Message: "connecting\nsnapshot: etcd at https://10.0.0.10:2379 refused the client certificate\n"},
		}}}},
	}
	if _, err := cs.CoreV1().Pods(ns).Create(ctx, pod, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	synced(t, l)
	runs, err = l.List(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if want := "agent exited with code 1: snapshot: etcd at https://10.0.0.10:2379 refused the client certificate"; len(runs) != 1 || runs[0].Message != want {
		t.Fatalf("runs %+v, want message %q", runs, want)
	}
}

func TestCheckTarget(t *testing.T) {
	l, _ := newLauncher(t, config.Agents{})
	ctx := context.Background()
	if err := l.CheckTarget(ctx, target); err != nil {
		t.Errorf("existing Secret: %v", err)
	}
	missing := target
	missing.TLSSecret = "nope"
	if err := l.CheckTarget(ctx, missing); err == nil || !strings.Contains(err.Error(), ns+"/nope does not exist") {
		t.Errorf("missing Secret: %v", err)
	}
}

// TestLogs runs in a synctest bubble: its clock moves only when every
// goroutine waits, so the pod created 300 ms in comes after Logs' first
// look at the cache, which following must outwait, and no real time
// passes.
func TestLogs(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		l, cs := newLauncher(t, config.Agents{})
		ctx := context.Background()
		var out bytes.Buffer
		if err := l.Logs(ctx, "default", "b1", false, &out); !errors.Is(err, jobs.ErrNoRun) {
			t.Fatalf("logs of a backup without run: %v, want ErrNoRun", err)
		}
		job, err := l.StartBackup(ctx, jobs.BackupSpec{Name: "b1", Location: "default", Target: target})
		if err != nil {
			t.Fatal(err)
		}
		if err := l.Logs(ctx, "default", "b1", false, &out); err != nil || out.Len() != 0 {
			t.Fatalf("logs before the pod started: %v, %q", err, out.String())
		}
		// Following waits for the pod to start.
		ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		defer cancel()
		go func() {
			time.Sleep(300 * time.Millisecond)
			_, _ = cs.CoreV1().Pods(ns).Create(ctx, &corev1.Pod{
				ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: job.Name + "-x", Labels: podLabels(job)},
				Status:     corev1.PodStatus{ContainerStatuses: []corev1.ContainerStatus{{Name: "agent", State: corev1.ContainerState{Running: &corev1.ContainerStateRunning{}}}}},
			}, metav1.CreateOptions{})
		}()
		if err := l.Logs(ctx, "default", "b1", true, &out); err != nil {
			t.Fatal(err)
		}
		if out.String() != "fake logs" { // what the fake clientset streams
			t.Errorf("logs %q", out.String())
		}
		// A cancelled follow ends with the context's error.
		cctx, ccancel := context.WithCancel(context.Background())
		ccancel()
		if _, err := l.StartBackup(context.Background(), jobs.BackupSpec{Name: "b2", Location: "default", Target: target}); err != nil {
			t.Fatal(err)
		}
		if err := l.Logs(cctx, "default", "b2", true, &out); !errors.Is(err, context.Canceled) {
			t.Errorf("cancelled follow: %v", err)
		}
	})
}

func TestRestoreJobs(t *testing.T) {
	l, cs := newLauncher(t, config.Agents{})
	ctx := context.Background()
	app := config.Target{
		Name: "app", Endpoints: []string{"http://app-etcd:2379"}, Namespace: "app", InitialClusterToken: "tok",
		RestoreRunAsUser: ptr.To[int64](0), RestoreRunAsGroup: ptr.To[int64](1001),
		Members: []config.Member{
			{Name: "m0", PeerURL: "http://m0:2380", DataDir: "data", Volume: config.MemberVolume{PersistentVolumeClaim: &config.ClaimRef{ClaimName: "data-m0"}}},
			{Name: "cp-1", PeerURL: "https://10.0.0.10:2380", DataDir: "etcd", NodeName: "cp-1", Volume: config.MemberVolume{HostPath: &config.HostPathRef{Path: "/var/lib"}}},
		},
	}
	const sum = "6794a8ff9654e821ba067dda207cf98ec8f022ce1c001fd07cd542530cd173f5"
	spec := jobs.RestoreSpec{Name: "b1", Location: "s3", Target: app, MoveAside: true, SHA256: sum, BumpRevision: 1_000_000_000}
	created, err := l.StartRestore(ctx, spec)
	if err != nil {
		t.Fatal(err)
	}
	if len(created) != 2 {
		t.Fatalf("%d jobs for 2 members", len(created))
	}
	for i, j := range created {
		m := app.Members[i]
		if j.Namespace != "app" || j.Name != jobs.RestoreJobName("s3", "b1", "app", m.Name) || j.Annotations[jobs.AnnotationMember] != m.Name {
			t.Errorf("job %s/%s for member %s", j.Namespace, j.Name, m.Name)
		}
		pod := j.Spec.Template.Spec
		if *pod.AutomountServiceAccountToken || *pod.SecurityContext.RunAsUser != 0 || *pod.SecurityContext.RunAsNonRoot ||
			*pod.SecurityContext.RunAsGroup != 1001 || *pod.SecurityContext.FSGroup != 1001 {
			t.Errorf("member %s: pod security %+v", m.Name, pod.SecurityContext)
		}
		args := strings.Join(pod.Containers[0].Args, " ")
		for _, want := range []string{
			"restore", "--name=b1", "--location=s3", "--member-name=" + m.Name, "--data-dir=/var/lib/etcd-restore/" + m.DataDir,
			"--initial-cluster=m0=http://m0:2380,cp-1=https://10.0.0.10:2380", "--initial-advertise-peer-urls=" + m.PeerURL,
			"--initial-cluster-token=tok", "--move-aside", "--sha256=" + sum, "--bump-revision=1000000000",
		} {
			if !strings.Contains(args, want) {
				t.Errorf("member %s: args %q lack %q", m.Name, args, want)
			}
		}
		for _, a := range []map[string]string{j.Annotations, j.Spec.Template.Annotations} {
			if a[jobs.AnnotationSHA256] != sum || a[jobs.AnnotationBackup] != "b1" || a[jobs.AnnotationLocation] != "s3" || a[jobs.AnnotationBumpRevision] != "1000000000" {
				t.Errorf("member %s: annotations %v lack backup, location, SHA-256 and revision bump", m.Name, a)
			}
		}
		checkAgentToken(t, pod)
	}
	pvc, host := created[0].Spec.Template.Spec, created[1].Spec.Template.Spec
	if pvc.Volumes[0].PersistentVolumeClaim == nil || pvc.Volumes[0].PersistentVolumeClaim.ClaimName != "data-m0" || pvc.NodeName != "" {
		t.Errorf("PVC member: volume %+v, node %q", pvc.Volumes[0], pvc.NodeName)
	}
	if host.Volumes[0].HostPath == nil || host.Volumes[0].HostPath.Path != "/var/lib" || host.NodeName != "cp-1" {
		t.Errorf("hostPath member: volume %+v, node %q", host.Volumes[0], host.NodeName)
	}
	if got := jobs.DescribeVolume(app.Members[0]) + " " + jobs.DescribeVolume(app.Members[1]); got != "pvc/data-m0 hostPath cp-1:/var/lib" {
		t.Errorf("volumes described as %q", got)
	}

	// Running: a second restore is refused and nothing is replaced.
	if _, err := l.StartRestore(ctx, spec); !errors.Is(err, jobs.ErrRunning) {
		t.Fatalf("restore while running: %v, want ErrRunning", err)
	}
	setFailed(t, cs, created[1])
	synced(t, l)
	runs, err := l.ListRestores(ctx, "s3", "b1", app)
	if err != nil {
		t.Fatal(err)
	}
	if len(runs) != 2 || runs["m0"].Phase != jobs.PhaseRunning || runs["cp-1"].Phase != jobs.PhaseFailed || !strings.Contains(runs["cp-1"].Message, "DeadlineExceeded") {
		t.Errorf("runs %+v", runs)
	}
	if runs["m0"].BumpRevision != 1_000_000_000 || runs["cp-1"].BumpRevision != 1_000_000_000 {
		t.Errorf("runs %+v do not report the Jobs' revision bump", runs)
	}
	if other, err := l.ListRestores(ctx, "default", "b1", app); err != nil || len(other) != 0 {
		t.Errorf("restores from another location: %+v, %v", other, err)
	}
	// Default: restore Jobs run as the agent's own user, non-root.
	def := app
	def.RestoreRunAsUser, def.RestoreRunAsGroup, def.Namespace = nil, nil, ""
	created, err = l.StartRestore(ctx, jobs.RestoreSpec{Name: "b2", Location: "s3", Target: def})
	if err != nil {
		t.Fatal(err)
	}
	if sc := created[0].Spec.Template.Spec.SecurityContext; created[0].Namespace != ns || *sc.RunAsUser != 65532 || !*sc.RunAsNonRoot || *sc.FSGroup != 65532 {
		t.Errorf("default restore job %s: %+v", created[0].Namespace, sc)
	}
	if a := strings.Join(created[0].Spec.Template.Spec.Containers[0].Args, " "); strings.Contains(a, "--move-aside") {
		t.Errorf("args %q", a)
	}
	// A bump of 0 is passed as such: the agent's default never decides.
	if a := created[0].Spec.Template.Spec.Containers[0].Args; !slices.Contains(a, "--bump-revision=0") || created[0].Annotations[jobs.AnnotationBumpRevision] != "0" {
		t.Errorf("restore without a bump: args %q, annotations %v", a, created[0].Annotations)
	}
}

// The backup Job gets the target's public keys as args; the restore Job
// of an encrypted backup mounts the identity Secret and names only its
// mount path: no key material in args or env.
func TestEncryptionInJobSpecs(t *testing.T) {
	l, _ := newLauncher(t, config.Agents{})
	ctx := context.Background()
	const rcp = "age1ql3z7hjy54pw3hyww5ayyfg7zqgvc7w3j2elw8zmrj2kg5sfn9aqmcac8p"
	j, err := l.StartBackup(ctx, jobs.BackupSpec{Name: "enc", Location: "default", Target: target, AgeRecipients: []string{rcp}})
	if err != nil {
		t.Fatal(err)
	}
	if args := strings.Join(j.Spec.Template.Spec.Containers[0].Args, " "); !strings.Contains(args, "--encrypt-to="+rcp) {
		t.Fatalf("backup args %s", args)
	}
	app := config.Target{
		Name: "app", Endpoints: []string{"http://app-etcd:2379"}, Namespace: "app",
		Members: []config.Member{{Name: "m0", PeerURL: "http://m0:2380", DataDir: "data", Volume: config.MemberVolume{PersistentVolumeClaim: &config.ClaimRef{ClaimName: "data-m0"}}}},
	}
	created, err := l.StartRestore(ctx, jobs.RestoreSpec{Name: "enc", Location: "default", Target: app, IdentitySecret: "etcd-age-key"})
	if err != nil {
		t.Fatal(err)
	}
	pod := created[0].Spec.Template.Spec
	var vol *corev1.Volume
	for i := range pod.Volumes {
		if s := pod.Volumes[i].Secret; s != nil && s.SecretName == "etcd-age-key" {
			vol = &pod.Volumes[i]
		}
	}
	if vol == nil {
		t.Fatalf("identity Secret not mounted: %+v", pod.Volumes)
	}
	if *vol.Secret.DefaultMode&0o007 != 0 {
		t.Errorf("identity readable by others: %o", *vol.Secret.DefaultMode)
	}
	// Optional: a missing Secret fails the agent at once, not the pod's
	// start at the Job's deadline.
	if vol.Secret.Optional == nil || !*vol.Secret.Optional {
		t.Error("identity Secret volume not optional")
	}
	c := pod.Containers[0]
	var mount string
	for _, m := range c.VolumeMounts {
		if m.Name == vol.Name {
			mount = m.MountPath
			if !m.ReadOnly {
				t.Error("identity mount is writable")
			}
		}
	}
	if mount == "" || !slices.Contains(c.Args, "--identity-dir="+mount) {
		t.Fatalf("mount %q, args %v", mount, c.Args)
	}
	if len(c.Env) != 0 || len(c.EnvFrom) != 0 {
		t.Errorf("restore agent has env %v %v", c.Env, c.EnvFrom)
	}
	for _, a := range c.Args {
		if strings.Contains(a, "AGE-SECRET-KEY") || strings.Contains(a, "etcd-age-key") {
			t.Errorf("arg %q names the key or Secret", a)
		}
	}
	// A restore without an identity Secret mounts none.
	created, err = l.StartRestore(ctx, jobs.RestoreSpec{Name: "plain", Location: "default", Target: app})
	if err != nil {
		t.Fatal(err)
	}
	for _, v := range created[0].Spec.Template.Spec.Volumes {
		if v.Secret != nil {
			t.Errorf("unexpected Secret volume %s", v.Name)
		}
	}
	// Backup Jobs never mount it.
	for _, v := range j.Spec.Template.Spec.Volumes {
		if v.Secret != nil && v.Secret.SecretName == "etcd-age-key" {
			t.Error("backup Job mounts the identity")
		}
	}
}

// Restore Jobs of hostPath members run in agents.restoreNamespace (one
// whose Pod Security admits hostPath), those of claims beside the claims;
// the agent guard admits restore agents from each.
func TestRestoreNamespaces(t *testing.T) {
	claim := config.Target{Name: "app", Namespace: "app", Members: []config.Member{
		{Name: "m0", Volume: config.MemberVolume{PersistentVolumeClaim: &config.ClaimRef{ClaimName: "data-m0"}}}}}
	host := config.Target{Name: "cp", Namespace: "ignored-for-jobs", Members: []config.Member{
		{Name: "cp-1", NodeName: "cp-1", Volume: config.MemberVolume{HostPath: &config.HostPathRef{Path: "/var/lib"}}}}}
	backupOnly := config.Target{Name: "b"}
	for _, tc := range []struct {
		agents config.Agents
		want   []string
	}{
		{config.Agents{}, []string{"app", config.DefaultRestoreNamespace, ns}},
		{config.Agents{RestoreNamespace: "cp-restore"}, []string{"app", "cp-restore", ns}},
	} {
		l, _ := newLauncher(t, tc.agents)
		if got := l.RestoreNamespaces([]config.Target{claim, host, backupOnly, host}); !slices.Equal(got, tc.want) {
			t.Errorf("agents %+v: restore namespaces %v, want %v", tc.agents, got, tc.want)
		}
		if got := l.MemberNamespace(host); got != "ignored-for-jobs" {
			t.Errorf("hostPath members' pods are looked for in %q", got)
		}
		host.Namespace = ""
		if got := l.MemberNamespace(host); got != "kube-system" {
			t.Errorf("hostPath members' pods are looked for in %q, want kube-system", got)
		}
		host.Namespace = "ignored-for-jobs"
	}
}

// A backup Job whose pod the API refuses to create is Failed with the
// API's reason, and StartBackup replaces it rather than calling it
// running. An event of an earlier Job of the same name is no evidence.
func TestRefusedJobIsFailed(t *testing.T) {
	l, cs := newLauncher(t, config.Agents{})
	ctx := context.Background()
	spec := jobs.BackupSpec{Name: "b1", Location: "default", Target: target}
	job, err := l.StartBackup(ctx, spec)
	if err != nil {
		t.Fatal(err)
	}
	job.UID = "uid-now"
	if job, err = cs.BatchV1().Jobs(ns).Update(ctx, job, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	event := func(name, uid, msg string) {
		t.Helper()
		e := &corev1.Event{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
			InvolvedObject: corev1.ObjectReference{Kind: "Job", Name: job.Name, UID: types.UID(uid)},
			Reason:         "FailedCreate", Message: msg, Type: corev1.EventTypeWarning, LastTimestamp: metav1.Now()}
		if _, err := cs.CoreV1().Events(ns).Create(ctx, e, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	phase := func() jobs.Run {
		t.Helper()
		synced(t, l)
		runs, err := l.List(ctx)
		if err != nil || len(runs) != 1 {
			t.Fatalf("runs %v, %v", runs, err)
		}
		return runs[0]
	}
	event("old", "uid-before", `Error creating: pods "x" is forbidden: error looking up service account etcdbackup-system/etcdbackup-agent: serviceaccount "etcdbackup-agent" not found`)
	event("transient", "uid-now", `Error creating: Timeout: request did not complete within requested timeout`)
	if r := phase(); r.Phase != jobs.PhaseRunning {
		t.Fatalf("with no refusal of this Job: %+v", r)
	}
	event("now", "uid-now", `Error creating: pods "backup-b1-x" is forbidden: violates PodSecurity "restricted:latest": hostPath volumes (volume "data")`)
	r := phase()
	if r.Phase != jobs.PhaseFailed || !strings.Contains(r.Message, `the API refuses to create the agent's pod: pods "backup-b1-x" is forbidden: violates PodSecurity`) ||
		!strings.Contains(r.Message, "namespace "+ns+" must admit it") {
		t.Fatalf("refused job: %+v", r)
	}
	if _, err := l.StartBackup(ctx, spec); err != nil {
		t.Fatalf("start after a refused run: %v", err)
	}
}

// A drill, delta or fold Job whose pod the API refuses fails at once with
// the API's reason, as a backup's does: the Job cache keeps the events of
// every kind of agent Job (issue 38: it kept only backup and restore
// Jobs', so these showed Running until their deadline).
func TestRefusedJobOfEveryKindIsFailed(t *testing.T) {
	l, cs := newLauncher(t, config.Agents{})
	ctx := context.Background()
	drill, err := l.StartDrill(ctx, jobs.DrillSpec{Backup: "b1", Location: "default", Target: target.Name, SHA256: strings.Repeat("a", 64)})
	if err != nil {
		t.Fatal(err)
	}
	delta, err := l.StartDelta(ctx, jobs.DeltaSpec{Target: target, Chain: "b1", Location: "default", Period: time.Minute, MaxBytes: 1 << 20})
	if err != nil {
		t.Fatal(err)
	}
	seg := strings.Repeat("1", 64)
	fold, err := l.StartFold(ctx, jobs.FoldSpec{Target: target, Backup: jobs.FoldName(target.Name, 20), Location: "default",
		Inputs: jobs.FoldInputs{Full: jobs.FoldRef{Name: "b1", SHA256: seg}, Segments: []jobs.FoldRef{{Name: "b1.delta-11", SHA256: seg}}, ToRevision: 20}})
	if err != nil {
		t.Fatal(err)
	}
	for _, j := range []*batchv1.Job{drill, delta, fold} {
		e := &corev1.Event{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: j.Name + ".refused"},
			InvolvedObject: corev1.ObjectReference{Kind: "Job", Name: j.Name, UID: j.UID},
			Reason:         "FailedCreate", Message: `Error creating: pods "` + j.Name + `-x" is forbidden: exceeded quota: pods`, Type: corev1.EventTypeWarning, LastTimestamp: metav1.Now()}
		if _, err := cs.CoreV1().Events(ns).Create(ctx, e, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	synced(t, l)
	const want = "the API refuses to create the agent's pod"
	drills, err := l.Drills(ctx)
	if err != nil || len(drills) != 1 || drills[0].Phase != jobs.PhaseFailed || !strings.Contains(drills[0].Message, want) {
		t.Errorf("refused drill: %+v, %v", drills, err)
	}
	deltas, err := l.Deltas(ctx)
	if err != nil || len(deltas) != 1 || deltas[0].Phase != jobs.PhaseFailed || !strings.Contains(deltas[0].Message, want) {
		t.Errorf("refused delta agent: %+v, %v", deltas, err)
	}
	folds, err := l.Folds(ctx)
	if err != nil || len(folds) != 1 || folds[0].Phase != jobs.PhaseFailed || !strings.Contains(folds[0].Message, want) {
		t.Errorf("refused fold: %+v, %v", folds, err)
	}
}

// An agent pod of any kind that cannot start — its image cannot be
// pulled, a Secret it reads or mounts is missing — fails its run once it
// has waited so for 40 s, naming what is missing; before that, and once
// it runs, it is Running (issue 38: an image not mirrored left `backup
// --wait` and `drill --wait` waiting for an hour).
func TestStuckAgentPodFailsItsRun(t *testing.T) {
	ctx := context.Background()
	seg := strings.Repeat("1", 64)
	start := map[string]func(l *jobs.Launcher) (*batchv1.Job, error){
		"backup": func(l *jobs.Launcher) (*batchv1.Job, error) {
			return l.StartBackup(ctx, jobs.BackupSpec{Name: "b1", Location: "default", Target: target})
		},
		"drill": func(l *jobs.Launcher) (*batchv1.Job, error) {
			return l.StartDrill(ctx, jobs.DrillSpec{Backup: "b1", Location: "default", Target: target.Name, SHA256: seg})
		},
		"delta": func(l *jobs.Launcher) (*batchv1.Job, error) {
			return l.StartDelta(ctx, jobs.DeltaSpec{Target: target, Chain: "b1", Location: "default", Period: time.Minute, MaxBytes: 1 << 20})
		},
		"fold": func(l *jobs.Launcher) (*batchv1.Job, error) {
			return l.StartFold(ctx, jobs.FoldSpec{Target: target, Backup: jobs.FoldName(target.Name, 20), Location: "default",
				Inputs: jobs.FoldInputs{Full: jobs.FoldRef{Name: "b1", SHA256: seg}, Segments: []jobs.FoldRef{{Name: "b1.delta-11", SHA256: seg}}, ToRevision: 20}})
		},
		"restore": func(l *jobs.Launcher) (*batchv1.Job, error) {
			js, err := l.StartRestore(ctx, jobs.RestoreSpec{Name: "b1", Location: "default", Target: restoreTarget, SHA256: seg})
			if err != nil || len(js) == 0 {
				return nil, err
			}
			return js[0], nil
		},
	}
	for kind, startJob := range start {
		for _, tc := range []struct {
			name   string
			age    time.Duration
			status corev1.ContainerStatus
			event  string
			want   string
		}{
			{"image", time.Minute, waiting("ImagePullBackOff", `Back-off pulling image "registry.example/agent:v1"`), "",
				"cannot be pulled on node node-1 (ImagePullBackOff: Back-off pulling image"},
			{"image, young pod", 10 * time.Second, waiting("ErrImagePull", "rpc error: code = Unavailable"), "", ""},
			{"env Secret", time.Minute, waiting("CreateContainerConfigError", `secret "etcd-age-key" not found`), "",
				`the agent's container cannot be created: secret "etcd-age-key" not found`},
			{"volume", time.Minute, waiting("ContainerCreating", ""), `MountVolume.SetUp failed for volume "etcd-client" : secret "etcd-client" not found`,
				`a volume of the agent's pod cannot be mounted: MountVolume.SetUp failed for volume "etcd-client" : secret "etcd-client" not found`},
		} {
			t.Run(kind+"/"+tc.name, func(t *testing.T) {
				l, cs := newLauncher(t, config.Agents{})
				j, err := startJob(l)
				if err != nil {
					t.Fatal(err)
				}
				pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: j.Namespace, Name: j.Name + "-abcde", UID: "pod-uid",
					CreationTimestamp: metav1.NewTime(time.Now().Add(-tc.age)),
					Labels:            map[string]string{jobs.LabelManagedBy: "etcdbackup-server", batchv1.JobNameLabel: j.Name}},
					Spec:   corev1.PodSpec{NodeName: "node-1", ServiceAccountName: "etcdbackup-agent", Containers: []corev1.Container{{Name: tc.status.Name, Image: "registry.example/agent:v1"}}},
					Status: corev1.PodStatus{Phase: corev1.PodPending, ContainerStatuses: []corev1.ContainerStatus{tc.status}}}
				if _, err := cs.CoreV1().Pods(j.Namespace).Create(ctx, pod, metav1.CreateOptions{}); err != nil {
					t.Fatal(err)
				}
				if tc.event != "" {
					e := &corev1.Event{ObjectMeta: metav1.ObjectMeta{Namespace: j.Namespace, Name: pod.Name + ".mount"},
						InvolvedObject: corev1.ObjectReference{Kind: "Pod", Name: pod.Name, UID: pod.UID},
						Reason:         "FailedMount", Message: tc.event, Type: corev1.EventTypeWarning, LastTimestamp: metav1.Now()}
					if _, err := cs.CoreV1().Events(j.Namespace).Create(ctx, e, metav1.CreateOptions{}); err != nil {
						t.Fatal(err)
					}
				}
				synced(t, l)
				phase, msg := runOf(t, l, kind, j.Name)
				if tc.want == "" {
					if phase != jobs.PhaseRunning {
						t.Fatalf("%s run: %s %q, want Running", kind, phase, msg)
					}
					return
				}
				if phase != jobs.PhaseFailed || !strings.Contains(msg, tc.want) || !strings.Contains(msg, "again") {
					t.Fatalf("%s run: %s %q, want Failed saying %q", kind, phase, msg, tc.want)
				}
			})
		}
	}
}

func waiting(reason, msg string) corev1.ContainerStatus {
	return corev1.ContainerStatus{Name: "agent", State: corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{Reason: reason, Message: msg}}}
}

// runOf is where the run of kind in Job name stands, as the server
// reports it.
func runOf(t *testing.T, l *jobs.Launcher, kind, name string) (jobs.Phase, string) {
	t.Helper()
	ctx := context.Background()
	// What every kind's run says: its Job, phase and message.
	type run struct {
		job   string
		phase jobs.Phase
		msg   string
	}
	var runs []run
	var err error
	switch kind {
	case "drill":
		var rs []jobs.DrillRun
		rs, err = l.Drills(ctx)
		for _, r := range rs {
			runs = append(runs, run{r.JobName, r.Phase, r.Message})
		}
	case "delta":
		var rs []jobs.DeltaRun
		rs, err = l.Deltas(ctx)
		for _, r := range rs {
			runs = append(runs, run{r.JobName, r.Phase, r.Message})
		}
	case "fold":
		var rs []jobs.FoldRun
		rs, err = l.Folds(ctx)
		for _, r := range rs {
			runs = append(runs, run{r.JobName, r.Phase, r.Message})
		}
	case "restore":
		var ms map[string]jobs.MemberRun
		ms, err = l.ListRestores(ctx, "default", "b1", restoreTarget)
		for _, m := range ms {
			runs = append(runs, run{m.JobName, m.Phase, m.Message})
		}
	default:
		var rs []jobs.Run
		rs, err = l.List(ctx)
		for _, r := range rs {
			runs = append(runs, run{r.JobName, r.Phase, r.Message})
		}
	}
	for _, r := range runs {
		if r.job == name {
			return r.phase, r.msg
		}
	}
	t.Fatalf("no %s run %s: %v (%v)", kind, name, err, runs)
	return "", ""
}

// A delta agent that ended its chain reports why; the server reads it
// back with the finished run, and nothing from a run still going.
func TestDeltaRunReportsItsChainEnd(t *testing.T) {
	l, cs := newLauncher(t, config.Agents{})
	ctx := context.Background()
	job, err := l.StartDelta(ctx, jobs.DeltaSpec{Target: target, Chain: "b1", Location: "default", Period: time.Minute, MaxBytes: 1 << 20})
	if err != nil {
		t.Fatal(err)
	}
	const reason = "etcd compacted revision 120 past the agent's position 100"
	end, err := agentjob.DeltaEnd{ChainEnded: reason}.Encode()
	if err != nil {
		t.Fatal(err)
	}
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: job.Name + "-x", Labels: podLabels(job)},
		Status: corev1.PodStatus{ContainerStatuses: []corev1.ContainerStatus{{Name: "agent", State: corev1.ContainerState{
			Terminated: &corev1.ContainerStateTerminated{ExitCode: 0, Reason: "Completed", Message: string(end)},
		}}}},
	}
	if _, err := cs.CoreV1().Pods(ns).Create(ctx, pod, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	synced(t, l)
	if runs, err := l.Deltas(ctx); err != nil || len(runs) != 1 || runs[0].Phase != jobs.PhaseRunning || runs[0].ChainEnded != "" {
		t.Fatalf("running delta agent: %+v, %v; want Running without a chain end", runs, err)
	}
	job.Status.Succeeded = 1
	job.Status.Conditions = []batchv1.JobCondition{{Type: batchv1.JobComplete, Status: corev1.ConditionTrue}}
	if _, err := cs.BatchV1().Jobs(ns).UpdateStatus(ctx, job, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	synced(t, l)
	runs, err := l.Deltas(ctx)
	if err != nil || len(runs) != 1 || runs[0].Phase != jobs.PhaseSucceeded || runs[0].ChainEnded != reason || runs[0].Chain != "b1" {
		t.Fatalf("finished delta agent: %+v, %v; want Succeeded, its chain b1 ended: %q", runs, err, reason)
	}
}
