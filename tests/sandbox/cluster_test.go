package sandbox_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"

	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/tests/sandbox"
)

const clusterNS = "cluster-test"

// podtoolImage is podtool under a registry and tag, which the node agent's
// image table ignores.
var podtoolImage = "registry.example/test/" + sandbox.PodToolImage + ":v1"

// TestCluster checks that the sandbox runs workloads as a cluster would:
// controllers, scheduler and the node agent, through real clients only.
func TestCluster(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	podtool, err := sandbox.BuildPodTool(ctx, t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	began := time.Now()
	s := sandbox.StartForTestWith(t, sandbox.Config{Images: map[string]string{sandbox.PodToolImage: podtool}})
	t.Logf("sandbox with controllers and node agent started in %s", time.Since(began).Round(time.Millisecond))
	if err := s.EnsureNamespace(ctx, clusterNS); err != nil {
		t.Fatal(err)
	}

	t.Run("deployment-same-port", func(t *testing.T) { testDeploymentSamePort(ctx, t, s) })
	t.Run("service-and-in-cluster-config", func(t *testing.T) { testServiceAndInCluster(ctx, t, s) })
	t.Run("job-succeeds", func(t *testing.T) {
		job := runJob(ctx, t, s, "succeeds", []string{"exit", "--code=0", "--message=all good"})
		if job.Status.Succeeded != 1 {
			t.Fatalf("job status: %+v", job.Status)
		}
		if out := kubectl(t, s, s.Kubeconfig(), "-n", clusterNS, "logs", "job/succeeds"); !strings.Contains(out, "all good") {
			t.Fatalf("kubectl logs job/succeeds: %q", out)
		}
	})
	t.Run("job-fails", func(t *testing.T) { testJobFails(ctx, t, s) })
	t.Run("garbage-collection", func(t *testing.T) {
		// The Job's Pod goes with the Job: the garbage collector deletes it,
		// the node agent finishes the deletion.
		pods, err := s.Client().CoreV1().Pods(clusterNS).List(ctx, metav1.ListOptions{LabelSelector: "job-name=succeeds"})
		if err != nil || len(pods.Items) != 1 {
			t.Fatalf("pods of job succeeds before deleting it: %v, %v", pods, err)
		}
		err = s.Client().BatchV1().Jobs(clusterNS).Delete(ctx, "succeeds", metav1.DeleteOptions{PropagationPolicy: ptr.To(metav1.DeletePropagationBackground)})
		if err != nil {
			t.Fatal(err)
		}
		waitFor(t, "the job's pod to be collected", func() bool {
			pods, err := s.Client().CoreV1().Pods(clusterNS).List(ctx, metav1.ListOptions{LabelSelector: "job-name=succeeds"})
			return err == nil && len(pods.Items) == 0
		})
	})
	t.Run("hand-run-pod-behind-service", func(t *testing.T) { testHandRunBehindService(ctx, t, s) })
	t.Run("restart-and-previous-logs", func(t *testing.T) { testRestart(ctx, t, s) })
	t.Run("unknown-image", func(t *testing.T) { testUnknownImage(ctx, t, s, podtool) })
	t.Run("volumes-env-security", func(t *testing.T) { testVolumesEnvSecurity(ctx, t, s) })
	t.Run("graceful-delete", func(t *testing.T) { testGracefulDelete(ctx, t, s) })
	t.Run("stop-leaves-nothing", func(t *testing.T) { testStopLeavesNothing(t, s) })
}

func podtoolContainer(name string, args ...string) corev1.Container {
	return corev1.Container{
		Name:  name,
		Image: podtoolImage,
		Args:  args,
		Env: []corev1.EnvVar{{Name: "POD_NAME", ValueFrom: &corev1.EnvVarSource{
			FieldRef: &corev1.ObjectFieldSelector{FieldPath: "metadata.name"},
		}}},
	}
}

// Two replicas listen on the same container port, each in its own network
// namespace; a port-forward to each reaches that one.
func testDeploymentSamePort(ctx context.Context, t *testing.T, s *sandbox.Sandbox) {
	c := podtoolContainer("echo", "serve", "--listen=:8080")
	c.Ports = []corev1.ContainerPort{{Name: "http", ContainerPort: 8080}}
	c.ReadinessProbe = &corev1.Probe{ProbeHandler: corev1.ProbeHandler{HTTPGet: &corev1.HTTPGetAction{Path: "/healthz", Port: intstr.FromString("http")}}}
	labels := map[string]string{"app": "echo"}
	_, err := s.Client().AppsV1().Deployments(clusterNS).Create(ctx, &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Name: "echo"},
		Spec: appsv1.DeploymentSpec{
			Replicas: ptr.To[int32](2),
			Selector: &metav1.LabelSelector{MatchLabels: labels},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: labels},
				Spec:       corev1.PodSpec{Containers: []corev1.Container{c}},
			},
		},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	began := time.Now()
	wctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	if err := s.WaitForDeploymentAvailable(wctx, clusterNS, "echo"); err != nil {
		t.Fatal(err)
	}
	t.Logf("deployment available after %s", time.Since(began).Round(time.Millisecond))
	pods, err := s.Client().CoreV1().Pods(clusterNS).List(ctx, metav1.ListOptions{LabelSelector: "app=echo"})
	if err != nil {
		t.Fatal(err)
	}
	if len(pods.Items) != 2 {
		t.Fatalf("%d pods, want 2", len(pods.Items))
	}
	if a, b := pods.Items[0].Status.PodIP, pods.Items[1].Status.PodIP; a == "" || a == b {
		t.Fatalf("pod IPs %q and %q: want two distinct ones", a, b)
	}
	for _, pod := range pods.Items {
		if !sandbox.PodReady(&pod) || pod.Spec.NodeName != sandbox.NodeName {
			t.Fatalf("pod %s: ready %v, node %q", pod.Name, sandbox.PodReady(&pod), pod.Spec.NodeName)
		}
		local := kubectlPortForwardIn(t, s, clusterNS, "pod/"+pod.Name, 8080)
		body := httpGet(t, "http://"+local+"/")
		if !strings.Contains(body, "pod="+pod.Name+" host="+pod.Name) {
			t.Fatalf("port-forward to %s answered %q", pod.Name, body)
		}
	}
}

func httpGet(t *testing.T, url string) string {
	t.Helper()
	client := &http.Client{Timeout: ioTimeout}
	resp, err := client.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// A Pod reaches a Service by name, and the API server with client-go's
// in-cluster configuration (token, CA, KUBERNETES_SERVICE_HOST).
func testServiceAndInCluster(ctx context.Context, t *testing.T, s *sandbox.Sandbox) {
	_, err := s.Client().CoreV1().Services(clusterNS).Create(ctx, &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: "echo"},
		Spec: corev1.ServiceSpec{
			Selector: map[string]string{"app": "echo"},
			Ports:    []corev1.ServicePort{{Name: "http", Port: 80, TargetPort: intstr.FromString("http")}},
		},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the echo service's endpoints", func() bool {
		slices, err := s.Client().DiscoveryV1().EndpointSlices(clusterNS).List(ctx, metav1.ListOptions{LabelSelector: discoveryv1.LabelServiceName + "=echo"})
		if err != nil {
			return false
		}
		ready := 0
		for _, sl := range slices.Items {
			for _, ep := range sl.Endpoints {
				if ptr.Deref(ep.Conditions.Ready, false) {
					ready++
				}
			}
		}
		return ready == 2
	})
	runJob(ctx, t, s, "client", []string{"get", "http://echo/"})
	out := kubectl(t, s, s.Kubeconfig(), "-n", clusterNS, "logs", "job/client")
	if !strings.Contains(out, "GET http://echo/: 200 OK pod=echo-") {
		t.Fatalf("job/client logs: %q", out)
	}
	runJob(ctx, t, s, "whoami", []string{"incluster"})
	out = kubectl(t, s, s.Kubeconfig(), "-n", clusterNS, "logs", "job/whoami")
	if !strings.Contains(out, "I am system:serviceaccount:"+clusterNS+":default") || !strings.Contains(out, "via https://127.96.0.1:443") {
		t.Fatalf("job/whoami logs: %q", out)
	}
}

// runJob runs podtool with args as a Job (no retries) and waits for it to
// complete.
func runJob(ctx context.Context, t *testing.T, s *sandbox.Sandbox, name string, args []string) *batchv1.Job {
	t.Helper()
	createJob(ctx, t, s, name, args)
	wctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	job, err := s.WaitForJob(wctx, clusterNS, name)
	if err != nil {
		logs, _ := kubectlErr(s, s.Kubeconfig(), "-n", clusterNS, "logs", "job/"+name)
		t.Fatalf("%v\nlogs: %s", err, logs)
	}
	return job
}

func createJob(ctx context.Context, t *testing.T, s *sandbox.Sandbox, name string, args []string) {
	t.Helper()
	_, err := s.Client().BatchV1().Jobs(clusterNS).Create(ctx, &batchv1.Job{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: batchv1.JobSpec{
			BackoffLimit: ptr.To[int32](0),
			Template: corev1.PodTemplateSpec{Spec: corev1.PodSpec{
				RestartPolicy: corev1.RestartPolicyNever,
				Containers:    []corev1.Container{podtoolContainer("main", args...)},
			}},
		},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
}

func testJobFails(ctx context.Context, t *testing.T, s *sandbox.Sandbox) {
	createJob(ctx, t, s, "fails", []string{"exit", "--code=3", "--message=on stdout", "--stderr=failing on purpose"})
	wctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	_, err := s.WaitForJob(wctx, clusterNS, "fails")
	if !errors.Is(err, sandbox.ErrJobFailed) {
		t.Fatalf("WaitForJob: %v, want ErrJobFailed", err)
	}
	pods, err := s.Client().CoreV1().Pods(clusterNS).List(ctx, metav1.ListOptions{LabelSelector: "job-name=fails"})
	if err != nil || len(pods.Items) != 1 {
		t.Fatalf("pods of job fails: %v, %v", pods, err)
	}
	pod := pods.Items[0]
	term := pod.Status.ContainerStatuses[0].State.Terminated
	if pod.Status.Phase != corev1.PodFailed || term == nil || term.ExitCode != 3 || term.Reason != "Error" {
		t.Fatalf("pod %s: phase %s, terminated %+v; want Failed, exit code 3, reason Error", pod.Name, pod.Status.Phase, term)
	}
	out := kubectl(t, s, s.Kubeconfig(), "-n", clusterNS, "logs", "job/fails")
	if !strings.Contains(out, "on stdout") || !strings.Contains(out, "failing on purpose") {
		t.Fatalf("kubectl logs job/fails: %q", out)
	}
}

// A Pod from RunPod (its process is the test's) serves a Service that a
// Pod the node agent runs reaches by name.
func testHandRunBehindService(ctx context.Context, t *testing.T, s *sandbox.Sandbox) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { fmt.Fprintln(w, "hand-run says hi") }))
	t.Cleanup(srv.Close)
	labels := map[string]string{"app": "hand-run"}
	if err := s.RunPod(ctx, sandbox.PodSpec{
		Namespace: clusterNS, Name: "hand-run", Labels: labels, Ready: true,
		Ports:   []corev1.ContainerPort{{Name: "http", ContainerPort: 9000}},
		Targets: map[int32]string{9000: srv.Listener.Addr().String()},
	}); err != nil {
		t.Fatal(err)
	}
	if err := s.CreateService(ctx, clusterNS, "hand-run", labels, []corev1.ServicePort{{Name: "http", Port: 80, TargetPort: intstr.FromString("http")}}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the hand-run service's endpoint", func() bool {
		slices, err := s.Client().DiscoveryV1().EndpointSlices(clusterNS).List(ctx, metav1.ListOptions{LabelSelector: discoveryv1.LabelServiceName + "=hand-run"})
		return err == nil && len(slices.Items) == 1 && len(slices.Items[0].Endpoints) == 1
	})
	runJob(ctx, t, s, "to-hand-run", []string{"get", "http://hand-run." + clusterNS + ".svc/"})
	if out := kubectl(t, s, s.Kubeconfig(), "-n", clusterNS, "logs", "job/to-hand-run"); !strings.Contains(out, "200 OK hand-run says hi") {
		t.Fatalf("job/to-hand-run logs: %q", out)
	}
}

// A crashing container is restarted; its previous run's logs stay readable.
func testRestart(ctx context.Context, t *testing.T, s *sandbox.Sandbox) {
	_, err := s.Client().CoreV1().Pods(clusterNS).Create(ctx, &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "crasher"},
		Spec:       corev1.PodSpec{Containers: []corev1.Container{podtoolContainer("main", "exit", "--code=7", "--message=crashing")}},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	wctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	pod, err := s.WaitForPod(wctx, clusterNS, "crasher", func(p *corev1.Pod) bool {
		return len(p.Status.ContainerStatuses) == 1 && p.Status.ContainerStatuses[0].RestartCount >= 1 &&
			p.Status.ContainerStatuses[0].LastTerminationState.Terminated != nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if last := pod.Status.ContainerStatuses[0].LastTerminationState.Terminated; last.ExitCode != 7 || pod.Status.Phase != corev1.PodRunning {
		t.Fatalf("crasher: phase %s, last termination %+v", pod.Status.Phase, last)
	}
	if out := kubectl(t, s, s.Kubeconfig(), "-n", clusterNS, "logs", "crasher", "--previous"); !strings.Contains(out, "crashing") {
		t.Fatalf("kubectl logs --previous: %q", out)
	}
	// Gone, so its restarts do not change the container count later tests
	// look at.
	kubectl(t, s, s.Kubeconfig(), "-n", clusterNS, "delete", "pod", "crasher", "--wait=true", "--timeout=20s")
}

// A Pod of an image the node does not have stays Pending and says why;
// once the image is in the table, it runs.
func testUnknownImage(ctx context.Context, t *testing.T, s *sandbox.Sandbox, podtool string) {
	_, err := s.Client().CoreV1().Pods(clusterNS).Create(ctx, &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "mystery"},
		Spec: corev1.PodSpec{Containers: []corev1.Container{{
			Name: "main", Image: "docker.io/library/nginx:1.27", Args: []string{"sleep"},
		}}},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	wctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	pod, err := s.WaitForPod(wctx, clusterNS, "mystery", func(p *corev1.Pod) bool {
		return len(p.Status.ContainerStatuses) == 1 && p.Status.ContainerStatuses[0].State.Waiting != nil &&
			p.Status.ContainerStatuses[0].State.Waiting.Reason == "ErrImageNeverPull"
	})
	if err != nil {
		t.Fatal(err)
	}
	if pod.Status.Phase != corev1.PodPending {
		t.Fatalf("phase %s, want Pending", pod.Status.Phase)
	}
	waitFor(t, "an event naming the image", func() bool {
		evs, err := s.Client().CoreV1().Events(clusterNS).List(ctx, metav1.ListOptions{FieldSelector: "involvedObject.name=mystery"})
		if err != nil {
			return false
		}
		for _, e := range evs.Items {
			if e.Reason == "ErrImageNeverPull" && strings.Contains(e.Message, `"docker.io/library/nginx:1.27"`) && strings.Contains(e.Message, "only this project's own images") {
				return true
			}
		}
		return false
	})
	s.SetImage("nginx", podtool)
	if _, err := s.WaitForPod(wctx, clusterNS, "mystery", sandbox.PodReady); err != nil {
		t.Fatal(err)
	}
}

// Secrets, ConfigMaps, the downward API, emptyDir, the service-account
// token, the user and groups of the securityContext, a read-only root.
func testVolumesEnvSecurity(ctx context.Context, t *testing.T, s *sandbox.Sandbox) {
	cs := s.Client().CoreV1()
	if _, err := cs.Secrets(clusterNS).Create(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "creds"}, StringData: map[string]string{"password": "s3cret"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := cs.ConfigMaps(clusterNS).Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "settings"}, Data: map[string]string{"mode": "fast"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	c := podtoolContainer("main", "inspect", "--env=MODE", "--env=POD_IP", "--env=GREETING",
		"--file=/etc/creds/password", "--file=/var/run/secrets/kubernetes.io/serviceaccount/namespace", "--file=/etc/hostname",
		"--write=/scratch", "--write=/tmp")
	c.Env = append(c.Env,
		corev1.EnvVar{Name: "MODE", ValueFrom: &corev1.EnvVarSource{ConfigMapKeyRef: &corev1.ConfigMapKeySelector{LocalObjectReference: corev1.LocalObjectReference{Name: "settings"}, Key: "mode"}}},
		corev1.EnvVar{Name: "POD_IP", ValueFrom: &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{FieldPath: "status.podIP"}}},
		corev1.EnvVar{Name: "GREETING", Value: "hello $(POD_NAME)"},
	)
	c.Args = append(c.Args, "--file=/scratch/from-init")
	c.VolumeMounts = []corev1.VolumeMount{{Name: "creds", MountPath: "/etc/creds"}, {Name: "scratch", MountPath: "/scratch"}}
	// An init container runs to completion first; it shares the emptyDir.
	initC := podtoolContainer("init", "get", "http://echo."+clusterNS+".svc/")
	initC.Command = []string{"/bin/sh", "-c", "exec /" + sandbox.PodToolImage + ` "$@" > /scratch/from-init`, "sh"}
	initC.VolumeMounts = []corev1.VolumeMount{{Name: "scratch", MountPath: "/scratch"}}
	c.SecurityContext = &corev1.SecurityContext{ReadOnlyRootFilesystem: ptr.To(true), AllowPrivilegeEscalation: ptr.To(false)}
	_, err := cs.Pods(clusterNS).Create(ctx, &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "inspector"},
		Spec: corev1.PodSpec{
			RestartPolicy: corev1.RestartPolicyNever,
			SecurityContext: &corev1.PodSecurityContext{
				RunAsUser: ptr.To[int64](1000), RunAsGroup: ptr.To[int64](3000), FSGroup: ptr.To[int64](2000), RunAsNonRoot: ptr.To(true),
			},
			InitContainers: []corev1.Container{initC},
			Containers:     []corev1.Container{c},
			Volumes: []corev1.Volume{
				{Name: "creds", VolumeSource: corev1.VolumeSource{Secret: &corev1.SecretVolumeSource{SecretName: "creds"}}},
				{Name: "scratch", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}},
			},
		},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	wctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	pod, err := s.WaitForPod(wctx, clusterNS, "inspector", func(p *corev1.Pod) bool {
		return p.Status.Phase == corev1.PodSucceeded || p.Status.Phase == corev1.PodFailed
	})
	if err != nil {
		t.Fatal(err)
	}
	out := kubectl(t, s, s.Kubeconfig(), "-n", clusterNS, "logs", "inspector")
	if pod.Status.Phase != corev1.PodSucceeded {
		t.Fatalf("inspector: %s\n%s", pod.Status.Phase, out)
	}
	for _, want := range []string{
		"uid=1000 gid=3000 groups=[2000] hostname=inspector",
		`env MODE="fast" set=true`,
		fmt.Sprintf("env POD_IP=%q set=true", pod.Status.PodIP),
		`env GREETING="hello inspector" set=true`,
		`file /etc/creds/password: "s3cret"`,
		`file /var/run/secrets/kubernetes.io/serviceaccount/namespace: "` + clusterNS + `"`,
		`file /etc/hostname: "inspector"`,
		"write /scratch: ok",
		"write /tmp: error", // readOnlyRootFilesystem
		`file /scratch/from-init: "GET http://echo.` + clusterNS + `.svc/: 200 OK pod=echo-`,
	} {
		if !strings.Contains(out, want) {
			t.Errorf("inspector output lacks %q:\n%s", want, out)
		}
	}
}

// Deleting a Pod sends SIGTERM; the Pod object goes once its container
// exited, and so does the process.
func testGracefulDelete(ctx context.Context, t *testing.T, s *sandbox.Sandbox) {
	before := len(s.ContainerPIDs())
	_, err := s.Client().CoreV1().Pods(clusterNS).Create(ctx, &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "sleeper"},
		Spec:       corev1.PodSpec{Containers: []corev1.Container{podtoolContainer("main", "sleep")}},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	wctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if _, err := s.WaitForPod(wctx, clusterNS, "sleeper", sandbox.PodReady); err != nil {
		t.Fatal(err)
	}
	if n := len(s.ContainerPIDs()); n != before+1 {
		t.Fatalf("%d containers running, want %d", n, before+1)
	}
	began := time.Now()
	kubectl(t, s, s.Kubeconfig(), "-n", clusterNS, "delete", "pod", "sleeper", "--wait=true", "--timeout=20s")
	t.Logf("kubectl delete pod (graceful) took %s", time.Since(began).Round(time.Millisecond))
	waitFor(t, "the container to be gone", func() bool { return len(s.ContainerPIDs()) == before })
}

// Stop kills every container and leaves no process behind.
func testStopLeavesNothing(t *testing.T, s *sandbox.Sandbox) {
	pids := s.ContainerPIDs()
	if len(pids) == 0 {
		t.Fatal("no containers running before Stop: nothing to check")
	}
	children := []int{s.APIServerPID(), s.ControllerManagerPID(), s.SchedulerPID()}
	if err := s.Stop(); err != nil {
		t.Fatal(err)
	}
	for _, pid := range append(pids, children...) {
		if err := syscall.Kill(pid, 0); !errors.Is(err, syscall.ESRCH) {
			t.Errorf("pid %d still exists after Stop (kill -0: %v)", pid, err)
		}
	}
	if left := allChildProcesses(t); len(left) > 0 {
		t.Fatalf("child processes left after Stop: %v", left)
	}
}

// allChildProcesses lists this process's children (any name) as "pid comm".
func allChildProcesses(t *testing.T) []string {
	t.Helper()
	entries, err := os.ReadDir("/proc")
	if err != nil {
		t.Skipf("no /proc: %v", err)
	}
	self := os.Getpid()
	var out []string
	for _, e := range entries {
		stat, err := os.ReadFile("/proc/" + e.Name() + "/stat")
		if err != nil {
			continue
		}
		st := string(stat)
		open, closing := strings.IndexByte(st, '('), strings.LastIndexByte(st, ')')
		if open < 0 || closing < open {
			continue
		}
		fields := strings.Fields(st[closing+1:])
		if len(fields) >= 2 && fields[1] == fmt.Sprint(self) && fields[0] != "Z" {
			out = append(out, e.Name()+" "+st[open+1:closing])
		}
	}
	return out
}
