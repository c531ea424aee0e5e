package jobs

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/utils/ptr"

	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/api/agentjob"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/server/config"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/server/schedule"
)

// AnnotationFoldInputs holds, as JSON (FoldInputs), the chain a fold Job
// reads: its full backup and segments, each pinned to its SHA-256. The
// Job's signature covers it; the agent reads it from a file the downward
// API mounts, and the server lets the agent download exactly these.
const AnnotationFoldInputs = "etcdbackup.io/fold-inputs"

// MaxFoldSegments is the most segments one fold Job reads
// (agentjob.MaxFoldSegments).
const MaxFoldSegments = agentjob.MaxFoldSegments

// foldInputsDir and foldInputsFile are where the inputs annotation
// appears in the agent.
const (
	foldInputsDir  = "/etc/etcdbackup/fold"
	foldInputsFile = "inputs.json"
)

// FoldRef is a stored backup or segment a fold reads, and the SHA-256 it
// must have.
type FoldRef = agentjob.Ref

// FoldInputs is the chain a fold Job replays, as its AnnotationFoldInputs
// holds it and its agent reads it.
type FoldInputs = agentjob.FoldInputs

// ParseFoldInputs reads AnnotationFoldInputs' value and checks it.
func ParseFoldInputs(s string) (FoldInputs, error) {
	in, err := agentjob.DecodeFoldInputs(strings.NewReader(s))
	if err != nil {
		return in, fmt.Errorf("annotation %s: %w", AnnotationFoldInputs, err)
	}
	return in, nil
}

// FoldSpec is one chain to fold into Backup, a new full backup of Target
// in Location (where the chain is).
type FoldSpec struct {
	Target           config.Target
	Backup, Location string
	Inputs           FoldInputs
	Compression      string
	AgeRecipients    []string
	// IdentitySecret names a Secret in the server's namespace with age
	// identity files, for an encrypted chain.
	IdentitySecret string
	// SnapshotBytes is the plain size of the full and its segments
	// together, which sizes the agent's memory limit (sizeMemoryFor); 0
	// if unknown.
	SnapshotBytes int64
}

// FoldName is the name of the full backup a fold of target's chain to
// revision stores.
func FoldName(target string, revision int64) string {
	return schedule.FoldName(target, revision)
}

func foldJobName(location, backup string) string {
	return agentjob.Fold.JobName(backup, runID("fold", location, backup))
}

// StartFold creates the fold agent Job of spec in the server's namespace.
// A finished Job of an earlier fold to the same revision is replaced; a
// running one gives ErrRunning.
// An identity Secret is checked first, as StartDrill checks it.
func (l *Launcher) StartFold(ctx context.Context, spec FoldSpec) (*batchv1.Job, error) {
	if spec.IdentitySecret != "" {
		if err := l.CheckIdentitySecret(ctx, spec.IdentitySecret, "deltas"); err != nil {
			return nil, err
		}
	}
	job, err := l.foldJob(spec)
	if err != nil {
		return nil, err
	}
	return l.start(ctx, job)
}

func (l *Launcher) foldJob(spec FoldSpec) (*batchv1.Job, error) {
	if err := spec.Inputs.Validate(); err != nil {
		return nil, fmt.Errorf("fold of chain %q: %w", spec.Inputs.Full.Name, err)
	}
	inputs, err := json.Marshal(spec.Inputs)
	if err != nil {
		return nil, err
	}
	t := spec.Target
	flags := agentjob.FoldFlags{
		Conn: l.conn(), Target: t.Name, Name: spec.Backup, Location: spec.Location,
		InputsFile: foldInputsDir + "/" + foldInputsFile, ScratchDir: workMountPath,
		Compression: spec.Compression, EncryptTo: spec.AgeRecipients,
	}
	volumes := []corev1.Volume{
		{Name: "work", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}},
		// The inputs as the signed annotation holds them: the pod reads
		// what the server vouched for, not a copy in its arguments.
		{Name: "fold-inputs", VolumeSource: corev1.VolumeSource{DownwardAPI: &corev1.DownwardAPIVolumeSource{
			DefaultMode: ptr.To[int32](0o440),
			Items: []corev1.DownwardAPIVolumeFile{{
				Path:     foldInputsFile,
				FieldRef: &corev1.ObjectFieldSelector{FieldPath: "metadata.annotations['" + AnnotationFoldInputs + "']"},
			}},
		}}},
	}
	mounts := []corev1.VolumeMount{
		{Name: "work", MountPath: workMountPath},
		{Name: "fold-inputs", MountPath: foldInputsDir, ReadOnly: true},
	}
	if spec.IdentitySecret != "" {
		flags.IdentityDir = identityMountPath
		v, m := identityVolume(spec.IdentitySecret)
		volumes, mounts = append(volumes, v), append(mounts, m)
	}
	// The pod's annotations carry the inputs too (agentJob copies them):
	// the downward API reads the pod's, not the Job's.
	job := l.agentJob(jobMeta{
		name: foldJobName(spec.Location, spec.Backup), namespace: l.namespaceOf(agentjob.Fold, t), run: runID("fold", spec.Location, spec.Backup),
		annotations: map[string]string{
			AnnotationBackup: spec.Backup, AnnotationLocation: spec.Location, AnnotationTarget: t.Name,
			AnnotationFoldInputs: string(inputs),
		},
	}, agentSecurityContext(), flags, volumes, mounts)
	l.sizeMemoryFor(job, spec.SnapshotBytes)
	return job, nil
}

// FoldVerdict is what a fold agent reports.
type FoldVerdict = agentjob.FoldVerdict

// FoldRun is what the cluster says about one fold agent.
type FoldRun struct {
	Target, Backup, Location, Chain, JobName string
	ToRevision                               int64
	Phase                                    Phase
	StartTime, FinishTime                    time.Time
	// Counted is a finished fold the server has logged.
	Counted bool
	// Verdict is the agent's, when it reached one; Message says why a
	// finished fold has none.
	Verdict *FoldVerdict
	Message string
}

// Folds returns every fold agent Job in the server's namespace, from the
// cache.
func (l *Launcher) Folds(ctx context.Context) ([]FoldRun, error) {
	return listRuns(l, agentjob.Fold, func(j *batchv1.Job, phase Phase, msg string) (FoldRun, bool) {
		r := FoldRun{
			Target: j.Annotations[AnnotationTarget], Backup: j.Annotations[AnnotationBackup], Location: j.Annotations[AnnotationLocation],
			JobName: j.Name, Phase: phase, Message: msg, StartTime: j.CreationTimestamp.Time, FinishTime: finishTime(j),
			Counted: j.Annotations[AnnotationCounted] == "true",
		}
		if in, err := ParseFoldInputs(j.Annotations[AnnotationFoldInputs]); err == nil {
			r.Chain, r.ToRevision = in.Full.Name, in.ToRevision
		}
		if phase != PhaseRunning {
			r.Verdict = reportOf[FoldVerdict](l, j)
		}
		return r, true
	})
}
