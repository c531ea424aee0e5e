package jobs

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"maps"
	"strings"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/utils/ptr"

	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/api/agentjob"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/server/config"
)

// runID names the run of one agent: a hash of what it works on.
func runID(parts ...string) string {
	s := sha256.Sum256([]byte(strings.Join(parts, "/")))
	return hex.EncodeToString(s[:])[:16]
}

// selectorOf selects the server's Jobs of kind k.
func selectorOf(k agentjob.Kind) labels.Selector { return labels.SelectorFromSet(k.Labels()) }

// start creates job, signs it and waits for the cache to see it signed.
// A finished Job of the same name (an earlier attempt that ended
// without a result) is replaced; a running one gives ErrRunning.
func (l *Launcher) start(ctx context.Context, job *batchv1.Job) (*batchv1.Job, error) {
	jobs := l.client.BatchV1().Jobs(job.Namespace)
	made, err := jobs.Create(ctx, job, metav1.CreateOptions{})
	if apierrors.IsAlreadyExists(err) {
		// The API's word, not the cache's: it decides a delete.
		old, gerr := jobs.Get(ctx, job.Name, metav1.GetOptions{})
		if gerr != nil {
			return nil, fmt.Errorf("get existing job %s: %w", job.Name, gerr)
		}
		if phase, _ := l.phase(old); phase == PhaseRunning {
			return nil, runningErr(old)
		}
		if err := l.replace(ctx, old); err != nil {
			return nil, err
		}
		made, err = l.createWhenGone(ctx, job)
	}
	if err != nil {
		return nil, fmt.Errorf("create %s job: %w", ClaimsOf(job).Kind, err)
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

// etcdAccess is what an agent that reads target t's etcd needs: its
// endpoints and its client certificate, mounted from TLSSecret.
func etcdAccess(t config.Target, volumes []corev1.Volume, mounts []corev1.VolumeMount) (agentjob.Etcd, []corev1.Volume, []corev1.VolumeMount) {
	e := agentjob.Etcd{Endpoints: t.Endpoints, InsecurePlaintext: t.InsecurePlaintext}
	if t.TLSSecret != "" {
		e.CACert, e.Cert, e.Key = tlsMountPath+"/ca.crt", tlsMountPath+"/tls.crt", tlsMountPath+"/tls.key"
		volumes = append(volumes, corev1.Volume{Name: "etcd-tls", VolumeSource: corev1.VolumeSource{
			// Readable by the agent's group (fsGroup) only.
			Secret: &corev1.SecretVolumeSource{SecretName: t.TLSSecret, DefaultMode: ptr.To[int32](0o440)},
		}})
		mounts = append(mounts, corev1.VolumeMount{Name: "etcd-tls", MountPath: tlsMountPath, ReadOnly: true})
	}
	return e, volumes, mounts
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

// jobMeta says which run of its kind a Job is: its name and namespace,
// the run's ID (labelRun) and the annotations that say what it works on,
// on the Job and its pod alike.
type jobMeta struct {
	name, namespace, run string
	annotations          map[string]string
}

// agentJob is the Job of one run of the kind flags are of, shaped by the
// kind's row of agentjob.Kinds: its labels, how it is retried, its
// deadline and where its agent's last words are. The agent's container
// gets flags as its arguments and mounts, besides volumes, its token for
// the server and the server's CA. A builder adds what its kind alone
// needs (the label of a scheduled run, the delta agent's pod name).
func (l *Launcher) agentJob(meta jobMeta, sc *corev1.PodSecurityContext, flags agentjob.Flags, volumes []corev1.Volume, mounts []corev1.VolumeMount) *batchv1.Job {
	kind := agentjob.Of(flags.Kind())
	volumes, mounts = withServerCA(volumes, mounts)
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
	lbls := kind.Kind.Labels()
	lbls[labelRun] = meta.run
	job := &batchv1.Job{
		ObjectMeta: metav1.ObjectMeta{Name: meta.name, Namespace: meta.namespace, Labels: lbls, Annotations: meta.annotations},
		Spec: batchv1.JobSpec{
			// One attempt: a retry would upload the same backup name again,
			// or find a restore's half-written data directory. The user (or
			// the schedule, or the controller) decides to try again. A
			// long-running kind is restarted in place instead (below).
			BackoffLimit: ptr.To[int32](0),
			// Created suspended: sign lets it run once it carries the
			// server's signature.
			Suspend:                 ptr.To(true),
			ActiveDeadlineSeconds:   ptr.To(int64(l.agents.Deadline.Seconds())),
			TTLSecondsAfterFinished: ptr.To(int32(l.agents.TTLAfterFinished.Seconds())),
			Template: corev1.PodTemplateSpec{
				// The pod's own copy: the downward API reads a pod's
				// annotations, not its Job's.
				ObjectMeta: metav1.ObjectMeta{Labels: maps.Clone(lbls), Annotations: maps.Clone(meta.annotations)},
				Spec: corev1.PodSpec{
					RestartPolicy:                corev1.RestartPolicyNever,
					ServiceAccountName:           l.agents.ServiceAccount,
					AutomountServiceAccountToken: ptr.To(false),
					SecurityContext:              sc,
					Containers: []corev1.Container{{
						Name:                     "agent",
						Image:                    l.agents.Image,
						ImagePullPolicy:          l.agents.ImagePullPolicy,
						Args:                     flags.Args(),
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
	if kind.RetriedWhenDisrupted {
		// A pod that failed because Kubernetes disrupted it — evicted by
		// a node drain, preempted, its node gone — does not count against
		// the one attempt: the Job starts another pod, which takes the
		// backup or the drill again from the start (an evicted backup
		// agent's upload was cut off and stored nothing, so its name is
		// free). Any other failure ends the Job.
		job.Spec.PodFailurePolicy = &batchv1.PodFailurePolicy{Rules: []batchv1.PodFailurePolicyRule{{
			Action:          batchv1.PodFailurePolicyActionIgnore,
			OnPodConditions: []batchv1.PodFailurePolicyOnPodConditionsPattern{{Type: corev1.DisruptionTarget, Status: corev1.ConditionTrue}},
		}}}
	}
	if kind.Restarts > 0 {
		// Long-running: no deadline, restarted in place when it crashes
		// (what it stored says where to resume), a few times.
		job.Spec.ActiveDeadlineSeconds = nil
		job.Spec.BackoffLimit = ptr.To(kind.Restarts)
		job.Spec.Template.Spec.RestartPolicy = corev1.RestartPolicyOnFailure
	}
	if kind.ReadsHost {
		// Root may read what only root may (a kubeadm node's keys) by
		// this one capability; it can change nothing, its mounts being
		// read-only.
		job.Spec.Template.Spec.Containers[0].SecurityContext.Capabilities.Add = []corev1.Capability{"DAC_READ_SEARCH"}
	}
	if kind.Reports {
		// The report (agentjob.Report) is the termination message; the
		// agent exits non-zero when its verdict is a failure, so the Job
		// shows it.
		job.Spec.Template.Spec.Containers[0].TerminationMessagePolicy = corev1.TerminationMessageReadFile
	}
	return job
}

// namespaceOf is where the Jobs of kind k for target t run: the
// namespace t's restores run in for a kind that runs beside the members
// (agentjob.Spec.InRestoreNamespace), else the server's own.
func (l *Launcher) namespaceOf(k agentjob.Kind, t config.Target) string {
	if agentjob.Of(k).InRestoreNamespace {
		return l.RestoreNamespace(t)
	}
	return l.namespace
}

// conn is how the Launcher's agents reach the server: its agent port,
// with the pod's token and the server's CA (agentJob mounts both).
func (l *Launcher) conn() agentjob.Conn {
	return agentjob.Conn{Server: l.agents.ServerAddress, TokenFile: TokenPath, ServerCA: ServerCAPath}
}

// runningErr is ErrRunning for job.
func runningErr(job *batchv1.Job) error {
	return fmt.Errorf("the %s agent's Job %s/%s is %w", ClaimsOf(job).Kind, job.Namespace, job.Name, ErrRunning)
}
