package jobs

import (
	"context"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
)

// ComponentDrill is the component label of restore drill Jobs.
const ComponentDrill = "drill-agent"

// drillSelector selects the server's drill agent Jobs.
var drillSelector = labels.SelectorFromSet(labels.Set{LabelComponent: ComponentDrill, LabelManagedBy: managedBy})

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
}

func drillJobName(location, backup string) string {
	return jobName(jobNameDrill, backup, runID("drill", location, backup))
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
	return l.start(ctx, l.drillJob(spec), "drill")
}

func (l *Launcher) drillJob(spec DrillSpec) *batchv1.Job {
	args := []string{
		"drill",
		"--server=" + l.agents.ServerAddress,
		"--name=" + spec.Backup,
		"--location=" + spec.Location,
		"--sha256=" + spec.SHA256,
		"--scratch-dir=" + workMountPath,
	}
	volumes := []corev1.Volume{{Name: "work", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}}}
	mounts := []corev1.VolumeMount{{Name: "work", MountPath: workMountPath}}
	if spec.IdentitySecret != "" {
		args = append(args, "--identity-dir="+identityMountPath)
		v, m := identityVolume(spec.IdentitySecret)
		volumes, mounts = append(volumes, v), append(mounts, m)
	}
	id := runID("drill", spec.Location, spec.Backup)
	lbls := map[string]string{LabelComponent: ComponentDrill, LabelManagedBy: managedBy, LabelRun: id}
	if spec.Scheduled {
		lbls[LabelScheduled] = "true"
	}
	ann := map[string]string{
		AnnotationBackup: spec.Backup, AnnotationLocation: spec.Location, AnnotationTarget: spec.Target, AnnotationSHA256: spec.SHA256,
	}
	job := l.agentJob(agentSecurityContext(), args, volumes, mounts)
	job.Spec.PodFailurePolicy = replacedWhenDisrupted()
	// The verdict travels in the termination message; the agent exits
	// non-zero when the backup failed the drill, so the Job shows it.
	job.Spec.Template.Spec.Containers[0].TerminationMessagePolicy = corev1.TerminationMessageReadFile
	job.ObjectMeta = metav1.ObjectMeta{Name: drillJobName(spec.Location, spec.Backup), Namespace: l.namespace, Labels: lbls, Annotations: ann}
	job.Spec.Template.ObjectMeta = metav1.ObjectMeta{Labels: lbls, Annotations: ann}
	return job
}

// DrillVerdict is what a drill agent wrote as its termination message
// (agents/drill.Result).
type DrillVerdict struct {
	Succeeded bool          `json:"succeeded"`
	NoVerdict bool          `json:"noVerdict"`
	Revision  int64         `json:"revision"`
	Keys      int64         `json:"keys"`
	HashKV    uint32        `json:"hashKV"`
	Message   string        `json:"message"`
	Duration  time.Duration `json:"duration"`
}

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
	list, err := l.liveJobs(drillSelector, "drill")
	if err != nil {
		return nil, err
	}
	runs := make([]DrillRun, 0, len(list))
	for _, j := range list {
		phase, msg := l.phase(j)
		r := DrillRun{
			Backup: j.Annotations[AnnotationBackup], Location: j.Annotations[AnnotationLocation], Target: j.Annotations[AnnotationTarget],
			SHA256: j.Annotations[AnnotationSHA256], JobName: j.Name, Phase: phase, Message: msg,
			StartTime: j.CreationTimestamp.Time, FinishTime: finishTime(j),
			Scheduled: j.Labels[LabelScheduled] == "true", Counted: j.Annotations[AnnotationCounted] == "true",
		}
		if phase != PhaseRunning {
			r.Verdict = l.drillVerdict(j)
		}
		runs = append(runs, r)
	}
	return runs, nil
}

// drillVerdict reads the verdict the agent's container wrote as its
// termination message; nil when it wrote none (it could not run, or
// reached no verdict).
func (l *Launcher) drillVerdict(j *batchv1.Job) *DrillVerdict {
	var v DrillVerdict
	if l.terminationJSON(j, &v) {
		return &v
	}
	return nil
}
