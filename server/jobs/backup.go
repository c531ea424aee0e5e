package jobs

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"sort"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/utils/ptr"

	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/api/agentjob"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/server/config"
)

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

func backupJobName(location, backup string) string {
	return agentjob.Backup.JobName(backup, runID(location, backup))
}

// StartBackup creates the agent Job for spec. A finished, failed Job of the
// same backup is replaced; a running one gives ErrRunning.
func (l *Launcher) StartBackup(ctx context.Context, spec BackupSpec) (*batchv1.Job, error) {
	return l.start(ctx, l.backupJob(spec))
}
func (l *Launcher) backupJob(spec BackupSpec) *batchv1.Job {
	t := spec.Target
	flags := agentjob.BackupFlags{
		Conn: l.conn(), Name: spec.Name, Location: spec.Location, Target: t.Name, Labels: spec.Labels,
		// The agent keeps a copy of the plain snapshot here while it
		// streams, to read the snapshot's own revision, keys and hash at
		// the end.
		ScratchDir:  workMountPath,
		Compression: spec.Compression, EncryptTo: spec.AgeRecipients,
	}
	volumes := []corev1.Volume{{Name: "work", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}}}
	mounts := []corev1.VolumeMount{{Name: "work", MountPath: workMountPath}}
	flags.Etcd, volumes, mounts = etcdAccess(t, volumes, mounts)
	job := l.agentJob(jobMeta{
		name: backupJobName(spec.Location, spec.Name), namespace: l.namespaceOf(agentjob.Backup, t), run: runID(spec.Location, spec.Name),
		annotations: map[string]string{AnnotationBackup: spec.Name, AnnotationLocation: spec.Location, AnnotationTarget: t.Name},
	}, agentSecurityContext(), flags, volumes, mounts)
	if spec.Scheduled {
		markScheduled(job)
	}
	return job
}

// markScheduled labels job, and its pod, as a run the server's schedule
// started (LabelScheduled), so that a restarted server finds it.
func markScheduled(job *batchv1.Job) {
	job.Labels[LabelScheduled] = "true"
	job.Spec.Template.Labels[LabelScheduled] = "true"
}

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

// List returns the runs of every backup agent Job in the namespace, by
// Job name, from the cache. A Job being deleted is left out, and so is a
// finished Job whose backup was forgotten (ForgetBackup).
func (l *Launcher) List(ctx context.Context) ([]Run, error) {
	return listRuns(l, agentjob.Backup, func(j *batchv1.Job, phase Phase, msg string) (Run, bool) {
		return Run{
			Name: j.Annotations[AnnotationBackup], Location: j.Annotations[AnnotationLocation], Target: j.Annotations[AnnotationTarget],
			Phase: phase, Message: msg, StartTime: j.CreationTimestamp.Time, JobName: j.Name,
			Scheduled: j.Labels[LabelScheduled] == "true", FinishTime: finishTime(j),
			Counted: j.Annotations[AnnotationCounted] == "true",
		}, phase == PhaseRunning || j.Annotations[AnnotationForgotten] != "true"
	})
}

// finishTime is when j ended: its completion time, or its terminal

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
