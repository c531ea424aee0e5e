package tunnel

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/client-go/rest"
)

const (
	testNS   = "eb-system"
	testHost = "https://203.0.113.7:6443"
)

var serverLabels = map[string]string{"app.kubernetes.io/name": "etcdbackup-server"}

func testDialer(t *testing.T, target Target, objects ...runtime.Object) (*Dialer, *fake.Clientset) {
	t.Helper()
	cs := fake.NewClientset(objects...)
	if target.Namespace == "" {
		target.Namespace = testNS
	}
	if target.Service == "" {
		target.Service = "etcdbackup"
	}
	return newDialer(&rest.Config{Host: testHost}, cs, target), cs
}

func service(name string, ports ...corev1.ServicePort) *corev1.Service {
	return &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: testNS, Name: name},
		Spec:       corev1.ServiceSpec{Selector: serverLabels, Ports: ports},
	}
}

type podOpt func(*corev1.Pod)

func pod(name string, opts ...podOpt) *corev1.Pod {
	p := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: testNS, Name: name, Labels: serverLabels},
		Spec: corev1.PodSpec{Containers: []corev1.Container{{
			Name:  "server",
			Ports: []corev1.ContainerPort{{Name: "grpc", ContainerPort: 9443}, {Name: "metrics", ContainerPort: 9090}},
		}}},
		Status: corev1.PodStatus{
			Phase:      corev1.PodRunning,
			Conditions: []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue}},
		},
	}
	for _, o := range opts {
		o(p)
	}
	return p
}

func notReady(p *corev1.Pod) {
	p.Status.Conditions = []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionFalse}}
}

func pending(reason string) podOpt {
	return func(p *corev1.Pod) {
		p.Status.Phase = corev1.PodPending
		p.Status.Conditions = nil
		p.Status.ContainerStatuses = []corev1.ContainerStatus{{Name: "server", State: corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{Reason: reason}}}}
	}
}

func labelled(l map[string]string) podOpt { return func(p *corev1.Pod) { p.Labels = l } }

func terminating(p *corev1.Pod) {
	now := metav1.Now()
	p.DeletionTimestamp = &now
	p.Finalizers = []string{"test/keep"}
}

func grpcPort(target intstr.IntOrString) corev1.ServicePort {
	return corev1.ServicePort{Name: "grpc", Port: 443, TargetPort: target}
}

func TestResolveNoServiceIsNotInstalled(t *testing.T) {
	d, _ := testDialer(t, Target{}, pod("server-1"))
	_, err := d.Resolve(context.Background())
	var ni *NotInstalledError
	if !errors.As(err, &ni) {
		t.Fatalf("Resolve without a Service: %T %v, want *NotInstalledError", err, err)
	}
	if ni.Namespace != testNS || ni.Service != "etcdbackup" {
		t.Fatalf("NotInstalledError names %s/%s", ni.Namespace, ni.Service)
	}
	for _, want := range []string{
		`no etcdbackup server is installed in namespace "eb-system" (service "etcdbackup" not found)`,
		"install it (kubectl apply -k manifests/)",
		"-n NAMESPACE", "--server-service NAME",
	} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not contain %q", err, want)
		}
	}
}

func TestResolveNoReadyPod(t *testing.T) {
	d, _ := testDialer(t, Target{},
		service("etcdbackup", grpcPort(intstr.FromString("grpc"))),
		pod("server-a", pending("ImagePullBackOff")),
		pod("server-b", notReady),
		pod("server-c", terminating),                              // going away: neither chosen nor listed
		pod("other", labelled(map[string]string{"app": "other"})), // Ready, but not behind the Service
	)
	_, err := d.Resolve(context.Background())
	var nr *NotReadyError
	if !errors.As(err, &nr) {
		t.Fatalf("Resolve: %T %v, want *NotReadyError", err, err)
	}
	var names []string
	for _, p := range nr.Pods {
		names = append(names, p.Name)
	}
	if strings.Join(names, ",") != "server-a,server-b" {
		t.Fatalf("NotReadyError lists pods %v, want server-a,server-b", names)
	}
	want := `the etcdbackup server in namespace "eb-system" is not ready: server-a is Pending (ImagePullBackOff), server-b is Running but not Ready; ` +
		"see `kubectl -n eb-system describe pod server-a`"
	if err.Error() != want {
		t.Fatalf("error\n %q\nwant\n %q", err, want)
	}
}

func TestResolveServiceWithoutPods(t *testing.T) {
	d, _ := testDialer(t, Target{}, service("etcdbackup", grpcPort(intstr.FromInt32(9443))))
	_, err := d.Resolve(context.Background())
	var nr *NotReadyError
	if !errors.As(err, &nr) || len(nr.Pods) != 0 {
		t.Fatalf("Resolve: %T %v, want *NotReadyError without pods", err, err)
	}
	for _, want := range []string{`has no pods (service "etcdbackup" selects none)`, "kubectl -n eb-system get deploy,rs,pods"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not contain %q", err, want)
		}
	}
}

// olderServer's container names its user port "api": servers installed
// before the user API left the Service are reached through the Service's
// port "grpc".
func olderServer(p *corev1.Pod) {
	p.Spec.Containers[0].Ports = []corev1.ContainerPort{{Name: "api", ContainerPort: 9443}, {Name: "metrics", ContainerPort: 9090}}
}

func TestResolvePorts(t *testing.T) {
	for _, tc := range []struct {
		name     string
		portName string
		ports    []corev1.ServicePort
		older    bool
		want     int32
		wantErr  string
	}{
		{
			name:  "container port grpc, not in the Service (the user API is loopback-only)",
			ports: []corev1.ServicePort{{Name: "agent", Port: 50052, TargetPort: intstr.FromString("agent")}},
			want:  9443,
		},
		{
			name:  "named grpc port among others, targetPort by name",
			ports: []corev1.ServicePort{{Name: "metrics", Port: 9090, TargetPort: intstr.FromInt32(9090)}, grpcPort(intstr.FromString("grpc"))},
			want:  9443,
		},
		{
			name:  "targetPort by number",
			older: true,
			ports: []corev1.ServicePort{grpcPort(intstr.FromInt32(8443))},
			want:  8443,
		},
		{
			name:  "no targetPort means the Service port",
			older: true,
			ports: []corev1.ServicePort{{Name: "grpc", Port: 7000}},
			want:  7000,
		},
		{
			name:  "single unnamed port",
			ports: []corev1.ServicePort{{Port: 443, TargetPort: intstr.FromString("grpc")}},
			want:  9443,
		},
		{
			name:     "another port name asked for",
			portName: "client",
			ports:    []corev1.ServicePort{grpcPort(intstr.FromInt32(1)), {Name: "client", Port: 2379, TargetPort: intstr.FromInt32(2379)}},
			want:     2379,
		},
		{
			name:    "several ports, none named grpc",
			older:   true,
			ports:   []corev1.ServicePort{{Name: "http", Port: 80}, {Name: "metrics", Port: 9090}},
			wantErr: `pod eb-system/server-1 has no container port named "grpc" and service eb-system/etcdbackup has no port named "grpc" either; is it the etcdbackup server's Service?`,
		},
		{
			name:    "single named port that is not grpc",
			older:   true,
			ports:   []corev1.ServicePort{{Name: "http", Port: 80}},
			wantErr: `service eb-system/etcdbackup has no port named "grpc"`,
		},
		{
			name:    "targetPort name the pod lacks",
			older:   true,
			ports:   []corev1.ServicePort{grpcPort(intstr.FromString("api-v2"))},
			wantErr: `pod eb-system/server-1 has no container port named "api-v2"`,
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := pod("server-1")
			if tc.older {
				olderServer(p)
			}
			d, _ := testDialer(t, Target{PortName: tc.portName}, service("etcdbackup", tc.ports...), p)
			ep, err := d.Resolve(context.Background())
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("Resolve: %v, %v; want error %q", ep, err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if ep.Pod.Name != "server-1" || ep.Port != tc.want {
				t.Fatalf("Resolve = %s, want pod server-1 port %d", ep, tc.want)
			}
			if got, want := ep.String(), "pod eb-system/server-1 port "+strconv.Itoa(int(tc.want)); got != want {
				t.Fatalf("Endpoint.String() = %q, want %q", got, want)
			}
		})
	}
}

// The Ready pod is chosen over pods that are not, whatever the order.
func TestResolvePicksReadyPod(t *testing.T) {
	d, _ := testDialer(t, Target{},
		service("etcdbackup", grpcPort(intstr.FromString("grpc"))),
		pod("server-a", notReady), pod("server-b"), pod("server-c", pending("ContainerCreating")))
	ep, err := d.Resolve(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if ep.Pod.Name != "server-b" || ep.Port != 9443 {
		t.Fatalf("Resolve = %s, want pod server-b port 9443", ep)
	}
}

func TestResolveServiceWithoutSelector(t *testing.T) {
	svc := service("etcdbackup", grpcPort(intstr.FromString("grpc")))
	svc.Spec.Selector = nil
	d, _ := testDialer(t, Target{}, svc)
	_, err := d.Resolve(context.Background())
	if err == nil || err.Error() != "service eb-system/etcdbackup has no selector, so no server pod can be found behind it" {
		t.Fatalf("Resolve: %v", err)
	}
}

func TestNewDefaultsPortName(t *testing.T) {
	d, err := New(&rest.Config{Host: testHost}, Target{Namespace: testNS, Service: "etcdbackup"})
	if err != nil {
		t.Fatal(err)
	}
	if d.target.PortName != DefaultPortName || DefaultPortName != "grpc" {
		t.Fatalf("PortName %q, want grpc", d.target.PortName)
	}
}

// A Service that selects other labels than the manifests' still leads to
// its own pods, not to pods that carry the manifests' labels.
func TestResolveFollowsAServiceWithItsOwnSelector(t *testing.T) {
	custom := map[string]string{"app": "my-etcdbackup"}
	svc := service("etcdbackup", grpcPort(intstr.FromString("grpc")))
	svc.Spec.Selector = custom
	d, _ := testDialer(t, Target{}, svc, pod("conventional"), pod("mine", labelled(custom)))
	ep, err := d.Resolve(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if ep.Pod.Name != "mine" {
		t.Fatalf("Resolve chose pod %s, want mine (the one the Service selects)", ep.Pod.Name)
	}
}
