// Package jobs launches the backup agent as a Kubernetes Job in the
// server's namespace and reads the state of those Jobs back, so the request
// layer can show a backup as Running or Failed before (or instead of) it
// being stored. A Job runs under the agents' own ServiceAccount, which has
// no API permissions, and mounts only the target's TLS Secret: no storage
// credential and no secret value ever appears in its spec.
package jobs

import (
	"cmp"
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"slices"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/time/rate"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"

	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/server/config"
)

// Labels and annotations on the Jobs this package creates.
const (
	LabelComponent     = "app.kubernetes.io/component"
	LabelManagedBy     = "app.kubernetes.io/managed-by"
	LabelRun           = "etcdbackup.io/run"
	AnnotationBackup   = "etcdbackup.io/backup"
	AnnotationLocation = "etcdbackup.io/location"
	AnnotationTarget   = "etcdbackup.io/target"
	// AnnotationSHA256 pins a restore Job to the content it restores.
	AnnotationSHA256 = "etcdbackup.io/sha256"
	// LabelScheduled marks the Job of a scheduled backup ("true").
	LabelScheduled = "etcdbackup.io/scheduled"
	// AnnotationCounted marks a finished Job whose outcome the server has
	// counted in its metrics, so a restarted server does not count it
	// again.
	AnnotationCounted = "etcdbackup.io/counted"
	// AnnotationForgotten marks the Job of a backup removed from storage
	// while its agent still ran (ForgetBackup): once it finishes, List
	// leaves it out.
	AnnotationForgotten = "etcdbackup.io/forgotten"

	// ComponentBackup and ComponentRestore are LabelComponent's values.
	ComponentBackup  = "backup-agent"
	ComponentRestore = "restore-agent"
	// ManagedBy is LabelManagedBy's value on every agent Job the server
	// creates: the agent guard admits only pods of such Jobs.
	ManagedBy = "etcdbackup-server"

	componentBackup  = ComponentBackup
	componentRestore = ComponentRestore
	managedBy        = ManagedBy
	// tlsMountPath is where the target's TLS Secret appears in the agent.
	tlsMountPath = "/etc/etcdbackup/etcd-tls"
)

// The agent's credential towards the server: a projected ServiceAccount
// token for the server alone (its audience), bound to the agent's pod,
// short-lived and rotated by the kubelet. It is the pod's only token
// (AutomountServiceAccountToken is off).
const (
	// TokenAudience is the audience of agent tokens; the server's
	// TokenReview asks for exactly it, so a token for the API server or
	// anyone else is refused.
	TokenAudience = "etcdbackup"
	// TokenExpirationSeconds is the token's lifetime; the kubelet renews
	// it at 80%.
	TokenExpirationSeconds = 600
	// TokenDir is where the token volume is mounted in the agent.
	TokenDir = "/var/run/secrets/etcdbackup.io/agent"
	// TokenPath is the token file the agent reads before every call.
	TokenPath = TokenDir + "/token"
)

// Launcher creates agent Jobs, and reads them, their pods and their
// events from informers' caches (Start; see cache.go).
type Launcher struct {
	client kubernetes.Interface
	// namespace is the server's own; backup Jobs are created there.
	namespace string
	agents    config.Agents
	startMu   sync.Mutex
	caches    atomic.Pointer[caches]
	// publishCA is SetServerCAPublisher's.
	publishCA func(ctx context.Context, namespace string) error
	// signer signs the Jobs this Launcher creates and tells its own
	// from forged ones (sign.go).
	signer atomic.Pointer[Signer]
	// serverPod names the server's pod (SetServerPod).
	serverPod atomic.Pointer[string]
	// leases are the delta Leases' client and last writes (deltalease.go).
	leases deltaLeases
}

// New returns a Launcher that creates Jobs in namespace (the server's own)
// as agents says, with its defaults filled in.
func New(client kubernetes.Interface, namespace string, agents config.Agents) (*Launcher, error) {
	switch {
	case namespace == "":
		return nil, errors.New("agent jobs: the server's namespace is unknown (set POD_NAMESPACE from the downward API)")
	case agents.Image == "":
		return nil, errors.New("agent jobs: no agent image configured")
	}
	l := &Launcher{client: client, namespace: namespace, agents: agents.WithDefaults(namespace)}
	// Until LoadSigningKey, a key of this process's own: its Jobs are
	// signed, but another process does not recognise them.
	l.signer.Store(newRandomSigner())
	return l, nil
}

// LoadSigningKey makes the Launcher sign and check Jobs with the key in
// Secret SigningKeySecret of the server's namespace, creating it if need
// be (LoadSigner): Jobs signed before a restart keep working after it.
// The server calls it once at start, before it creates or admits any.
func (l *Launcher) LoadSigningKey(ctx context.Context) error {
	s, err := LoadSigner(ctx, l.client, l.namespace)
	if err != nil {
		return err
	}
	l.signer.Store(s)
	return nil
}

// RefreshSigningKey reads the signing key's Secret again and uses what it
// holds from now on: a key rotated by hand, or a new one made here when
// the Secret is gone — deleted to rotate it, or removed by a restore of
// the cluster (snapshot.RevokeServerKeys), since every backup of the
// cluster holds the key. Jobs signed with the old key are refused from
// then on. It says whether the key changed; on an error the key in
// force is kept.
func (l *Launcher) RefreshSigningKey(ctx context.Context) (bool, error) {
	s, err := LoadSigner(ctx, l.client, l.namespace)
	if err != nil {
		return false, err
	}
	if cur := l.signer.Load(); cur != nil && hmac.Equal(cur.key, s.key) {
		return false, nil
	}
	l.signer.Store(s)
	return true, nil
}

// FollowSigningKey calls RefreshSigningKey every interval until ctx ends,
// logging a change and an error (at most once a minute).
func (l *Launcher) FollowSigningKey(ctx context.Context, interval time.Duration, log *slog.Logger) {
	t := time.NewTicker(interval)
	defer t.Stop()
	failing := rate.Sometimes{Interval: time.Minute}
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		changed, err := l.RefreshSigningKey(ctx)
		switch {
		case err != nil && ctx.Err() == nil:
			failing.Do(func() {
				log.Warn("cannot read the Job-signing key again; the one in force is kept", "error", err.Error())
			})
		case changed:
			log.Warn("the Job-signing key changed (Secret "+SigningKeySecret+" was replaced, or removed by a restore of this cluster and made anew): agent Jobs signed before are refused from now on",
				"namespace", l.namespace)
		}
	}
}

// Signer is what signs and checks the Launcher's Jobs.
func (l *Launcher) Signer() *Signer { return l.signer.Load() }

// Verify checks j's signature with the key in force (Signer.Verify).
func (l *Launcher) Verify(j *batchv1.Job) error { return l.Signer().Verify(j) }

// Signed says whether j carries the server's signature (Signer.Verify).
func (l *Launcher) Signed(j *batchv1.Job) bool { return l.Signer().Verify(j) == nil }

// sign annotates made, a Job just created suspended, with its signature
// and lets it run: no pod of it exists before it is signed, so none
// calls the server before the guard can admit it. The patch is bound to
// made's UID. A Job that cannot be signed is deleted, since it could
// never run.
func (l *Launcher) sign(ctx context.Context, made *batchv1.Job) (*batchv1.Job, error) {
	sig := l.Signer().Sign(ClaimsOf(made))
	patch, err := json.Marshal(map[string]any{
		"metadata": map[string]any{"uid": made.UID, "annotations": map[string]string{AnnotationSignature: sig}},
		"spec":     map[string]any{"suspend": false},
	})
	if err != nil {
		return nil, err
	}
	signed, err := l.client.BatchV1().Jobs(made.Namespace).Patch(ctx, made.Name, types.MergePatchType, patch, metav1.PatchOptions{})
	if err != nil {
		derr := l.client.BatchV1().Jobs(made.Namespace).Delete(context.WithoutCancel(ctx), made.Name,
			metav1.DeleteOptions{Preconditions: &metav1.Preconditions{UID: &made.UID}, PropagationPolicy: ptr.To(metav1.DeletePropagationBackground)})
		if derr != nil && !apierrors.IsNotFound(derr) {
			return nil, fmt.Errorf("sign job %s/%s: %w (and deleting the unsigned, suspended Job failed: %v)", made.Namespace, made.Name, err, derr)
		}
		return nil, fmt.Errorf("sign job %s/%s: %w", made.Namespace, made.Name, err)
	}
	return signed, nil
}

// signedVersion is the await condition of signing j: the cache has j
// with its signature.
func signedVersion(j *batchv1.Job) func(*batchv1.Job) bool {
	return func(c *batchv1.Job) bool {
		return c != nil && c.UID == j.UID && c.Annotations[AnnotationSignature] == j.Annotations[AnnotationSignature]
	}
}

// NewInCluster returns a Launcher that talks to the API server with the
// pod's service account; namespace "" is the pod's own.
func NewInCluster(namespace string, agents config.Agents) (*Launcher, error) {
	if namespace == "" {
		b, err := os.ReadFile("/var/run/secrets/kubernetes.io/serviceaccount/namespace")
		if err != nil {
			return nil, errors.New("agents are configured but the server's namespace is unknown: set --namespace or POD_NAMESPACE")
		}
		namespace = strings.TrimSpace(string(b))
	}
	rc, err := rest.InClusterConfig()
	if err != nil {
		return nil, fmt.Errorf("agents are configured, so the server needs the Kubernetes API: %w", err)
	}
	kc, err := kubernetes.NewForConfig(rc)
	if err != nil {
		return nil, fmt.Errorf("agents: Kubernetes client: %w", err)
	}
	return New(kc, namespace, agents)
}

// BackupSpec is one backup to take.
type BackupSpec struct {
	Name, Location, Compression string
	Labels                      map[string]string
	Target                      config.Target
	// AgeRecipients, when set, are the public keys the agent encrypts to
	// (not secrets: they go in the Job's args).
	AgeRecipients []string
	// Scheduled marks a run the server's schedule started: its Job is
	// labelled LabelScheduled, so a restarted server finds it.
	Scheduled bool
}

// ErrRunning is returned when an agent for that backup is still running.
var ErrRunning = errors.New("a backup agent for this backup is still running")

// runID names the run of one agent: a hash of what it works on.
func runID(parts ...string) string {
	s := sha256.Sum256([]byte(strings.Join(parts, "/")))
	return hex.EncodeToString(s[:])[:16]
}

// The kinds of agent Job, as their names start (jobName): one list, so
// that whatever knows agent Jobs by name (the Job cache's event filter)
// knows every kind.
const (
	jobNameBackup  = "backup"
	jobNameRestore = "restore"
	jobNameDrill   = "drill"
	jobNameDelta   = "delta"
	jobNameFold    = "fold"
)

var jobNameKinds = []string{jobNameBackup, jobNameRestore, jobNameDrill, jobNameDelta, jobNameFold}

// jobName is a Job name from kind, a readable hint and the run's ID: Job
// names are DNS labels of at most 63 characters, backup names may be 200
// and member names are whatever etcd accepts. The hint is cut to 30
// characters and what a DNS label cannot hold becomes a dash.
func jobName(kind, hint, id string) string {
	if len(hint) > 30 {
		hint = hint[:30]
	}
	hint = strings.Trim(strings.Map(func(r rune) rune {
		switch {
		case r >= 'a' && r <= 'z', r >= '0' && r <= '9':
			return r
		case r >= 'A' && r <= 'Z':
			return r - 'A' + 'a'
		}
		return '-'
	}, hint), "-")
	return kind + "-" + hint + "-" + id[:10]
}

func backupJobName(location, backup string) string {
	return jobName(jobNameBackup, backup, runID(location, backup))
}

// CheckTarget verifies that what the target's Job would mount exists.
func (l *Launcher) CheckTarget(ctx context.Context, t config.Target) error {
	if t.TLSSecret == "" {
		return nil
	}
	_, err := l.client.CoreV1().Secrets(l.namespace).Get(ctx, t.TLSSecret, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return fmt.Errorf("target %q: its TLS Secret %s/%s does not exist; create it with keys ca.crt, tls.crt and tls.key (the etcd client certificate)",
			t.Name, l.namespace, t.TLSSecret)
	}
	if err != nil {
		return fmt.Errorf("target %q: check TLS Secret %s/%s: %w", t.Name, l.namespace, t.TLSSecret, err)
	}
	return nil
}

// StartBackup creates the agent Job for spec. A finished, failed Job of the
// same backup is replaced; a running one gives ErrRunning.
func (l *Launcher) StartBackup(ctx context.Context, spec BackupSpec) (*batchv1.Job, error) {
	return l.start(ctx, l.backupJob(spec), "backup")
}

// start creates job, signs it and waits for the cache to see it signed.
// A finished Job of the same name (an earlier attempt that ended
// without a result) is replaced; a running one gives ErrRunning.
func (l *Launcher) start(ctx context.Context, job *batchv1.Job, kind string) (*batchv1.Job, error) {
	jobs := l.client.BatchV1().Jobs(job.Namespace)
	made, err := jobs.Create(ctx, job, metav1.CreateOptions{})
	if apierrors.IsAlreadyExists(err) {
		// The API's word, not the cache's: it decides a delete.
		old, gerr := jobs.Get(ctx, job.Name, metav1.GetOptions{})
		if gerr != nil {
			return nil, fmt.Errorf("get existing job %s: %w", job.Name, gerr)
		}
		if phase, _ := l.phase(old); phase == PhaseRunning {
			return nil, ErrRunning
		}
		if err := l.replace(ctx, old); err != nil {
			return nil, err
		}
		made, err = l.createWhenGone(ctx, job)
	}
	if err != nil {
		return nil, fmt.Errorf("create %s job: %w", kind, err)
	}
	if made, err = l.sign(ctx, made); err != nil {
		return nil, err
	}
	l.await(ctx, made.Namespace, made.Name, signedVersion(made))
	return made, nil
}

// replace deletes a finished Job that a new one of the same name
// replaces, and waits for the cache to see it go.
func (l *Launcher) replace(ctx context.Context, old *batchv1.Job) error {
	err := l.client.BatchV1().Jobs(old.Namespace).Delete(ctx, old.Name, metav1.DeleteOptions{PropagationPolicy: ptr.To(metav1.DeletePropagationForeground)})
	if apierrors.IsNotFound(err) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("replace finished job %s: %w", old.Name, err)
	}
	l.await(ctx, old.Namespace, old.Name, gone(old))
	return nil
}

// createWhenGone retries Create while a deleted Job with the same name is
// still being removed.
func (l *Launcher) createWhenGone(ctx context.Context, job *batchv1.Job) (*batchv1.Job, error) {
	var created *batchv1.Job
	err := wait.PollUntilContextCancel(ctx, 200*time.Millisecond, true, func(ctx context.Context) (bool, error) {
		var err error
		created, err = l.client.BatchV1().Jobs(job.Namespace).Create(ctx, job, metav1.CreateOptions{})
		if apierrors.IsAlreadyExists(err) {
			return false, nil
		}
		return true, err
	})
	if err != nil {
		return nil, err
	}
	return created, nil
}

// replacedWhenDisrupted is the pod failure policy of agents that only
// read etcd or a backup (backups, drills): a pod that failed because
// Kubernetes disrupted it — evicted by a node drain, preempted, its node
// gone — does not count against the one attempt, and the Job starts
// another pod, which takes the backup or the drill again from the start.
// An evicted backup agent's upload was cut off and stored nothing, so its
// name is free for the new pod. Any other failure ends the Job.
func replacedWhenDisrupted() *batchv1.PodFailurePolicy {
	return &batchv1.PodFailurePolicy{Rules: []batchv1.PodFailurePolicyRule{{
		Action:          batchv1.PodFailurePolicyActionIgnore,
		OnPodConditions: []batchv1.PodFailurePolicyOnPodConditionsPattern{{Type: corev1.DisruptionTarget, Status: corev1.ConditionTrue}},
	}}}
}

func (l *Launcher) backupJob(spec BackupSpec) *batchv1.Job {
	t := spec.Target
	args := []string{
		"backup",
		"--server=" + l.agents.ServerAddress,
		"--name=" + spec.Name,
		"--location=" + spec.Location,
		"--target=" + t.Name,
	}
	for _, k := range sortedKeys(spec.Labels) {
		args = append(args, "--labels="+k+"="+spec.Labels[k])
	}
	// The agent keeps a copy of the plain snapshot here while it streams,
	// to read the snapshot's own revision, keys and hash at the end.
	args = append(args, "--scratch-dir="+workMountPath)
	volumes := []corev1.Volume{{Name: "work", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}}}
	mounts := []corev1.VolumeMount{{Name: "work", MountPath: workMountPath}}
	args, volumes, mounts = withEtcdAccess(t, spec.Compression, spec.AgeRecipients, args, volumes, mounts)
	id := runID(spec.Location, spec.Name)
	labels := map[string]string{LabelComponent: componentBackup, LabelManagedBy: managedBy, LabelRun: id}
	if spec.Scheduled {
		labels[LabelScheduled] = "true"
	}
	job := l.agentJob(agentSecurityContext(), args, volumes, mounts)
	job.Spec.PodFailurePolicy = replacedWhenDisrupted()
	job.ObjectMeta = metav1.ObjectMeta{
		Name:      backupJobName(spec.Location, spec.Name),
		Namespace: l.namespace,
		Labels:    labels,
		Annotations: map[string]string{
			AnnotationBackup: spec.Name, AnnotationLocation: spec.Location, AnnotationTarget: t.Name,
		},
	}
	job.Spec.Template.ObjectMeta = metav1.ObjectMeta{Labels: labels, Annotations: map[string]string{
		AnnotationBackup: spec.Name, AnnotationLocation: spec.Location, AnnotationTarget: t.Name,
	}}
	return job
}

// withEtcdAccess adds what an agent that reads target t's etcd needs:
// its endpoints, its client certificate (mounted from TLSSecret) and how
// to encode what it stores.
func withEtcdAccess(t config.Target, compression string, recipients []string, args []string, volumes []corev1.Volume, mounts []corev1.VolumeMount) ([]string, []corev1.Volume, []corev1.VolumeMount) {
	args = append(args, "--endpoints="+strings.Join(t.Endpoints, ","))
	if compression != "" {
		args = append(args, "--compression="+compression)
	}
	for _, r := range recipients {
		args = append(args, "--encrypt-to="+r)
	}
	if t.TLSSecret != "" {
		args = append(args,
			"--cacert="+tlsMountPath+"/ca.crt",
			"--cert="+tlsMountPath+"/tls.crt",
			"--key="+tlsMountPath+"/tls.key")
		volumes = append(volumes, corev1.Volume{Name: "etcd-tls", VolumeSource: corev1.VolumeSource{
			// Readable by the agent's group (fsGroup) only.
			Secret: &corev1.SecretVolumeSource{SecretName: t.TLSSecret, DefaultMode: ptr.To[int32](0o440)},
		}})
		mounts = append(mounts, corev1.VolumeMount{Name: "etcd-tls", MountPath: tlsMountPath, ReadOnly: true})
	}
	if t.InsecurePlaintext {
		args = append(args, "--insecure-plaintext")
	}
	return args, volumes, mounts
}

// agentSecurityContext is the agents' own: uid and gid 65532, not root.
func agentSecurityContext() *corev1.PodSecurityContext {
	return &corev1.PodSecurityContext{
		RunAsNonRoot:   ptr.To(true),
		RunAsUser:      ptr.To[int64](65532),
		RunAsGroup:     ptr.To[int64](65532),
		FSGroup:        ptr.To[int64](65532),
		SeccompProfile: &corev1.SeccompProfile{Type: corev1.SeccompProfileTypeRuntimeDefault},
	}
}

// agentJob is what backup and restore Jobs share; the caller names it and
// sets its labels.
func (l *Launcher) agentJob(sc *corev1.PodSecurityContext, args []string, volumes []corev1.Volume, mounts []corev1.VolumeMount) *batchv1.Job {
	args = append(args, "--token-file="+TokenPath)
	args, volumes, mounts = withServerCA(args, volumes, mounts)
	volumes = append(volumes, corev1.Volume{Name: "etcdbackup-token", VolumeSource: corev1.VolumeSource{
		Projected: &corev1.ProjectedVolumeSource{
			// Readable by the agent's group (fsGroup) only.
			DefaultMode: ptr.To[int32](0o440),
			Sources: []corev1.VolumeProjection{{ServiceAccountToken: &corev1.ServiceAccountTokenProjection{
				Audience: TokenAudience, ExpirationSeconds: ptr.To[int64](TokenExpirationSeconds), Path: "token",
			}}},
		},
	}})
	mounts = append(mounts, corev1.VolumeMount{Name: "etcdbackup-token", MountPath: TokenDir, ReadOnly: true})
	for i := range volumes {
		// A scratch volume without a bound could fill the node's disk
		// (a crafted backup that unpacks without end); with one, the
		// kubelet evicts the agent instead.
		if e := volumes[i].EmptyDir; e != nil && e.SizeLimit == nil && l.agents.ScratchSizeLimit != nil {
			e.SizeLimit = ptr.To(l.agents.ScratchSizeLimit.DeepCopy())
		}
	}
	var resources corev1.ResourceRequirements
	if l.agents.Resources != nil {
		resources = *l.agents.Resources.DeepCopy()
	}
	return &batchv1.Job{
		Spec: batchv1.JobSpec{
			// One attempt: a retry would upload the same backup name again,
			// or find a restore's half-written data directory. The user (or
			// the schedule) decides to try again. Backups and drills are
			// retried only when the pod was disrupted (replacedWhenDisrupted).
			BackoffLimit: ptr.To[int32](0),
			// Created suspended: sign lets it run once it carries the
			// server's signature.
			Suspend:                 ptr.To(true),
			ActiveDeadlineSeconds:   ptr.To(int64(l.agents.Deadline.Seconds())),
			TTLSecondsAfterFinished: ptr.To(int32(l.agents.TTLAfterFinished.Seconds())),
			Template: corev1.PodTemplateSpec{
				Spec: corev1.PodSpec{
					RestartPolicy:                corev1.RestartPolicyNever,
					ServiceAccountName:           l.agents.ServiceAccount,
					AutomountServiceAccountToken: ptr.To(false),
					SecurityContext:              sc,
					Containers: []corev1.Container{{
						Name:                     "agent",
						Image:                    l.agents.Image,
						ImagePullPolicy:          l.agents.ImagePullPolicy,
						Args:                     args,
						VolumeMounts:             mounts,
						Resources:                resources,
						TerminationMessagePolicy: corev1.TerminationMessageFallbackToLogsOnError,
						SecurityContext: &corev1.SecurityContext{
							AllowPrivilegeEscalation: ptr.To(false),
							ReadOnlyRootFilesystem:   ptr.To(true),
							Capabilities:             &corev1.Capabilities{Drop: []corev1.Capability{"ALL"}},
						},
					}},
					Volumes: volumes,
				},
			},
		},
	}
}

// Phase of an agent run.
type Phase string

const (
	PhaseRunning   Phase = "Running"
	PhaseSucceeded Phase = "Succeeded"
	PhaseFailed    Phase = "Failed"
)

// Run is what the cluster says about one backup's agent.
type Run struct {
	Name, Location, Target string
	Phase                  Phase
	// Message says why a run failed.
	Message   string
	StartTime time.Time
	JobName   string
	// Scheduled is a run the server's schedule started.
	Scheduled bool
	// FinishTime is when a finished run ended (zero while it runs).
	FinishTime time.Time
	// Counted is a finished run the server has counted (MarkCounted).
	Counted bool
}

// backupSelector selects the server's backup agent Jobs.
var backupSelector = labels.SelectorFromSet(labels.Set{LabelComponent: componentBackup, LabelManagedBy: managedBy})

// List returns the runs of every backup agent Job in the namespace, by
// Job name, from the cache. A Job being deleted is left out, and so is a
// finished Job whose backup was forgotten (ForgetBackup).
func (l *Launcher) List(ctx context.Context) ([]Run, error) {
	list, err := l.liveJobs(backupSelector, "backup")
	if err != nil {
		return nil, err
	}
	runs := make([]Run, 0, len(list))
	for _, j := range list {
		phase, msg := l.phase(j)
		if phase != PhaseRunning && j.Annotations[AnnotationForgotten] == "true" {
			continue
		}
		runs = append(runs, Run{
			Name: j.Annotations[AnnotationBackup], Location: j.Annotations[AnnotationLocation], Target: j.Annotations[AnnotationTarget],
			Phase: phase, Message: msg, StartTime: j.CreationTimestamp.Time, JobName: j.Name,
			Scheduled: j.Labels[LabelScheduled] == "true", FinishTime: finishTime(j),
			Counted: j.Annotations[AnnotationCounted] == "true",
		})
	}
	return runs, nil
}

// finishTime is when j ended: its completion time, or its terminal
// condition's transition; zero while it runs.
func finishTime(j *batchv1.Job) time.Time {
	if j.Status.CompletionTime != nil {
		return j.Status.CompletionTime.Time
	}
	for _, c := range j.Status.Conditions {
		if c.Status == corev1.ConditionTrue && (c.Type == batchv1.JobFailed || c.Type == batchv1.JobComplete) {
			return c.LastTransitionTime.Time
		}
	}
	return time.Time{}
}

// MarkCounted annotates a finished Job as counted (AnnotationCounted).
func (l *Launcher) MarkCounted(ctx context.Context, jobName string) error {
	patch := []byte(`{"metadata":{"annotations":{"` + AnnotationCounted + `":"true"}}}`)
	_, err := l.client.BatchV1().Jobs(l.namespace).Patch(ctx, jobName, types.MergePatchType, patch, metav1.PatchOptions{})
	if err != nil {
		return fmt.Errorf("mark job %s counted: %w", jobName, err)
	}
	l.await(ctx, l.namespace, jobName, func(j *batchv1.Job) bool { return j == nil || j.Annotations[AnnotationCounted] == "true" })
	return nil
}

// ForgetBackup is called once backup (location, name) is removed from
// storage — deleted, or by retention — so that its agent Job does not
// bring it back: List shows a finished Job whose backup is not stored as
// a failed run, and a finished Job outlives its backup by up to
// ttlAfterFinished. A finished Job is deleted, with its pods (their
// logs are of a backup that no longer exists). A running one is left
// to run — deleting it would kill an agent that may be uploading — and
// annotated (AnnotationForgotten) instead: if its agent stores the
// backup after all, storage lists it; if the agent had stored it just
// before the removal and is still exiting, List leaves its Job out once
// it has finished, as it does a failed one. No Job, nothing to do.
//
// Whether the Job runs is asked of the API, not the cache, and the
// delete or annotation is made on condition that the Job is still that
// one (its UID): a Job of a new backup of the same name, started
// meanwhile, is not touched. Without a Job in the cache the API is not
// asked at all (a Job created since is running).
func (l *Launcher) ForgetBackup(ctx context.Context, location, name string) error {
	jobName := backupJobName(location, name)
	if nc, err := l.watched(l.namespace); err == nil {
		if j, err := nc.job(jobName); err == nil && j == nil {
			return nil
		}
	}
	jobs := l.client.BatchV1().Jobs(l.namespace)
	j, err := jobs.Get(ctx, jobName, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("get backup job %s: %w", jobName, err)
	}
	if j.DeletionTimestamp != nil || j.Annotations[AnnotationBackup] != name || j.Annotations[AnnotationLocation] != location {
		return nil
	}
	if JobPhase(j) == PhaseRunning {
		meta := map[string]any{"annotations": map[string]string{AnnotationForgotten: "true"}}
		if j.UID != "" {
			meta["uid"] = j.UID // a precondition: the API refuses another Job's
		}
		patch, err := json.Marshal(map[string]any{"metadata": meta})
		if err != nil {
			return err
		}
		_, err = jobs.Patch(ctx, jobName, types.MergePatchType, patch, metav1.PatchOptions{})
		if apierrors.IsNotFound(err) || apierrors.IsConflict(err) {
			return nil
		}
		if err != nil {
			return fmt.Errorf("mark job %s of removed backup %q: %w", jobName, name, err)
		}
		l.await(ctx, l.namespace, jobName, func(c *batchv1.Job) bool {
			return c == nil || c.UID != j.UID || c.Annotations[AnnotationForgotten] == "true"
		})
		return nil
	}
	opts := metav1.DeleteOptions{PropagationPolicy: ptr.To(metav1.DeletePropagationBackground)}
	if j.UID != "" {
		opts.Preconditions = &metav1.Preconditions{UID: &j.UID}
	}
	err = jobs.Delete(ctx, jobName, opts)
	if apierrors.IsNotFound(err) || apierrors.IsConflict(err) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("delete job %s of removed backup %q: %w", jobName, name, err)
	}
	l.await(ctx, l.namespace, jobName, gone(j))
	return nil
}

// JobPhase is where j stands: Running until a terminal condition.
func JobPhase(j *batchv1.Job) Phase {
	p, _ := jobPhase(j)
	return p
}

func jobPhase(j *batchv1.Job) (Phase, string) {
	for _, c := range j.Status.Conditions {
		if c.Status != corev1.ConditionTrue {
			continue
		}
		switch c.Type {
		case batchv1.JobComplete, batchv1.JobSuccessCriteriaMet:
			return PhaseSucceeded, ""
		case batchv1.JobFailed, batchv1.JobFailureTarget:
			return PhaseFailed, strings.TrimSpace(c.Reason + ": " + c.Message)
		}
	}
	return PhaseRunning, ""
}

// phase is where j stands: jobPhase, except that a Job whose pod the API
// refuses to create is Failed with the API's reason (the Job controller
// would retry until the deadline, showing it Running), and a failed Job
// carries the agent's last words when it has them.
func (l *Launcher) phase(j *batchv1.Job) (Phase, string) {
	p, msg := jobPhase(j)
	switch p {
	case PhaseRunning:
		if r := l.refusal(j); r != "" {
			return PhaseFailed, r
		}
		if r := l.stuck(j, time.Now()); r != "" {
			return PhaseFailed, r
		}
	case PhaseFailed:
		if m := l.failureMessage(j); m != "" {
			msg = m
		}
	}
	return p, msg
}

// stuckAfter is how long an agent pod may wait for its image or its
// volumes before the run is reported failed: long enough for a registry's
// hiccup to pass at the kubelet's next try (10 s later), short enough that
// `backup --wait` says within a minute what is wrong.
const stuckAfter = 40 * time.Second

// stuck is why j's pod cannot start and will not by itself, or "": its
// image cannot be pulled (an air-gapped install's image not mirrored),
// or a Secret or ConfigMap it mounts or reads does not exist. The kubelet
// retries these until the Job's deadline, an hour or more; nothing the
// server or the agent does helps, so a pod waiting so for stuckAfter is
// reported failed at once, naming what is missing and what to do. Should
// the cause be fixed meanwhile, the pod starts and the Job is Running
// again.
func (l *Launcher) stuck(j *batchv1.Job, now time.Time) string {
	nc, err := l.watched(j.Namespace)
	if err != nil {
		return ""
	}
	kind := ClaimsOf(j).Kind
	switch kind {
	case KindDelta, KindFold:
		kind += " (the server starts its agent again by itself)"
	case "":
		kind = "run"
	}
	for _, p := range nc.podsOf(j.Name) {
		if p.Status.Phase != corev1.PodPending || p.DeletionTimestamp != nil || now.Sub(p.CreationTimestamp.Time) < stuckAfter {
			continue
		}
		images := map[string]string{}
		for _, c := range append(slices.Clone(p.Spec.InitContainers), p.Spec.Containers...) {
			images[c.Name] = c.Image
		}
		for _, cs := range append(slices.Clone(p.Status.InitContainerStatuses), p.Status.ContainerStatuses...) {
			w := cs.State.Waiting
			if w == nil {
				continue
			}
			switch w.Reason {
			case "ErrImagePull", "ImagePullBackOff", "InvalidImageName", "ErrImageNeverPull":
				return fmt.Sprintf("the agent image %s cannot be pulled on node %s (%s: %s): make it pullable there (mirror it into a registry the nodes reach, add an imagePullSecret to ServiceAccount %s), or set the image the server runs agents with (agents.image in its config, else its %s init container), then start the %s again",
					images[cs.Name], cmp.Or(p.Spec.NodeName, "?"), w.Reason, strings.TrimSpace(w.Message), p.Spec.ServiceAccountName, AgentImageContainer, kind)
			case "CreateContainerConfigError":
				return fmt.Sprintf("the agent's container cannot be created: %s; create what it names in namespace %s, then start the %s again", strings.TrimSpace(w.Message), j.Namespace, kind)
			}
		}
		for _, e := range nc.eventsOf("Pod", p.Name) {
			if e.InvolvedObject.UID == p.UID && e.Reason == "FailedMount" && strings.Contains(e.Message, "not found") {
				return fmt.Sprintf("a volume of the agent's pod cannot be mounted: %s; create it in namespace %s (or correct the server's config that names it), then start the %s again",
					strings.TrimSpace(e.Message), j.Namespace, kind)
			}
		}
	}
	return ""
}

// refusal is why the API refuses to create j's pod, or "". The evidence is
// the Job controller's FailedCreate event for this Job (its UID: a Job
// replaced under the same name keeps its events for an hour) with a
// "forbidden" reason — Pod Security admission, a quota, a missing
// ServiceAccount — while the Job has no pod at all. The controller retries
// such creates, but none of those causes goes away by itself, so the Job
// is reported failed at once; should a retry succeed, the Job has a pod
// and is Running again. Events not (yet) cached are no evidence.
func (l *Launcher) refusal(j *batchv1.Job) string {
	if j.Status.Active > 0 || j.Status.Succeeded > 0 || j.Status.Failed > 0 {
		return ""
	}
	nc, err := l.watched(j.Namespace)
	if err != nil {
		return ""
	}
	var last *corev1.Event
	for _, e := range nc.eventsOf("Job", j.Name) {
		if e.InvolvedObject.UID != j.UID || e.Reason != "FailedCreate" || !strings.Contains(e.Message, "forbidden") {
			continue
		}
		if last == nil || eventTime(last).Before(eventTime(e)) {
			last = e
		}
	}
	if last == nil {
		return ""
	}
	msg := "the API refuses to create the agent's pod: " + strings.TrimPrefix(last.Message, "Error creating: ")
	if strings.Contains(last.Message, "PodSecurity") {
		msg += fmt.Sprintf("; namespace %s must admit it (label pod-security.kubernetes.io/enforce=privileged for hostPath volumes: see manifests/restore-namespace/)", j.Namespace)
	}
	return msg
}

// failureMessage is the agent's own last words: its container's
// termination message (the end of its log, by FallbackToLogsOnError).
func (l *Launcher) failureMessage(j *batchv1.Job) string {
	pods := l.pods(j)
	if len(pods) == 0 {
		return ""
	}
	for _, cs := range pods[0].Status.ContainerStatuses {
		if t := cs.State.Terminated; t != nil {
			if t.Reason == "OOMKilled" {
				// Its last words are whatever it logged before the kill,
				// which says nothing of why it stopped.
				return fmt.Sprintf("agent exited with code %d: the agent was OOM-killed (memory limit %s): raise agents.resources.limits.memory in the server's config",
					t.ExitCode, memoryLimit(j, pods[0], cs.Name))
			}
			msg := strings.TrimSpace(t.Message)
			if i := strings.LastIndex(msg, "\n"); i >= 0 {
				msg = strings.TrimSpace(msg[i+1:])
			}
			if msg == "" {
				return fmt.Sprintf("agent exited with code %d (%s)", t.ExitCode, t.Reason)
			}
			return fmt.Sprintf("agent exited with code %d: %s", t.ExitCode, msg)
		}
	}
	return ""
}

// memoryLimit is the memory limit of container name of pod (of j's pod
// template when the pod does not say), "none" when it has none.
func memoryLimit(j *batchv1.Job, pod *corev1.Pod, name string) string {
	for _, containers := range [][]corev1.Container{pod.Spec.Containers, j.Spec.Template.Spec.Containers} {
		for _, c := range containers {
			if c.Name != name {
				continue
			}
			if q, ok := c.Resources.Limits[corev1.ResourceMemory]; ok {
				return q.String()
			}
			return "none"
		}
	}
	return "none"
}

// pods returns the Job's pods, newest first, from the cache.
func (l *Launcher) pods(j *batchv1.Job) []*corev1.Pod {
	nc, err := l.watched(j.Namespace)
	if err != nil {
		return nil
	}
	return nc.podsOf(j.Name)
}

// ErrNoRun is returned by Logs when no agent ran for that backup.
var ErrNoRun = errors.New("no backup agent ran for this backup")

// Logs writes the log of the agent of backup (location, name) to w. With
// follow it waits for the pod to start and streams until the agent ends.
// The Job and its pod come from the cache; the log from the API.
func (l *Launcher) Logs(ctx context.Context, location, name string, follow bool, w io.Writer) error {
	j, err := l.cachedBackupJob(location, name)
	if err != nil {
		return err
	}
	// Until the pod has started there is no log to read: wait for it
	// when following, else there is nothing to show yet.
	var pod *corev1.Pod
	err = wait.PollUntilContextCancel(ctx, 500*time.Millisecond, true, func(ctx context.Context) (bool, error) {
		pods := l.pods(j)
		if len(pods) > 0 && podStarted(pods[0]) {
			pod = pods[0]
			return true, nil
		}
		return !follow, nil
	})
	if err != nil || pod == nil {
		return err
	}
	req := l.client.CoreV1().Pods(l.namespace).GetLogs(pod.Name, &corev1.PodLogOptions{Container: "agent", Follow: follow})
	rc, err := req.Stream(ctx)
	if err != nil {
		return fmt.Errorf("stream log of agent pod %s: %w", pod.Name, err)
	}
	defer rc.Close()
	_, err = io.Copy(w, rc)
	return err
}

// cachedBackupJob returns the agent Job of backup (location, name) from
// the cache; ErrNoRun if there is none.
func (l *Launcher) cachedBackupJob(location, name string) (*batchv1.Job, error) {
	nc, err := l.watched(l.namespace)
	if err != nil {
		return nil, err
	}
	j, err := nc.job(backupJobName(location, name))
	if err != nil {
		return nil, fmt.Errorf("get backup job: %w", err)
	}
	if j == nil {
		return nil, ErrNoRun
	}
	return j, nil
}

func podStarted(p *corev1.Pod) bool {
	for _, cs := range p.Status.ContainerStatuses {
		if cs.State.Running != nil || cs.State.Terminated != nil {
			return true
		}
	}
	return false
}

func sortedKeys(m map[string]string) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}

// Events returns the Kubernetes events of the agent Job of backup
// (location, name) and of its pods, oldest first, with the Job's
// "NAMESPACE/NAME". ErrNoRun when no such Job exists. All from the cache.
func (l *Launcher) Events(ctx context.Context, location, name string) (string, []corev1.Event, error) {
	j, err := l.cachedBackupJob(location, name)
	if err != nil {
		return "", nil, err
	}
	nc, err := l.watched(j.Namespace)
	if err != nil {
		return "", nil, err
	}
	jobName := j.Namespace + "/" + j.Name
	if ok, _ := nc.synced(nc.events); !ok {
		return jobName, nil, nc.unreadable(nc.events)
	}
	found := nc.eventsOf("Job", j.Name)
	for _, p := range l.pods(j) {
		found = append(found, nc.eventsOf("Pod", p.Name)...)
	}
	out := make([]corev1.Event, 0, len(found))
	for _, e := range found {
		out = append(out, *e.DeepCopy())
	}
	sort.Slice(out, func(a, b int) bool {
		if ta, tb := eventTime(&out[a]), eventTime(&out[b]); !ta.Equal(tb) {
			return ta.Before(tb)
		}
		return out[a].Name < out[b].Name
	})
	return jobName, out, nil
}

// eventTime is when an event (last) happened, whichever API wrote it.
func eventTime(e *corev1.Event) time.Time {
	switch {
	case !e.LastTimestamp.IsZero():
		return e.LastTimestamp.Time
	case !e.EventTime.IsZero():
		return e.EventTime.Time
	}
	return e.CreationTimestamp.Time
}

// SetServerPod names the server's own pod, which the server's Events
// (ServerEvent) are about; without it they are not recorded.
func (l *Launcher) SetServerPod(name string) { l.serverPod.Store(&name) }

// ServerEvent records a Warning Event about the server's pod, for what
// went wrong in the server's own work (a scheduled run that could not
// start): `kubectl describe pod` and `kubectl get events` show it. A
// failure is returned for the caller to log; nothing waits on it.
func (l *Launcher) ServerEvent(ctx context.Context, reason, message string) error {
	p := l.serverPod.Load()
	if p == nil || *p == "" {
		return errors.New("the server's pod is unknown (POD_NAME), so no Event is recorded")
	}
	now := metav1.Now()
	_, err := l.client.CoreV1().Events(l.namespace).Create(ctx, &corev1.Event{
		ObjectMeta:     metav1.ObjectMeta{GenerateName: *p + ".", Namespace: l.namespace},
		InvolvedObject: corev1.ObjectReference{Kind: "Pod", APIVersion: "v1", Namespace: l.namespace, Name: *p},
		Type:           corev1.EventTypeWarning, Reason: reason, Message: message,
		Source:         corev1.EventSource{Component: managedBy},
		FirstTimestamp: now, LastTimestamp: now, Count: 1,
	}, metav1.CreateOptions{})
	if err != nil {
		return fmt.Errorf("record event %s: %w", reason, err)
	}
	return nil
}
