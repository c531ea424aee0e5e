package jobs

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"strings"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/utils/ptr"

	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/server/config"
)

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
