//go:build linux

package nodeagent

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
)

// Events a pod worker reacts to. Anything may post them; only the worker's
// own goroutine handles them, so the worker's state needs no lock.
type event any

type (
	evPod      struct{} // the Pod object changed (the new one is in w.pod)
	evRemoved  struct{} // the Pod object is gone from the API
	evResync   struct{} // the image table changed
	evServices struct{} // Services changed: hosts file and proxy listeners
	evExit     struct {
		name string
		run  *containerRun
	}
	evProbe struct {
		name  string
		runID string
		kind  probeKind
		ok    bool
	}
)

// Restart back-off, as the kubelet's: the first restart is immediate, then
// 10 s doubling to 5 min; a container that ran 10 min starts over.
const (
	backoffInitial = 10 * time.Second
	backoffMax     = 5 * time.Minute
	backoffReset   = 10 * time.Minute
	// retryDelay is how soon a failed setup step (volume, config, status
	// write) is tried again.
	retryDelay = 2 * time.Second
)

// podWorker runs one Pod (one UID) from its first sighting until its API
// object is gone: the kubelet's pod worker, sandbox and containers.
type podWorker struct {
	a               *Agent
	uid             types.UID
	namespace, name string
	dir             string // state: volumes, hosts file, termination logs
	logDir          string // CRI logs: <ns>_<name>_<uid>/<container>/<restart>.log

	mu      sync.Mutex // guards the fields below it
	pod     *corev1.Pod
	pending []event
	netns   *netNS                   // published for port-forward and Service dials
	views   map[string]containerView // published for the logs endpoint
	wake    chan struct{}            // capacity 1: "something was posted"

	// Everything below is owned by run's goroutine.
	wg           sync.WaitGroup // container waiters, probers, proxy goroutines
	ip           netip.Addr
	ns           *netNS
	proxy        *podProxy
	hostsPath    string
	resolvPath   string
	hostnamePath string
	volumes      map[string]*podVolume
	volumesReady bool
	tokens       []*tokenFile
	containers   map[string]*containerState
	startTime    *metav1.Time
	terminal     bool // Succeeded/Failed: nothing runs or restarts any more
	killed       bool // containers stopped for the Pod's deletion
	deleteDone   bool // the final delete was issued
	removed      bool
	lastStatus   *corev1.PodStatus
	condTimes    map[corev1.PodConditionType]condTime
	reported     map[string]bool // warnings already sent as events
	nextWake     time.Time
}

// containerView is what the logs endpoint may read about a container.
type containerView struct {
	logPath, runID string
	prevLogPath    string
	waitingReason  string
}

type condTime struct {
	status corev1.ConditionStatus
	at     metav1.Time
}

// containerState is the agent's record of one container of the Pod.
type containerState struct {
	spec           corev1.Container
	init           bool
	restartCount   int32
	run            *containerRun // the current or last run
	exited         bool          // the current run's exit was handled
	cancelProbes   context.CancelFunc
	ready, started bool
	waitingReason  string
	waitingMessage string
	term           *corev1.ContainerStateTerminated // the current run's end
	lastTerm       *corev1.ContainerStateTerminated // the run before
	restartPending bool
	restartAt      time.Time
	delay          time.Duration // until restartAt, for the status message
	backoff        time.Duration // the delay after the next exit
	prevLogPath    string
}

func newPodWorker(a *Agent, pod *corev1.Pod) *podWorker {
	return &podWorker{
		a:          a,
		uid:        pod.UID,
		namespace:  pod.Namespace,
		name:       pod.Name,
		dir:        filepath.Join(a.cfg.StateDir, "pods", string(pod.UID)),
		logDir:     filepath.Join(a.cfg.StateDir, "logs", fmt.Sprintf("%s_%s_%s", pod.Namespace, pod.Name, pod.UID)),
		pod:        pod,
		wake:       make(chan struct{}, 1),
		containers: map[string]*containerState{},
		volumes:    map[string]*podVolume{},
		condTimes:  map[corev1.PodConditionType]condTime{},
		reported:   map[string]bool{},
	}
}

func (w *podWorker) setPod(pod *corev1.Pod) {
	w.mu.Lock()
	w.pod = pod
	w.mu.Unlock()
	w.post(evPod{})
}

// post queues an event; it never blocks.
func (w *podWorker) post(e event) {
	w.mu.Lock()
	w.pending = append(w.pending, e)
	w.mu.Unlock()
	select {
	case w.wake <- struct{}{}:
	default:
	}
}

func (w *podWorker) take() (*corev1.Pod, []event) {
	w.mu.Lock()
	defer w.mu.Unlock()
	evs := w.pending
	w.pending = nil
	return w.pod, evs
}

// sandbox is the Pod's network namespace, or nil when it has none.
func (w *podWorker) sandbox() *netNS {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.netns
}

func (w *podWorker) view(container string) (containerView, bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	v, ok := w.views[container]
	return v, ok
}

func (w *podWorker) wakeAt(t time.Time) {
	if w.nextWake.IsZero() || t.Before(w.nextWake) {
		w.nextWake = t
	}
}

func (w *podWorker) logf(format string, args ...any) {
	w.a.cfg.Logf("pod %s/%s: "+format, append([]any{w.namespace, w.name}, args...)...)
}

// run is the worker's goroutine.
func (w *podWorker) run(ctx context.Context) {
	defer w.cleanup()
	w.startTime = ptr.To(metav1.Now())
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	for {
		w.sync(ctx)
		if w.removed || ctx.Err() != nil {
			return
		}
		wait := time.Hour
		if !w.nextWake.IsZero() {
			wait = max(time.Until(w.nextWake), time.Millisecond)
		}
		timer.Reset(wait)
		select {
		case <-ctx.Done():
			return
		case <-w.wake:
		case <-timer.C:
		}
	}
}

func (w *podWorker) sync(ctx context.Context) {
	w.nextWake = time.Time{}
	pod, events := w.take()
	for _, e := range events {
		w.apply(e)
	}
	if w.removed {
		return
	}
	if pod.DeletionTimestamp != nil {
		w.terminate(ctx, pod)
		w.publish()
		return
	}
	if !w.terminal {
		w.reconcile(ctx, pod)
	}
	w.writeStatus(ctx, pod)
	w.publish()
}

func (w *podWorker) apply(e event) {
	switch e := e.(type) {
	case evRemoved:
		w.removed = true
	case evServices:
		w.refreshNetworkConfig()
	case evExit:
		w.handleExit(e.name, e.run)
	case evProbe:
		cs := w.containers[e.name]
		if cs == nil || cs.run == nil || cs.run.id != e.runID || cs.exited {
			return
		}
		switch e.kind {
		case probeReadiness:
			cs.ready = e.ok
		case probeStartup:
			cs.started = cs.started || e.ok
		case probeLiveness:
			if !e.ok {
				w.event(corev1.EventTypeNormal, "Killing", "Container %s failed liveness probe, will be restarted", e.name)
				w.stopRun(cs.run, livenessGrace(w.currentPod(), cs.spec.LivenessProbe))
			}
		}
	}
}

func (w *podWorker) currentPod() *corev1.Pod {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.pod
}

// handleExit records a container's end and decides on its restart.
func (w *podWorker) handleExit(name string, run *containerRun) {
	w.a.unregisterRun(run.id)
	cs := w.containers[name]
	if cs == nil || cs.run != run || cs.exited {
		return
	}
	cs.exited = true
	cs.ready = false
	if cs.cancelProbes != nil {
		cs.cancelProbes()
		cs.cancelProbes = nil
	}
	term := &corev1.ContainerStateTerminated{
		ExitCode:    run.exitCode,
		StartedAt:   metav1.NewTime(run.startedAt),
		FinishedAt:  metav1.NewTime(run.finishedAt),
		ContainerID: "sandbox://" + run.id,
		Reason:      "Completed",
	}
	switch {
	case run.startErr != "":
		term.Reason = "StartError"
		term.Message = run.startErr
		w.event(corev1.EventTypeWarning, "Failed", "Error: %s", run.startErr)
	case run.exitCode != 0:
		term.Reason = "Error"
	}
	if term.Message == "" {
		term.Message = w.terminationMessage(cs, run)
	}
	cs.term = term
	if w.terminal || !shouldRestart(w.currentPod().Spec.RestartPolicy, cs.init, run.exitCode) || w.killed {
		return
	}
	cs.restartPending = true
	if run.finishedAt.Sub(run.startedAt) > backoffReset {
		cs.backoff = 0
	}
	delay := cs.backoff
	cs.backoff = min(max(2*cs.backoff, backoffInitial), backoffMax)
	cs.delay = delay
	cs.restartAt = time.Now().Add(delay)
	if delay > 0 {
		w.event(corev1.EventTypeWarning, "BackOff", "Back-off restarting failed container %s in pod %s_%s(%s)", name, w.name, w.namespace, w.uid)
	}
}

// shouldRestart applies restartPolicy; a succeeded init container is done.
func shouldRestart(policy corev1.RestartPolicy, init bool, exitCode int32) bool {
	if init && exitCode == 0 {
		return false
	}
	switch policy {
	case corev1.RestartPolicyNever:
		return false
	case corev1.RestartPolicyOnFailure:
		return exitCode != 0
	}
	return true
}

// reconcile moves the Pod towards its spec: sandbox, volumes, init
// containers in order, then the containers, restarts when due.
func (w *podWorker) reconcile(ctx context.Context, pod *corev1.Pod) {
	now := time.Now()
	if pod.Spec.HostNetwork || pod.Spec.HostPID || pod.Spec.HostIPC {
		// The sandbox gives Pods nothing of the host but loopback services
		// it chose; a Pod asking for the host's namespaces stays Pending.
		for _, c := range pod.Spec.Containers {
			w.state(&c, false).waitingReason = "CreateContainerConfigError"
		}
		if !w.reported["host-namespaces"] {
			w.reported["host-namespaces"] = true
			w.event(corev1.EventTypeWarning, "Failed", "hostNetwork, hostPID and hostIPC are not supported by the sandbox node: every Pod gets namespaces of its own")
		}
		return
	}
	if missing := w.unknownImages(pod); len(missing) > 0 {
		for i, c := range append(append([]corev1.Container{}, pod.Spec.InitContainers...), pod.Spec.Containers...) {
			cs := w.state(&c, i < len(pod.Spec.InitContainers))
			if cs.run == nil {
				cs.waitingReason = "ErrImageNeverPull"
				cs.waitingMessage = ""
				if _, ok := w.a.imageBinary(c.Image); !ok {
					cs.waitingMessage = w.unknownImageMessage(c.Image)
				}
			}
		}
		for _, image := range missing {
			if !w.reported["image:"+image] {
				w.reported["image:"+image] = true
				w.event(corev1.EventTypeWarning, "ErrImageNeverPull", "%s", w.unknownImageMessage(image))
			}
		}
		return
	}
	if w.ns == nil {
		if err := w.createSandbox(pod); err != nil {
			w.event(corev1.EventTypeWarning, "FailedCreatePodSandBox", "Failed to create pod sandbox: %v", err)
			w.wakeAt(now.Add(retryDelay))
			return
		}
	}
	if !w.volumesReady {
		if err := w.setupVolumes(ctx, pod); err != nil {
			w.event(corev1.EventTypeWarning, "FailedMount", "%v", err)
			for _, cs := range w.containers {
				if cs.run == nil {
					cs.waitingReason, cs.waitingMessage = "ContainerCreating", ""
				}
			}
			w.wakeAt(now.Add(retryDelay))
			return
		}
		w.volumesReady = true
	}
	if next, err := w.refreshTokens(ctx, pod); err != nil {
		w.event(corev1.EventTypeWarning, "FailedMount", "refresh service account token: %v", err)
		w.wakeAt(now.Add(retryDelay))
	} else if !next.IsZero() {
		w.wakeAt(next)
	}

	for i := range pod.Spec.InitContainers {
		c := &pod.Spec.InitContainers[i]
		cs := w.state(c, true)
		if cs.term != nil && cs.term.ExitCode == 0 && cs.exited {
			continue
		}
		if !w.advance(ctx, pod, c, cs, now) {
			// Not done: later init containers and the containers wait.
			for j := range pod.Spec.Containers {
				if s := w.state(&pod.Spec.Containers[j], false); s.run == nil {
					s.waitingReason, s.waitingMessage = "PodInitializing", ""
				}
			}
			w.checkTerminal(pod)
			return
		}
	}
	for i := range pod.Spec.Containers {
		c := &pod.Spec.Containers[i]
		w.advance(ctx, pod, c, w.state(c, false), now)
	}
	w.checkTerminal(pod)
}

// advance starts or restarts one container when it should run, and tells
// whether it has completed (for init containers: exited 0).
func (w *podWorker) advance(ctx context.Context, pod *corev1.Pod, c *corev1.Container, cs *containerState, now time.Time) bool {
	cs.spec = *c
	switch {
	case cs.run != nil && !cs.exited:
		return false
	case cs.run == nil:
		w.start(ctx, pod, cs)
	case cs.restartPending:
		if now.Before(cs.restartAt) {
			w.wakeAt(cs.restartAt)
			return false
		}
		w.start(ctx, pod, cs)
	default:
		return cs.term != nil && cs.term.ExitCode == 0
	}
	return false
}

// checkTerminal marks the Pod terminal once nothing runs or will run.
func (w *podWorker) checkTerminal(pod *corev1.Pod) {
	st := w.computeStatus(pod)
	if st.Phase == corev1.PodSucceeded || st.Phase == corev1.PodFailed {
		w.terminal = true
		w.teardownSandbox()
	}
}

func (w *podWorker) state(c *corev1.Container, init bool) *containerState {
	cs, ok := w.containers[c.Name]
	if !ok {
		cs = &containerState{spec: *c, init: init}
		w.containers[c.Name] = cs
	}
	return cs
}

func (w *podWorker) unknownImages(pod *corev1.Pod) []string {
	var missing []string
	for _, c := range append(append([]corev1.Container{}, pod.Spec.InitContainers...), pod.Spec.Containers...) {
		if _, ok := w.a.imageBinary(c.Image); !ok {
			missing = append(missing, c.Image)
		}
	}
	return missing
}

func (w *podWorker) unknownImageMessage(image string) string {
	known := make([]string, 0)
	for name := range w.a.Images() {
		known = append(known, name)
	}
	return fmt.Sprintf("Container image %q is not present with pull policy of Never: the sandbox node runs only this project's own images (%s), each as a binary built from the repository",
		image, strings.Join(sortedStrings(known), ", "))
}

// createSandbox makes the Pod's network namespace, hosts file and proxy.
func (w *podWorker) createSandbox(pod *corev1.Pod) error {
	if err := os.MkdirAll(w.dir, 0o755); err != nil {
		return fmt.Errorf("pod directory: %w", err)
	}
	if !w.ip.IsValid() {
		ip, err := w.a.ipam.allocate()
		if err != nil {
			return err
		}
		w.ip = ip
		w.a.registerIP(ip, w)
	}
	ns, err := newNetNS(w.ip)
	if err != nil {
		return err
	}
	w.ns = ns
	w.hostsPath = filepath.Join(w.dir, "etc-hosts")
	w.resolvPath = filepath.Join(w.dir, "resolv.conf")
	w.hostnamePath = filepath.Join(w.dir, "hostname")
	if err := os.WriteFile(w.resolvPath, resolvConf(pod.Namespace), 0o644); err != nil {
		return fmt.Errorf("write resolv.conf: %w", err)
	}
	if err := os.WriteFile(w.hostnamePath, []byte(podHostname(pod)+"\n"), 0o644); err != nil {
		return fmt.Errorf("write hostname: %w", err)
	}
	proxy, err := startPodProxy(w.a, ns, &w.wg)
	if err != nil {
		_ = ns.Close()
		w.ns = nil
		return err
	}
	w.proxy = proxy
	w.refreshNetworkConfig()
	w.mu.Lock()
	w.netns = ns
	w.mu.Unlock()
	return nil
}

// refreshNetworkConfig rewrites the hosts file from the current Services
// (the proxy looks Services up per connection).
func (w *podWorker) refreshNetworkConfig() {
	if w.ns == nil {
		return
	}
	// Written in place, not renamed: the file is bind-mounted by inode.
	if err := os.WriteFile(w.hostsPath, hostsFile(w.currentPod(), w.ip, w.a.services()), 0o644); err != nil {
		w.logf("write hosts file: %v", err)
	}
}

func (w *podWorker) teardownSandbox() {
	if w.proxy != nil {
		w.proxy.close()
		w.proxy = nil
	}
	w.mu.Lock()
	w.netns = nil
	w.mu.Unlock()
	if w.ns != nil {
		_ = w.ns.Close()
		w.ns = nil
	}
}

// start runs a container (again).
func (w *podWorker) start(ctx context.Context, pod *corev1.Pod, cs *containerState) {
	c := &cs.spec
	fail := func(reason string, err error) {
		cs.waitingReason, cs.waitingMessage = reason, err.Error()
		key := reason + ":" + c.Name + ":" + err.Error()
		if !w.reported[key] {
			w.reported[key] = true
			w.event(corev1.EventTypeWarning, "Failed", "Error: %v", err)
		}
		w.wakeAt(time.Now().Add(retryDelay))
	}
	spec, err := w.containerSpec(ctx, pod, c)
	if err != nil {
		var ce *configError
		if errors.As(err, &ce) {
			fail("CreateContainerConfigError", err)
		} else {
			fail("CreateContainerError", err)
		}
		return
	}
	restart := cs.restartCount
	if cs.run != nil {
		restart++
	}
	id := fmt.Sprintf("%s-%s-%d", w.uid, c.Name, restart)
	logPath := filepath.Join(w.logDir, c.Name, fmt.Sprintf("%d.log", restart))
	termPath := filepath.Join(w.dir, "containers", c.Name, fmt.Sprintf("%d-termination-log", restart))
	for _, d := range []string{filepath.Dir(logPath), filepath.Dir(termPath)} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			fail("CreateContainerError", err)
			return
		}
	}
	if err := os.WriteFile(termPath, nil, 0o666); err == nil {
		// Any container user may write its termination message.
		_ = os.Chmod(termPath, 0o666)
		path := c.TerminationMessagePath
		if path == "" {
			path = corev1.TerminationMessagePathDefault
		}
		spec.Mounts = append(spec.Mounts, shimMount{Source: termPath, Target: path})
	}
	w.event(corev1.EventTypeNormal, "Pulled", "Container image %q already present on machine", c.Image)
	run, err := startContainer(id, spec, w.ns, logPath, &w.wg, func(r *containerRun) { w.post(evExit{name: c.Name, run: r}) })
	if err != nil {
		fail("CreateContainerError", err)
		return
	}
	w.a.registerRun(run)
	if cs.run != nil {
		cs.lastTerm = cs.term
		cs.prevLogPath = cs.run.logPath
		cs.restartCount = restart
	}
	cs.run, cs.exited, cs.term, cs.restartPending = run, false, nil, false
	cs.ready, cs.started = false, false
	cs.waitingReason, cs.waitingMessage = "", ""
	w.event(corev1.EventTypeNormal, "Created", "Created container: %s", c.Name)
	if run.startErr != "" {
		return // its exit event reports the failure
	}
	w.event(corev1.EventTypeNormal, "Started", "Started container %s", c.Name)
	probeCtx, cancel := context.WithCancel(w.a.ctx)
	cs.cancelProbes = cancel
	w.startProbes(probeCtx, pod, cs, run)
}

// terminationMessage reads what the container left at its
// terminationMessagePath, or its last log lines when the policy says so.
func (w *podWorker) terminationMessage(cs *containerState, run *containerRun) string {
	restart := strings.TrimPrefix(run.id, fmt.Sprintf("%s-%s-", w.uid, cs.spec.Name))
	b, err := os.ReadFile(filepath.Join(w.dir, "containers", cs.spec.Name, restart+"-termination-log"))
	if err == nil && len(b) > 0 {
		return string(truncate(b, 4096))
	}
	if cs.spec.TerminationMessagePolicy == corev1.TerminationMessageFallbackToLogsOnError && run.exitCode != 0 {
		return lastLogLines(run.logPath, 80, 2048)
	}
	return ""
}

func truncate(b []byte, n int) []byte {
	if len(b) > n {
		return b[:n]
	}
	return b
}

// stopRun sends SIGTERM and, after grace, SIGKILL (from a goroutine the
// worker's WaitGroup counts).
func (w *podWorker) stopRun(run *containerRun, grace time.Duration) {
	run.signal(syscall.SIGTERM)
	w.wg.Add(1)
	go func() {
		defer w.wg.Done()
		select {
		case <-run.done:
		case <-time.After(grace):
			run.signal(syscall.SIGKILL)
		}
	}()
}

// killAll stops every running container: SIGTERM, up to grace (or until
// ctx ends), then SIGKILL; it returns once all have exited.
func (w *podWorker) killAll(ctx context.Context, grace time.Duration, announce bool) {
	var running []*containerRun
	for name, cs := range w.containers {
		if cs.run != nil && cs.run.running() {
			running = append(running, cs.run)
			if announce {
				w.event(corev1.EventTypeNormal, "Killing", "Stopping container %s", name)
			}
			cs.run.signal(syscall.SIGTERM)
		}
	}
	deadline := time.NewTimer(grace)
	defer deadline.Stop()
	for _, r := range running {
		select {
		case <-r.done:
			continue
		case <-deadline.C:
		case <-ctx.Done():
		}
		break
	}
	for _, r := range running {
		if r.running() {
			r.signal(syscall.SIGKILL)
		}
	}
	for _, r := range running {
		<-r.done
	}
}

// terminate handles the Pod's graceful deletion: stop the containers
// within the grace period, report the final status, then delete the object
// for good (grace 0), as the kubelet's status manager does.
func (w *podWorker) terminate(ctx context.Context, pod *corev1.Pod) {
	if !w.killed {
		w.killed = true
		grace := 30 * time.Second
		if pod.DeletionGracePeriodSeconds != nil {
			grace = time.Duration(*pod.DeletionGracePeriodSeconds) * time.Second
		} else if pod.Spec.TerminationGracePeriodSeconds != nil {
			grace = time.Duration(*pod.Spec.TerminationGracePeriodSeconds) * time.Second
		}
		for _, cs := range w.containers {
			if cs.cancelProbes != nil {
				cs.cancelProbes()
				cs.cancelProbes = nil
			}
			cs.restartPending = false
		}
		w.killAll(ctx, grace, true)
		_, events := w.take()
		for _, e := range events {
			w.apply(e)
		}
		w.terminal = true
		w.teardownSandbox()
	}
	w.writeStatus(ctx, pod)
	if w.deleteDone {
		return
	}
	err := w.a.client.CoreV1().Pods(pod.Namespace).Delete(ctx, pod.Name, metav1.DeleteOptions{
		GracePeriodSeconds: ptr.To[int64](0),
		Preconditions:      metav1.NewUIDPreconditions(string(w.uid)),
	})
	if err != nil && !apierrors.IsNotFound(err) && !apierrors.IsConflict(err) {
		w.logf("delete: %v", err)
		w.wakeAt(time.Now().Add(retryDelay))
		return
	}
	w.deleteDone = true
}

// cleanup runs when the worker ends (the Pod is gone, or the agent stops):
// nothing of the Pod may survive it.
func (w *podWorker) cleanup() {
	for _, cs := range w.containers {
		if cs.cancelProbes != nil {
			cs.cancelProbes()
		}
	}
	w.killAll(context.Background(), time.Second, false)
	w.teardownSandbox()
	w.wg.Wait()
	for _, cs := range w.containers {
		if cs.run != nil {
			w.a.unregisterRun(cs.run.id)
		}
	}
	if w.ip.IsValid() {
		w.a.ipam.release(w.ip)
	}
	if w.removed {
		// emptyDir and the rest of the Pod's state go with the Pod; logs
		// stay for whoever inspects the sandbox afterwards.
		if err := os.RemoveAll(w.dir); err != nil {
			w.logf("remove pod directory: %v", err)
		}
	}
}

// writeStatus reports the Pod's status when it changed.
func (w *podWorker) writeStatus(ctx context.Context, pod *corev1.Pod) {
	st := w.computeStatus(pod)
	if w.lastStatus != nil && equality.Semantic.DeepEqual(*w.lastStatus, st) {
		return
	}
	if err := w.updateStatus(ctx, pod, st); err != nil {
		if ctx.Err() == nil {
			w.logf("update status: %v", err)
		}
		w.wakeAt(time.Now().Add(retryDelay))
		return
	}
	w.lastStatus = &st
}

func (w *podWorker) updateStatus(ctx context.Context, pod *corev1.Pod, st corev1.PodStatus) error {
	pods := w.a.client.CoreV1().Pods(pod.Namespace)
	cur := pod.DeepCopy()
	for range 5 {
		cur.Status = mergeStatus(cur.Status, st)
		_, err := pods.UpdateStatus(ctx, cur, metav1.UpdateOptions{})
		switch {
		case err == nil, apierrors.IsNotFound(err):
			return nil
		case !apierrors.IsConflict(err):
			return err
		}
		if cur, err = pods.Get(ctx, pod.Name, metav1.GetOptions{}); err != nil {
			if apierrors.IsNotFound(err) {
				return nil
			}
			return err
		}
		if cur.UID != w.uid {
			return nil
		}
	}
	return errors.New("status update kept conflicting")
}

// publish makes the current container logs visible to the logs endpoint.
func (w *podWorker) publish() {
	views := make(map[string]containerView, len(w.containers))
	for name, cs := range w.containers {
		v := containerView{prevLogPath: cs.prevLogPath, waitingReason: cs.waitingReason}
		if cs.run != nil {
			v.logPath, v.runID = cs.run.logPath, cs.run.id
		}
		if v.waitingReason == "" {
			v.waitingReason = "ContainerCreating"
		}
		views[name] = v
	}
	w.mu.Lock()
	w.views = views
	w.mu.Unlock()
}

func (w *podWorker) event(typ, reason, format string, args ...any) {
	w.a.recorder.Eventf(w.currentPod(), typ, reason, format, args...)
}
