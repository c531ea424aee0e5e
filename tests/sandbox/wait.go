package sandbox

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
)

// pollInterval is how often the Wait helpers look; the API server is local.
const pollInterval = 100 * time.Millisecond

// poll calls check until it reports done or an error, or ctx ends; last
// describes the state for the timeout message.
func poll(ctx context.Context, what string, check func() (done bool, last string, err error)) error {
	var last string
	for {
		done, l, err := check()
		if err != nil {
			return err
		}
		if done {
			return nil
		}
		last = l
		select {
		case <-ctx.Done():
			return fmt.Errorf("sandbox: waiting for %s (last: %s): %w", what, last, ctx.Err())
		case <-time.After(pollInterval):
		}
	}
}

// WaitForDeploymentAvailable waits until the Deployment's controller has
// seen its latest generation and every replica is updated and available
// (condition Available=True), as `kubectl rollout status` does.
func (s *Sandbox) WaitForDeploymentAvailable(ctx context.Context, ns, name string) error {
	return poll(ctx, "deployment "+ns+"/"+name+" to be available", func() (bool, string, error) {
		d, err := s.client.AppsV1().Deployments(ns).Get(ctx, name, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return false, "not found", nil
		}
		if err != nil {
			return false, "", fmt.Errorf("sandbox: get deployment %s/%s: %w", ns, name, err)
		}
		want := ptr.Deref(d.Spec.Replicas, 1)
		st := d.Status
		available := false
		for _, c := range st.Conditions {
			if c.Type == appsv1.DeploymentAvailable && c.Status == corev1.ConditionTrue {
				available = true
			}
		}
		last := fmt.Sprintf("generation %d observed %d, %d/%d updated, %d available, %d total",
			d.Generation, st.ObservedGeneration, st.UpdatedReplicas, want, st.AvailableReplicas, st.Replicas)
		return st.ObservedGeneration >= d.Generation && st.UpdatedReplicas == want && st.AvailableReplicas == want &&
			st.Replicas == want && available, last, nil
	})
}

// WaitForPod waits until cond holds for the Pod (which may not exist yet).
func (s *Sandbox) WaitForPod(ctx context.Context, ns, name string, cond func(*corev1.Pod) bool) (*corev1.Pod, error) {
	var pod *corev1.Pod
	err := poll(ctx, "pod "+ns+"/"+name, func() (bool, string, error) {
		p, err := s.client.CoreV1().Pods(ns).Get(ctx, name, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return false, "not found", nil
		}
		if err != nil {
			return false, "", fmt.Errorf("sandbox: get pod %s/%s: %w", ns, name, err)
		}
		pod = p
		return cond(p), string(p.Status.Phase), nil
	})
	return pod, err
}

// PodReady tells whether a Pod's Ready condition is True.
func PodReady(pod *corev1.Pod) bool {
	for _, c := range pod.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

// ErrJobFailed is returned (wrapped) by WaitForJob for a Job that failed.
var ErrJobFailed = errors.New("job failed")

// WaitForJob waits until the Job has finished and returns it: nil error for
// Complete, ErrJobFailed (with the condition's reason and message) for
// Failed.
func (s *Sandbox) WaitForJob(ctx context.Context, ns, name string) (*batchv1.Job, error) {
	var job *batchv1.Job
	var failed error
	err := poll(ctx, "job "+ns+"/"+name+" to finish", func() (bool, string, error) {
		j, err := s.client.BatchV1().Jobs(ns).Get(ctx, name, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return false, "not found", nil
		}
		if err != nil {
			return false, "", fmt.Errorf("sandbox: get job %s/%s: %w", ns, name, err)
		}
		job = j
		for _, c := range j.Status.Conditions {
			if c.Status != corev1.ConditionTrue {
				continue
			}
			switch c.Type {
			case batchv1.JobComplete:
				return true, "", nil
			case batchv1.JobFailed:
				failed = fmt.Errorf("sandbox: job %s/%s: %w: %s: %s", ns, name, ErrJobFailed, c.Reason, c.Message)
				return true, "", nil
			}
		}
		return false, fmt.Sprintf("%d active, %d succeeded, %d failed", j.Status.Active, j.Status.Succeeded, j.Status.Failed), nil
	})
	if err != nil {
		return job, err
	}
	return job, failed
}

// VolumePath is the host directory behind a bound PersistentVolumeClaim
// (a hostPath PV in the node's private /var/lib).
func (s *Sandbox) VolumePath(ctx context.Context, ns, claim string) (string, error) {
	pvc, err := s.client.CoreV1().PersistentVolumeClaims(ns).Get(ctx, claim, metav1.GetOptions{})
	if err != nil {
		return "", fmt.Errorf("sandbox: get claim %s/%s: %w", ns, claim, err)
	}
	if pvc.Spec.VolumeName == "" {
		return "", fmt.Errorf("sandbox: claim %s/%s is not bound", ns, claim)
	}
	pv, err := s.client.CoreV1().PersistentVolumes().Get(ctx, pvc.Spec.VolumeName, metav1.GetOptions{})
	if err != nil {
		return "", fmt.Errorf("sandbox: get volume %s: %w", pvc.Spec.VolumeName, err)
	}
	if pv.Spec.HostPath == nil {
		return "", fmt.Errorf("sandbox: volume %s is not a hostPath volume", pv.Name)
	}
	return s.node.hostPath(pv.Spec.HostPath.Path), nil
}

// NodePath maps a path of node 0's filesystem (hostPath volumes, pod
// logs) to where it is on the host. Volumes are the same on node 2
// (AddNode); its pod logs are under the sandbox dir's node-2/var/log.
func (s *Sandbox) NodePath(path string) string { return s.node.hostPath(path) }

// ContainerPIDs are the processes running in the nodes' pod cgroups now:
// every container's on every node, the pause processes included.
func (s *Sandbox) ContainerPIDs() []int { return cgroupPIDs() }

// NodePIDs are the nodes' daemons: containerd, the kubelet, kube-proxy and
// kube-network-policies of node 0 and, once AddNode ran, node 2.
func (s *Sandbox) NodePIDs() []int {
	var pids []int
	for _, n := range s.allNodes() {
		for _, p := range n.daemons() {
			pids = append(pids, p.cmd.Process.Pid)
		}
	}
	return pids
}

// ControllerManagerPID and SchedulerPID are the child processes' ids (the
// last ones' while the control plane is down).
func (s *Sandbox) ControllerManagerPID() int {
	s.cpMu.Lock()
	defer s.cpMu.Unlock()
	return s.controllerManager.cmd.Process.Pid
}

// SchedulerPID is kube-scheduler's process id.
func (s *Sandbox) SchedulerPID() int {
	s.cpMu.Lock()
	defer s.cpMu.Unlock()
	return s.scheduler.cmd.Process.Pid
}

// podPID is a process of the Pod with uid on the node (its pause process
// or a container's), found in its cgroup: a way into its namespaces.
func podPID(uid string) (int, error) {
	want := "pod" + uid
	var pid int
	for _, d := range cgroupDirs() {
		_ = filepath.WalkDir(d, func(p string, e os.DirEntry, err error) error {
			if pid != 0 || err != nil || !e.IsDir() || e.Name() != want {
				return nil
			}
			_ = filepath.WalkDir(p, func(q string, f os.DirEntry, err error) error {
				if pid != 0 || err != nil || f.Name() != "cgroup.procs" {
					return nil
				}
				b, _ := os.ReadFile(q)
				if fields := strings.Fields(string(b)); len(fields) > 0 {
					pid, _ = strconv.Atoi(fields[0])
				}
				return nil
			})
			return filepath.SkipDir
		})
		if pid != 0 {
			return pid, nil
		}
	}
	return 0, fmt.Errorf("no process of pod %s in the node's cgroups", uid)
}

// podSockets runs ss in the network namespace of pod ns/name for the
// client ends of the TCP connections to port (a port-forward opens them
// inside the pod: containerd dials localhost:port there), with extra ss
// arguments, and returns how many sockets it listed.
func (s *Sandbox) podSockets(ctx context.Context, ns, name string, port int, extra ...string) (int, error) {
	pod, err := s.client.CoreV1().Pods(ns).Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		return 0, fmt.Errorf("sandbox: get pod %s/%s: %w", ns, name, err)
	}
	pid, err := podPID(string(pod.UID))
	if err != nil {
		return 0, fmt.Errorf("sandbox: pod %s/%s: %w", ns, name, err)
	}
	filter := fmt.Sprintf("( dport = :%d )", port)
	argv := append([]string{"nsenter", "-t", strconv.Itoa(pid), "-n", "--", "ss", "-tnH"}, extra...)
	argv = append(argv, "state", "established", filter)
	cmd := exec.CommandContext(ctx, argv[0], argv[1:]...)
	cmd.Env = []string{"PATH=" + nodePATH}
	out, err := cmd.Output()
	if err != nil {
		return 0, fmt.Errorf("sandbox: ss in pod %s/%s: %w", ns, name, err)
	}
	n := 0
	for _, line := range strings.Split(string(out), "\n") {
		if strings.TrimSpace(line) != "" {
			n++
		}
	}
	return n, nil
}

// DropConnections breaks every TCP connection to port inside pod ns/name,
// as if the pod side of each port-forward broke (the kernel aborts the
// sockets: ss -K). Each affected port-forward sees an error on its error
// stream; client-go's port forwarder then ends the session ("lost
// connection to pod"), as it does when a pod's connection breaks. It
// returns how many connections there were.
func (s *Sandbox) DropConnections(ctx context.Context, ns, name string, port int) (int, error) {
	return s.podSockets(ctx, ns, name, port, "-K")
}

// Connections counts the TCP connections to port inside pod ns/name (a
// port-forward makes one per forwarded connection).
func (s *Sandbox) Connections(ctx context.Context, ns, name string, port int) (int, error) {
	return s.podSockets(ctx, ns, name, port)
}
