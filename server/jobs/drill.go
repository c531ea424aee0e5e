package jobs

import (
	"context"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"

	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/api/agentjob"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/server/config"
)

// DrillSpec is one backup to drill.
type DrillSpec struct {
	Backup, Location, Target string
	// SHA256 pins the drill to the content the server asked about.
	SHA256 string
	// IdentitySecret names a Secret in the server's namespace with age
	// identity files, for an encrypted backup.
	IdentitySecret string
	// Scheduled marks a drill the target's drill schedule started.
	Scheduled bool
	// SnapshotBytes is the plain snapshot's size, which sizes the agent's
	// memory limit (sizeMemoryFor); 0 if unknown.
	SnapshotBytes int64
}

func drillJobName(location, backup string) string {
	return agentjob.Drill.JobName(backup, runID("drill", location, backup))
}

// StartDrill creates the drill agent Job for spec in the server's
// namespace. A finished Job of an earlier drill of the backup is
// replaced; a running one gives ErrRunning.
//
// A drill of an encrypted target's backup first checks the identity
// Secret (CheckIdentitySecret): a missing or empty one is an error
// wrapping ErrIdentitySecret, and no Job is created.
func (l *Launcher) StartDrill(ctx context.Context, spec DrillSpec) (*batchv1.Job, error) {
	if spec.IdentitySecret != "" {
		if err := l.CheckIdentitySecret(ctx, spec.IdentitySecret, "drill"); err != nil {
			return nil, err
		}
	}
	return l.start(ctx, l.drillJob(spec))
}

func (l *Launcher) drillJob(spec DrillSpec) *batchv1.Job {
	flags := agentjob.DrillFlags{Conn: l.conn(), Name: spec.Backup, Location: spec.Location, SHA256: spec.SHA256, ScratchDir: workMountPath}
	volumes := []corev1.Volume{{Name: "work", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}}}
	mounts := []corev1.VolumeMount{{Name: "work", MountPath: workMountPath}}
	if spec.IdentitySecret != "" {
		flags.IdentityDir = identityMountPath
		v, m := identityVolume(spec.IdentitySecret)
		volumes, mounts = append(volumes, v), append(mounts, m)
	}
	job := l.agentJob(jobMeta{
		name: drillJobName(spec.Location, spec.Backup), namespace: l.namespaceOf(agentjob.Drill, config.Target{Name: spec.Target}), run: runID("drill", spec.Location, spec.Backup),
		annotations: map[string]string{
			AnnotationBackup: spec.Backup, AnnotationLocation: spec.Location, AnnotationTarget: spec.Target, AnnotationSHA256: spec.SHA256,
		},
	}, agentSecurityContext(), flags, volumes, mounts)
	if spec.Scheduled {
		markScheduled(job)
	}
	l.sizeMemoryFor(job, spec.SnapshotBytes)
	return job
}

// DrillVerdict is what a drill agent reports.
type DrillVerdict = agentjob.DrillVerdict

// DrillRun is what the cluster says about one drill agent.
type DrillRun struct {
	Backup, Location, Target, SHA256, JobName string
	Phase                                     Phase
	StartTime, FinishTime                     time.Time
	Scheduled                                 bool
	// Counted is a finished drill whose verdict the server recorded.
	Counted bool
	// Verdict is the agent's, when it reached one; Message says why a
	// finished drill has none.
	Verdict *DrillVerdict
	Message string
}

// Drills returns every drill agent Job in the server's namespace, from
// the cache.
func (l *Launcher) Drills(ctx context.Context) ([]DrillRun, error) {
	return listRuns(l, agentjob.Drill, func(j *batchv1.Job, phase Phase, msg string) (DrillRun, bool) {
		r := DrillRun{
			Backup: j.Annotations[AnnotationBackup], Location: j.Annotations[AnnotationLocation], Target: j.Annotations[AnnotationTarget],
			SHA256: j.Annotations[AnnotationSHA256], JobName: j.Name, Phase: phase, Message: msg,
			StartTime: j.CreationTimestamp.Time, FinishTime: finishTime(j),
			Scheduled: j.Labels[LabelScheduled] == "true", Counted: j.Annotations[AnnotationCounted] == "true",
		}
		if phase != PhaseRunning {
			r.Verdict = reportOf[DrillVerdict](l, j)
		}
		return r, true
	})
}
