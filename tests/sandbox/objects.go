package sandbox

import (
	"context"
	"fmt"
	"maps"
	"strconv"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/util/retry"
	"k8s.io/utils/ptr"

	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/tests/sandbox/nodeagent"
)

// kubeletVersion is what the fake node reports; it matches the apiserver.
const kubeletVersion = "v1.37.2"

// nodeCapacity is what the sandbox node offers the scheduler.
var nodeCapacity = corev1.ResourceList{
	corev1.ResourceCPU:    resource.MustParse("2"),
	corev1.ResourceMemory: resource.MustParse("8Gi"),
	corev1.ResourcePods:   resource.MustParse("110"),
}

// registerNode creates the Node and writes the status a kubelet would: the
// InternalIP the apiserver dials (127.0.0.1), the kubelet port (the node
// endpoint) and Ready=True. The node agent then renews its Lease, which
// keeps the node lifecycle controller from declaring it dead.
func (s *Sandbox) registerNode(ctx context.Context) error {
	nodes := s.client.CoreV1().Nodes()
	node, err := nodes.Create(ctx, &corev1.Node{
		ObjectMeta: metav1.ObjectMeta{
			Name: NodeName,
			Labels: map[string]string{
				"kubernetes.io/hostname": NodeName,
				"kubernetes.io/os":       "linux",
				"kubernetes.io/arch":     "amd64",
			},
		},
	}, metav1.CreateOptions{})
	if err != nil {
		return fmt.Errorf("create node: %w", err)
	}
	now := metav1.Now()
	capacity := nodeCapacity
	node.Status = corev1.NodeStatus{
		Capacity:    capacity,
		Allocatable: capacity,
		Phase:       corev1.NodeRunning,
		Conditions: []corev1.NodeCondition{{
			Type:               corev1.NodeReady,
			Status:             corev1.ConditionTrue,
			Reason:             "KubeletReady",
			Message:            "sandbox node endpoint is serving",
			LastHeartbeatTime:  now,
			LastTransitionTime: now,
		}},
		Addresses: []corev1.NodeAddress{
			{Type: corev1.NodeInternalIP, Address: "127.0.0.1"},
			{Type: corev1.NodeHostName, Address: NodeName},
		},
		DaemonEndpoints: corev1.NodeDaemonEndpoints{
			KubeletEndpoint: corev1.DaemonEndpoint{Port: int32(s.node.port)},
		},
		NodeInfo: corev1.NodeSystemInfo{
			KubeletVersion:          kubeletVersion,
			OperatingSystem:         "linux",
			Architecture:            "amd64",
			ContainerRuntimeVersion: "sandbox://" + kubeletVersion,
			OSImage:                 "etcdbackup sandbox",
			KernelVersion:           "sandbox",
		},
	}
	if _, err := nodes.UpdateStatus(ctx, node, metav1.UpdateOptions{}); err != nil {
		return fmt.Errorf("update node status: %w", err)
	}
	return nil
}

// EnsureNamespace creates the namespace and its ServiceAccount "default" if
// they are missing. The controller-manager creates the account too, moments
// after the namespace; creating it here means a Pod created right after
// never meets the ServiceAccount admission plugin's "not found".
func (s *Sandbox) EnsureNamespace(ctx context.Context, ns string) error {
	_, err := s.client.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{
		ObjectMeta: metav1.ObjectMeta{Name: ns},
	}, metav1.CreateOptions{})
	if err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("sandbox: create namespace %s: %w", ns, err)
	}
	_, err = s.client.CoreV1().ServiceAccounts(ns).Create(ctx, &corev1.ServiceAccount{
		ObjectMeta: metav1.ObjectMeta{Name: "default"},
	}, metav1.CreateOptions{})
	if err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("sandbox: create service account %s/default: %w", ns, err)
	}
	return nil
}

// PodSpec describes a pod for RunPod.
type PodSpec struct {
	Namespace, Name string
	Labels          map[string]string
	// Ports are the container's ports (names matter: Services and the
	// plugin may refer to them by name).
	Ports []corev1.ContainerPort
	// Targets maps a container port to the local TCP address a port-forward
	// to that port reaches, e.g. {7443: "127.0.0.1:40123"}.
	Targets map[int32]string
	// Ready is the pod's Ready (and ContainersReady) condition.
	Ready bool

	// Optional extras, for a pod that looks like a Deployment's.
	Annotations     map[string]string
	OwnerReferences []metav1.OwnerReference
	ContainerName   string // default "server"
	Image           string // default "registry.k8s.io/pause:3.10" (never pulled)
}

// RunPod creates the namespace if missing (with ServiceAccount default), the
// Pod bound to the sandbox node, registers its port-forward targets in the
// node endpoint, and sets its status to Running with a Pod IP of its own and
// Ready as asked. The Pod is "hand-run": its process is the caller's, so it
// carries nodeagent.HandRunAnnotation and the node agent neither runs nor
// reports it; Service traffic from agent-run Pods still reaches its Targets.
func (s *Sandbox) RunPod(ctx context.Context, p PodSpec) error {
	if p.Namespace == "" || p.Name == "" {
		return fmt.Errorf("sandbox: RunPod: namespace and name are required")
	}
	for port := range p.Targets {
		if port <= 0 || port > 65535 {
			return fmt.Errorf("sandbox: RunPod %s/%s: bad target port %d", p.Namespace, p.Name, port)
		}
	}
	if err := s.EnsureNamespace(ctx, p.Namespace); err != nil {
		return err
	}
	containerName := p.ContainerName
	if containerName == "" {
		containerName = "server"
	}
	image := p.Image
	if image == "" {
		image = "registry.k8s.io/pause:3.10"
	}
	annotations := maps.Clone(p.Annotations)
	if annotations == nil {
		annotations = map[string]string{}
	}
	annotations[nodeagent.HandRunAnnotation] = "true"
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{
			Name:            p.Name,
			Namespace:       p.Namespace,
			Labels:          maps.Clone(p.Labels),
			Annotations:     annotations,
			OwnerReferences: p.OwnerReferences,
		},
		Spec: corev1.PodSpec{
			// Bound directly: there is no scheduler.
			NodeName: NodeName,
			Containers: []corev1.Container{{
				Name:  containerName,
				Image: image,
				Ports: p.Ports,
			}},
			// No kubelet would ever clean up after a graceful delete.
			TerminationGracePeriodSeconds: ptr.To[int64](0),
		},
	}
	created, err := s.client.CoreV1().Pods(p.Namespace).Create(ctx, pod, metav1.CreateOptions{})
	if err != nil {
		return fmt.Errorf("sandbox: create pod %s/%s: %w", p.Namespace, p.Name, err)
	}
	ip, err := s.agent.AllocateIP()
	if err != nil {
		return fmt.Errorf("sandbox: RunPod %s/%s: %w", p.Namespace, p.Name, err)
	}
	// Register before the pod turns Running, so nobody sees it Running and
	// gets "pod does not exist" from the node.
	s.node.setPod(p.Namespace, p.Name, created.UID, ip, p.Targets)
	if err := s.SetPodStatus(ctx, p.Namespace, p.Name, corev1.PodRunning, p.Ready); err != nil {
		s.node.deletePod(p.Namespace, p.Name)
		s.agent.ReleaseIP(ip)
		return err
	}
	return nil
}

// SetPodStatus sets a hand-run pod's phase and Ready condition the way a
// kubelet would report them (container state, ContainersReady and Ready
// conditions, IPs). Pods the node agent runs get their status from it.
func (s *Sandbox) SetPodStatus(ctx context.Context, ns, name string, phase corev1.PodPhase, ready bool) error {
	ip, ok := s.node.podIP(ns, name)
	if !ok {
		return fmt.Errorf("sandbox: SetPodStatus %s/%s: not a pod from RunPod (the node agent reports the status of the others)", ns, name)
	}
	pods := s.client.CoreV1().Pods(ns)
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		pod, err := pods.Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		pod.Status = podStatus(pod, phase, ready, ip.String())
		_, err = pods.UpdateStatus(ctx, pod, metav1.UpdateOptions{})
		return err
	})
	if err != nil {
		return fmt.Errorf("sandbox: set status of pod %s/%s: %w", ns, name, err)
	}
	return nil
}

func podStatus(pod *corev1.Pod, phase corev1.PodPhase, ready bool, podIP string) corev1.PodStatus {
	now := metav1.Now()
	// Keep transition times of conditions that do not change, as a kubelet does.
	old := map[corev1.PodConditionType]corev1.PodCondition{}
	for _, c := range pod.Status.Conditions {
		old[c.Type] = c
	}
	cond := func(t corev1.PodConditionType, ok bool) corev1.PodCondition {
		status := corev1.ConditionFalse
		if ok {
			status = corev1.ConditionTrue
		}
		c := corev1.PodCondition{Type: t, Status: status, LastTransitionTime: now}
		if prev, found := old[t]; found && prev.Status == status {
			c.LastTransitionTime = prev.LastTransitionTime
		}
		if !ok {
			c.Reason = "SandboxSetNotReady"
		}
		return c
	}
	running := phase == corev1.PodRunning
	startTime := pod.Status.StartTime
	if startTime == nil {
		startTime = &now
	}
	st := corev1.PodStatus{
		Phase: phase,
		Conditions: []corev1.PodCondition{
			cond(corev1.PodScheduled, true),
			cond(corev1.PodInitialized, true),
			cond(corev1.ContainersReady, ready && running),
			cond(corev1.PodReady, ready && running),
		},
		HostIP:    "127.0.0.1",
		HostIPs:   []corev1.HostIP{{IP: "127.0.0.1"}},
		PodIP:     podIP,
		PodIPs:    []corev1.PodIP{{IP: podIP}},
		StartTime: startTime,
		QOSClass:  corev1.PodQOSBestEffort,
	}
	for i, c := range pod.Spec.Containers {
		cs := corev1.ContainerStatus{
			Name:        c.Name,
			Image:       c.Image,
			ImageID:     c.Image,
			ContainerID: "sandbox://" + string(pod.UID) + "-" + strconv.Itoa(i),
			Ready:       ready && running,
			Started:     ptr.To(running),
		}
		switch phase {
		case corev1.PodRunning:
			cs.State.Running = &corev1.ContainerStateRunning{StartedAt: *startTime}
		case corev1.PodSucceeded, corev1.PodFailed:
			code := int32(0)
			if phase == corev1.PodFailed {
				code = 1
			}
			cs.State.Terminated = &corev1.ContainerStateTerminated{ExitCode: code, Reason: string(phase), FinishedAt: now}
		default:
			cs.State.Waiting = &corev1.ContainerStateWaiting{Reason: "ContainerCreating"}
		}
		st.ContainerStatuses = append(st.ContainerStatuses, cs)
	}
	return st
}

// DeletePod deletes the pod at once (grace period 0: no kubelet would finish
// a graceful deletion) and forgets its port-forward targets. Live forwarded
// connections to it stay up until dropped, as a real pod's would until its
// process dies.
func (s *Sandbox) DeletePod(ctx context.Context, ns, name string) error {
	if ip := s.node.deletePod(ns, name); ip.IsValid() {
		s.agent.ReleaseIP(ip)
	}
	err := s.client.CoreV1().Pods(ns).Delete(ctx, name, metav1.DeleteOptions{GracePeriodSeconds: ptr.To[int64](0)})
	if err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("sandbox: delete pod %s/%s: %w", ns, name, err)
	}
	return nil
}

// CreateService creates a ClusterIP Service (the namespace too, if
// missing). The EndpointSlice controller gives it endpoints as in any
// cluster, and Pods the node agent runs reach it by name.
func (s *Sandbox) CreateService(ctx context.Context, ns, name string, selector map[string]string, ports []corev1.ServicePort) error {
	if err := s.EnsureNamespace(ctx, ns); err != nil {
		return err
	}
	_, err := s.client.CoreV1().Services(ns).Create(ctx, &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
		Spec: corev1.ServiceSpec{
			Type:     corev1.ServiceTypeClusterIP,
			Selector: maps.Clone(selector),
			Ports:    ports,
		},
	}, metav1.CreateOptions{})
	if err != nil {
		return fmt.Errorf("sandbox: create service %s/%s: %w", ns, name, err)
	}
	return nil
}
