//go:build linux

package nodeagent

import (
	"fmt"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
)

// computeStatus is the Pod status a kubelet would report now (after
// generateAPIPodStatus and getPhase, without sidecars and resize).
func (w *podWorker) computeStatus(pod *corev1.Pod) corev1.PodStatus {
	st := corev1.PodStatus{
		HostIP:             w.a.cfg.HostIP,
		HostIPs:            []corev1.HostIP{{IP: w.a.cfg.HostIP}},
		StartTime:          w.startTime,
		ObservedGeneration: pod.Generation,
	}
	if w.ip.IsValid() {
		st.PodIP = w.ip.String()
		st.PodIPs = []corev1.PodIP{{IP: st.PodIP}}
	}
	initPending := false
	initFailedForGood := false
	var notInitialized []string
	for i := range pod.Spec.InitContainers {
		c := &pod.Spec.InitContainers[i]
		cs := w.containers[c.Name]
		s := containerStatus(c, cs, "PodInitializing")
		st.InitContainerStatuses = append(st.InitContainerStatuses, s)
		if s.State.Terminated != nil && s.State.Terminated.ExitCode == 0 {
			continue
		}
		initPending = true
		notInitialized = append(notInitialized, c.Name)
		if s.State.Terminated != nil && !shouldRestart(pod.Spec.RestartPolicy, true, s.State.Terminated.ExitCode) {
			initFailedForGood = true
		}
	}
	running, waiting, stopped, succeeded := 0, 0, 0, 0
	var notReady []string
	for i := range pod.Spec.Containers {
		c := &pod.Spec.Containers[i]
		cs := w.containers[c.Name]
		waitReason := "ContainerCreating"
		if initPending {
			waitReason = "PodInitializing"
		}
		s := containerStatus(c, cs, waitReason)
		st.ContainerStatuses = append(st.ContainerStatuses, s)
		if !s.Ready {
			notReady = append(notReady, c.Name)
		}
		switch {
		case s.State.Running != nil:
			running++
		case s.State.Terminated != nil:
			stopped++
			if s.State.Terminated.ExitCode == 0 {
				succeeded++
			}
		case s.LastTerminationState.Terminated != nil:
			stopped++
		default:
			waiting++
		}
	}

	switch {
	case initFailedForGood:
		st.Phase = corev1.PodFailed
	case initPending || waiting > 0:
		st.Phase = corev1.PodPending
	case running > 0:
		st.Phase = corev1.PodRunning
	case stopped > 0 && w.killed:
		// Deleted: terminal, whatever the restart policy.
		st.Phase = corev1.PodSucceeded
		if stopped != succeeded {
			st.Phase = corev1.PodFailed
		}
	case stopped > 0:
		switch {
		case pod.Spec.RestartPolicy == corev1.RestartPolicyAlways || pod.Spec.RestartPolicy == "":
			st.Phase = corev1.PodRunning
		case stopped == succeeded:
			st.Phase = corev1.PodSucceeded
		case pod.Spec.RestartPolicy == corev1.RestartPolicyNever:
			st.Phase = corev1.PodFailed
		default:
			st.Phase = corev1.PodRunning
		}
	default:
		st.Phase = corev1.PodPending
	}
	// A Pod counted as Running while all its containers wait for a restart
	// that can no longer happen (deleted, or terminal) is not.
	terminal := st.Phase == corev1.PodSucceeded || st.Phase == corev1.PodFailed

	ready := st.Phase == corev1.PodRunning && len(notReady) == 0
	for _, gate := range pod.Spec.ReadinessGates {
		if !conditionTrue(pod.Status.Conditions, gate.ConditionType) {
			ready = false
		}
	}
	cond := func(t corev1.PodConditionType, ok bool, reason, message string) corev1.PodCondition {
		status := corev1.ConditionFalse
		if ok {
			status = corev1.ConditionTrue
			reason, message = "", ""
		}
		prev, found := w.condTimes[t]
		if !found || prev.status != status {
			prev = condTime{status: status, at: metav1.Now()}
			w.condTimes[t] = prev
		}
		return corev1.PodCondition{Type: t, Status: status, Reason: reason, Message: message, LastTransitionTime: prev.at, ObservedGeneration: pod.Generation}
	}
	unready := fmt.Sprintf("containers with unready status: [%s]", strings.Join(notReady, " "))
	readyReason := "ContainersNotReady"
	if terminal {
		readyReason = "PodCompleted"
	}
	st.Conditions = []corev1.PodCondition{
		cond(corev1.PodReadyToStartContainers, w.ns != nil, "", ""),
		cond(corev1.PodInitialized, !initPending || terminal && !initFailedForGood, "ContainersNotInitialized",
			fmt.Sprintf("containers with incomplete status: [%s]", strings.Join(notInitialized, " "))),
		cond(corev1.ContainersReady, ready, readyReason, unready),
		cond(corev1.PodReady, ready, readyReason, unready),
	}
	if terminal {
		st.Conditions[2].Message, st.Conditions[3].Message = "", ""
		if ready {
			st.Conditions[2].Reason, st.Conditions[3].Reason = "", ""
		}
	}
	return st
}

// containerStatus reports one container; cs is nil for one never seen.
func containerStatus(c *corev1.Container, cs *containerState, waitReason string) corev1.ContainerStatus {
	s := corev1.ContainerStatus{
		Name:    c.Name,
		Image:   c.Image,
		ImageID: "sandbox://" + ImageName(c.Image),
		Started: ptr.To(false),
	}
	if cs == nil {
		s.State.Waiting = &corev1.ContainerStateWaiting{Reason: waitReason}
		return s
	}
	s.RestartCount = cs.restartCount
	if cs.run != nil {
		s.ContainerID = "sandbox://" + cs.run.id
	}
	switch {
	case cs.run != nil && !cs.exited:
		s.State.Running = &corev1.ContainerStateRunning{StartedAt: metav1.NewTime(cs.run.startedAt)}
		s.LastTerminationState.Terminated = cs.lastTerm
		s.Started = ptr.To(cs.started || cs.spec.StartupProbe == nil)
		s.Ready = cs.ready || (cs.spec.ReadinessProbe == nil && *s.Started)
	case cs.term != nil && cs.restartPending:
		s.State.Waiting = &corev1.ContainerStateWaiting{
			Reason:  "CrashLoopBackOff",
			Message: fmt.Sprintf("back-off %s restarting failed container=%s", cs.delay, c.Name),
		}
		s.LastTerminationState.Terminated = cs.term
	case cs.term != nil:
		s.State.Terminated = cs.term
		s.LastTerminationState.Terminated = cs.lastTerm
	default:
		reason := cs.waitingReason
		if reason == "" {
			reason = waitReason
		}
		s.State.Waiting = &corev1.ContainerStateWaiting{Reason: reason, Message: cs.waitingMessage}
		s.LastTerminationState.Terminated = cs.lastTerm
	}
	return s
}

func conditionTrue(conds []corev1.PodCondition, t corev1.PodConditionType) bool {
	for _, c := range conds {
		if c.Type == t {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

// ownConditions are the condition types the kubelet owns; others (such as
// PodScheduled from the scheduler) are kept as they are.
var ownConditions = []corev1.PodConditionType{corev1.PodReadyToStartContainers, corev1.PodInitialized, corev1.ContainersReady, corev1.PodReady}

// mergeStatus puts the agent's status over cur, keeping what other
// components own: their conditions, QoS class, nominated node, resize and
// resource-claim state.
func mergeStatus(cur, own corev1.PodStatus) corev1.PodStatus {
	out := cur
	out.Phase = own.Phase
	out.Message, out.Reason = own.Message, own.Reason
	out.HostIP, out.HostIPs = own.HostIP, own.HostIPs
	out.PodIP, out.PodIPs = own.PodIP, own.PodIPs
	if cur.StartTime != nil {
		out.StartTime = cur.StartTime
	} else {
		out.StartTime = own.StartTime
	}
	out.InitContainerStatuses = own.InitContainerStatuses
	out.ContainerStatuses = own.ContainerStatuses
	out.ObservedGeneration = own.ObservedGeneration
	var conds []corev1.PodCondition
	for _, c := range cur.Conditions {
		if !slices.Contains(ownConditions, c.Type) {
			conds = append(conds, c)
		}
	}
	out.Conditions = append(conds, own.Conditions...)
	return out
}
