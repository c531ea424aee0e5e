package jobs

import (
	"cmp"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"

	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/api/agentjob"
)

// Phase of an agent run.
type Phase string

const (
	PhaseRunning   Phase = "Running"
	PhaseSucceeded Phase = "Succeeded"
	PhaseFailed    Phase = "Failed"
)

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
	kind := string(ClaimsOf(j).Kind)
	switch {
	case kind == "":
		kind = "run"
	case agentjob.Of(agentjob.Kind(kind)).Supervised:
		kind += " (the server starts its agent again by itself)"
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

// listRuns reads every Job of kind k in the server's namespace that is
// not being deleted, from the cache, by name: each as a run of type R
// (read), given its phase and what the phase says. read leaves a Job out
// by returning false.
func listRuns[R any](l *Launcher, k agentjob.Kind, read func(j *batchv1.Job, phase Phase, msg string) (R, bool)) ([]R, error) {
	nc, err := l.watched(l.namespace)
	if err != nil {
		return nil, err
	}
	list, err := nc.jobList(selectorOf(k))
	if err != nil {
		return nil, fmt.Errorf("list %s jobs: %w", k, err)
	}
	runs := make([]R, 0, len(list))
	for _, j := range list {
		if j.DeletionTimestamp != nil {
			continue
		}
		phase, msg := l.phase(j)
		if r, ok := read(j, phase, msg); ok {
			runs = append(runs, r)
		}
	}
	return runs, nil
}

// reportOf is the report (agentjob.Report) the agent of j wrote as its
// container's JSON termination message: a drill's or a fold's verdict,
// a delta agent's chain end. Nil when it wrote none (it could not run,
// or reached no verdict).
func reportOf[R any](l *Launcher, j *batchv1.Job) *R {
	for _, p := range l.pods(j) {
		for _, cs := range p.Status.ContainerStatuses {
			t := cs.State.Terminated
			if t == nil || !strings.HasPrefix(strings.TrimSpace(t.Message), "{") {
				continue
			}
			var r R
			if err := json.Unmarshal([]byte(t.Message), &r); err == nil {
				return &r
			}
		}
	}
	return nil
}
