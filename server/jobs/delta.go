package jobs

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/api/agentjob"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/server/config"
)

// DeltaLeaseName is the Lease, in the server's namespace, that a target's
// delta agent must hold to store segments: one writer per target, and
// the Lease's transitions are the fencing epoch recorded in every
// segment.
func DeltaLeaseName(target string) string { return "etcdbackup-delta-" + target }

// DeltaSpec is one chain to capture: the changes of Target's etcd after
// the full backup Chain, whose snapshot is at FromRevision (the agent
// asks the server where the stored chain ends, and starts there).
type DeltaSpec struct {
	Target          config.Target
	Chain, Location string
	FromRevision    int64
	Compression     string
	AgeRecipients   []string
	Period          time.Duration
	MaxBytes        int64
}

func deltaJobName(target, chain string) string {
	return agentjob.Delta.JobName(target, runID("delta", target, chain))
}

// StartDelta creates the delta agent Job of spec in the server's
// namespace. Unlike the other agents it runs until it is stopped (a new
// chain replaces it) or its chain ends; a crashed agent is restarted in
// its pod, and resumes where the stored chain ends.
func (l *Launcher) StartDelta(ctx context.Context, spec DeltaSpec) (*batchv1.Job, error) {
	return l.start(ctx, l.deltaJob(spec))
}

func (l *Launcher) deltaJob(spec DeltaSpec) *batchv1.Job {
	t := spec.Target
	flags := agentjob.DeltaFlags{
		Conn: l.conn(), Target: t.Name, Chain: spec.Chain, Location: spec.Location, Period: spec.Period, MaxBytes: spec.MaxBytes,
		Compression: spec.Compression, EncryptTo: spec.AgeRecipients,
	}
	var volumes []corev1.Volume
	var mounts []corev1.VolumeMount
	flags.Etcd, volumes, mounts = etcdAccess(t, volumes, mounts)
	job := l.agentJob(jobMeta{
		name: deltaJobName(t.Name, spec.Chain), namespace: l.namespaceOf(agentjob.Delta, t), run: runID("delta", t.Name, spec.Chain),
		annotations: map[string]string{AnnotationBackup: spec.Chain, AnnotationLocation: spec.Location, AnnotationTarget: t.Name},
	}, agentSecurityContext(), flags, volumes, mounts)
	pod := &job.Spec.Template.Spec
	// The agent holds its Lease through the server (deltalease.go): like
	// every agent, it has no token for the API server. It needs time to
	// store what it holds when it is stopped, and its pod's name, which
	// starts its Lease holder identity.
	pod.TerminationGracePeriodSeconds = ptr.To[int64](60)
	c := &pod.Containers[0]
	c.Env = append(c.Env, corev1.EnvVar{Name: "POD_NAME", ValueFrom: &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{FieldPath: "metadata.name"}}})
	return job
}

// DeltaRun is what the cluster says about one delta agent.
type DeltaRun struct {
	Target, Chain, Location, JobName string
	Phase                            Phase
	StartTime, FinishTime            time.Time
	Message                          string
	// ChainEnded is why the agent's chain ended, as the agent reported
	// it (agentjob.DeltaEnd) when it finished; "" when it did not end
	// its chain (stopped, or still running).
	ChainEnded string
}

// Deltas returns every delta agent Job in the server's namespace, from the
// cache.
func (l *Launcher) Deltas(ctx context.Context) ([]DeltaRun, error) {
	return listRuns(l, agentjob.Delta, func(j *batchv1.Job, phase Phase, msg string) (DeltaRun, bool) {
		r := DeltaRun{
			Target: j.Annotations[AnnotationTarget], Chain: j.Annotations[AnnotationBackup], Location: j.Annotations[AnnotationLocation],
			JobName: j.Name, Phase: phase, Message: msg, StartTime: j.CreationTimestamp.Time, FinishTime: finishTime(j),
		}
		if phase != PhaseRunning {
			if end := reportOf[agentjob.DeltaEnd](l, j); end != nil {
				r.ChainEnded = end.ChainEnded
			}
		}
		return r, true
	})
}

// StopDelta deletes a delta agent's Job; its pod gets SIGTERM, stores what
// it holds and releases the Lease.
func (l *Launcher) StopDelta(ctx context.Context, jobName string) error {
	err := l.client.BatchV1().Jobs(l.namespace).Delete(ctx, jobName, metav1.DeleteOptions{PropagationPolicy: ptr.To(metav1.DeletePropagationBackground)})
	if apierrors.IsNotFound(err) {
		return nil
	}
	return err
}

// ErrNotDeltaWriter is a segment from an agent that does not hold its
// target's delta Lease, or held it in an earlier epoch.
var ErrNotDeltaWriter = errors.New("not the target's delta writer")

// CheckDeltaWriter says whether the agent in pod holds target's delta
// Lease now, in epoch: the fence that keeps a deposed or hand-started
// agent from storing segments. It reads the Lease from the API server,
// not a cache: a stale view would let a deposed writer through.
func (l *Launcher) CheckDeltaWriter(ctx context.Context, target, pod string, epoch, chainEpoch int64) error {
	name := DeltaLeaseName(target)
	lease, err := l.leaseClient().CoordinationV1().Leases(l.namespace).Get(ctx, name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return fmt.Errorf("%w: Lease %s/%s does not exist", ErrNotDeltaWriter, l.namespace, name)
	}
	if err != nil {
		return fmt.Errorf("read Lease %s/%s: %w", l.namespace, name, err)
	}
	s := lease.Spec
	holder := ptr.Deref(s.HolderIdentity, "")
	switch {
	case holder == "" || !strings.HasPrefix(holder, pod+"_"):
		return fmt.Errorf("%w: Lease %s/%s is held by %q, not by pod %s", ErrNotDeltaWriter, l.namespace, name, holder, pod)
	case WriterEpoch(ptr.Deref(s.LeaseTransitions, 0), chainEpoch) != epoch:
		return fmt.Errorf("%w: the segment is of epoch %d but Lease %s/%s is in epoch %d (its transitions %d, the chain's epoch %d)", ErrNotDeltaWriter, epoch, l.namespace, name,
			WriterEpoch(ptr.Deref(s.LeaseTransitions, 0), chainEpoch), ptr.Deref(s.LeaseTransitions, 0), chainEpoch)
	case s.RenewTime == nil || s.LeaseDurationSeconds == nil ||
		time.Now().After(s.RenewTime.Add(time.Duration(*s.LeaseDurationSeconds)*time.Second)):
		return fmt.Errorf("%w: Lease %s/%s expired (last renewed %v)", ErrNotDeltaWriter, l.namespace, name, s.RenewTime)
	}
	return nil
}

// WriterEpoch is the fencing epoch of the holder of a delta Lease with
// transitions, writing a chain whose newest segment has chainEpoch: the
// transitions, or the chain's epoch when the Lease was re-created (its
// transitions start at 0 again), so that epochs never go back along a
// chain. The holder check, not the epoch, fences a deposed writer.
func WriterEpoch(transitions int32, chainEpoch int64) int64 {
	return max(int64(transitions), chainEpoch)
}
