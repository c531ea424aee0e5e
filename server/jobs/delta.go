package jobs

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/utils/ptr"

	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/server/config"
)

// ComponentDelta is the component label of delta agent Jobs.
const ComponentDelta = "delta-agent"

// KindDelta is a delta agent Job, as JobClaims name it.
const KindDelta = "delta"

// deltaSelector selects the server's delta agent Jobs.
var deltaSelector = labels.SelectorFromSet(labels.Set{LabelComponent: ComponentDelta, LabelManagedBy: managedBy})

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
	return jobName(jobNameDelta, target, runID("delta", target, chain))
}

// StartDelta creates the delta agent Job of spec in the server's
// namespace. Unlike the other agents it runs until it is stopped (a new
// chain replaces it) or its chain ends; a crashed agent is restarted in
// its pod, and resumes where the stored chain ends.
func (l *Launcher) StartDelta(ctx context.Context, spec DeltaSpec) (*batchv1.Job, error) {
	return l.start(ctx, l.deltaJob(spec), "delta")
}

func (l *Launcher) deltaJob(spec DeltaSpec) *batchv1.Job {
	t := spec.Target
	args := []string{
		"delta",
		"--server=" + l.agents.ServerAddress,
		"--target=" + t.Name,
		"--chain=" + spec.Chain,
		"--location=" + spec.Location,
		"--period=" + spec.Period.String(),
		"--max-bytes=" + strconv.FormatInt(spec.MaxBytes, 10),
	}
	args, volumes, mounts := withEtcdAccess(t, spec.Compression, spec.AgeRecipients, args, nil, nil)
	lbls := map[string]string{LabelComponent: ComponentDelta, LabelManagedBy: managedBy, LabelRun: runID("delta", t.Name, spec.Chain)}
	ann := map[string]string{AnnotationBackup: spec.Chain, AnnotationLocation: spec.Location, AnnotationTarget: t.Name}
	job := l.agentJob(agentSecurityContext(), args, volumes, mounts)
	job.ObjectMeta = metav1.ObjectMeta{Name: deltaJobName(t.Name, spec.Chain), Namespace: l.namespace, Labels: lbls, Annotations: ann}
	job.Spec.Template.ObjectMeta = metav1.ObjectMeta{Labels: lbls, Annotations: ann}
	// Long-running: no deadline, restarted in place when it crashes (the
	// stored chain says where to resume), a few times.
	job.Spec.ActiveDeadlineSeconds = nil
	job.Spec.BackoffLimit = ptr.To[int32](6)
	pod := &job.Spec.Template.Spec
	pod.RestartPolicy = corev1.RestartPolicyOnFailure
	// The agent holds its Lease through the server (deltalease.go): like
	// every agent, it has no token for the API server.
	// Time to store what it holds when it is stopped.
	pod.TerminationGracePeriodSeconds = ptr.To[int64](60)
	c := &pod.Containers[0]
	c.TerminationMessagePolicy = corev1.TerminationMessageReadFile
	c.Env = append(c.Env, corev1.EnvVar{Name: "POD_NAME", ValueFrom: &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{FieldPath: "metadata.name"}}})
	return job
}

// DeltaRun is what the cluster says about one delta agent.
type DeltaRun struct {
	Target, Chain, Location, JobName string
	Phase                            Phase
	StartTime, FinishTime            time.Time
	Message                          string
}

// Deltas returns every delta agent Job in the server's namespace, from the
// cache.
func (l *Launcher) Deltas(ctx context.Context) ([]DeltaRun, error) {
	list, err := l.liveJobs(deltaSelector, "delta")
	if err != nil {
		return nil, err
	}
	runs := make([]DeltaRun, 0, len(list))
	for _, j := range list {
		phase, msg := l.phase(j)
		r := DeltaRun{
			Target: j.Annotations[AnnotationTarget], Chain: j.Annotations[AnnotationBackup], Location: j.Annotations[AnnotationLocation],
			JobName: j.Name, Phase: phase, Message: msg, StartTime: j.CreationTimestamp.Time, FinishTime: finishTime(j),
		}
		runs = append(runs, r)
	}
	return runs, nil
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
