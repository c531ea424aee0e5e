//go:build linux

package nodeagent

import (
	"net/netip"
	"net/url"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

func TestImageName(t *testing.T) {
	for ref, want := range map[string]string{
		"etcdbackup-server":                             "etcdbackup-server",
		"etcdbackup-server:dev":                         "etcdbackup-server",
		"ghcr.io/org/etcdbackup-server:v1.2.3":          "etcdbackup-server",
		"localhost:5000/etcdbackup-agent":               "etcdbackup-agent",
		"etcdbackup-agent@sha256:0123456789abcdef":      "etcdbackup-agent",
		"registry:5000/a/b/etcdbackup-agent:1@sha256:0": "etcdbackup-agent",
	} {
		if got := ImageName(ref); got != want {
			t.Errorf("ImageName(%q) = %q, want %q", ref, got, want)
		}
	}
}

func TestExpand(t *testing.T) {
	env := map[string]string{"A": "1", "B": "two"}
	for in, want := range map[string]string{
		"plain":          "plain",
		"$(A)":           "1",
		"x-$(A)-$(B)-y":  "x-1-two-y",
		"$(UNKNOWN)":     "$(UNKNOWN)",
		"$$(A)":          "$(A)",
		"$(A":            "$(A",
		"cost: $5":       "cost: $5",
		"trailing $":     "trailing $",
		"$(A)$$$(B)":     "1$two",
		"nested $($(A))": "nested $($(A))",
	} {
		if got := expand(in, lookupIn(env)); got != want {
			t.Errorf("expand(%q) = %q, want %q", in, got, want)
		}
	}
}

func TestServiceEnvVars(t *testing.T) {
	svc := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: "etcd-backup"},
		Spec: corev1.ServiceSpec{ClusterIP: "127.96.0.9", Ports: []corev1.ServicePort{
			{Name: "grpc", Port: 50051, Protocol: corev1.ProtocolTCP},
			{Name: "metrics", Port: 9090},
		}},
	}
	env := serviceEnvVars(svc)
	for k, want := range map[string]string{
		"ETCD_BACKUP_SERVICE_HOST":         "127.96.0.9",
		"ETCD_BACKUP_SERVICE_PORT":         "50051",
		"ETCD_BACKUP_SERVICE_PORT_METRICS": "9090",
		"ETCD_BACKUP_PORT":                 "tcp://127.96.0.9:50051",
		"ETCD_BACKUP_PORT_9090_TCP_ADDR":   "127.96.0.9",
		"ETCD_BACKUP_PORT_50051_TCP_PROTO": "tcp",
	} {
		if env[k] != want {
			t.Errorf("%s = %q, want %q", k, env[k], want)
		}
	}
	svc.Spec.ClusterIP = corev1.ClusterIPNone
	if env := serviceEnvVars(svc); len(env) != 0 {
		t.Errorf("headless service has env vars: %v", env)
	}
}

func TestHostsFile(t *testing.T) {
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "p", Namespace: "ns1"}}
	svcs := []*corev1.Service{
		{ObjectMeta: metav1.ObjectMeta{Name: "a", Namespace: "ns1"}, Spec: corev1.ServiceSpec{ClusterIP: "127.96.0.2"}},
		{ObjectMeta: metav1.ObjectMeta{Name: "b", Namespace: "ns2"}, Spec: corev1.ServiceSpec{ClusterIP: "127.96.0.3"}},
		{ObjectMeta: metav1.ObjectMeta{Name: "h", Namespace: "ns1"}, Spec: corev1.ServiceSpec{ClusterIP: corev1.ClusterIPNone}},
	}
	got := string(hostsFile(pod, netip.MustParseAddr("10.244.0.7"), svcs))
	for _, want := range []string{
		"10.244.0.7\tp\n",
		"127.96.0.2\ta.ns1.svc.cluster.local a.ns1.svc a.ns1 a\n",
		"127.96.0.3\tb.ns2.svc.cluster.local b.ns2.svc b.ns2\n",
	} {
		if !strings.Contains(got, want) {
			t.Errorf("hosts file lacks %q:\n%s", want, got)
		}
	}
	if strings.Contains(got, "h.ns1") {
		t.Errorf("headless service listed:\n%s", got)
	}
}

func TestShouldRestart(t *testing.T) {
	for _, c := range []struct {
		policy corev1.RestartPolicy
		init   bool
		code   int32
		want   bool
	}{
		{corev1.RestartPolicyAlways, false, 0, true},
		{corev1.RestartPolicyAlways, true, 0, false},
		{corev1.RestartPolicyAlways, true, 1, true},
		{corev1.RestartPolicyOnFailure, false, 0, false},
		{corev1.RestartPolicyOnFailure, false, 2, true},
		{corev1.RestartPolicyNever, false, 2, false},
	} {
		if got := shouldRestart(c.policy, c.init, c.code); got != c.want {
			t.Errorf("shouldRestart(%s, init=%v, %d) = %v", c.policy, c.init, c.code, got)
		}
	}
}

func TestParseLogOptions(t *testing.T) {
	q, _ := url.ParseQuery("follow=true&timestamps=1&tail=5&limitBytes=100&sinceSeconds=60&previous=false")
	opts, previous, err := parseLogOptions(q)
	if err != nil {
		t.Fatal(err)
	}
	if !opts.Follow || !opts.Timestamp || previous || opts.TailLines == nil || *opts.TailLines != 5 ||
		opts.LimitBytes == nil || *opts.LimitBytes != 100 || opts.Since.IsZero() {
		t.Fatalf("options %+v", opts)
	}
	for _, bad := range []string{"tailLines=-1", "follow=maybe", "sinceTime=yesterday"} {
		q, _ := url.ParseQuery(bad)
		if _, _, err := parseLogOptions(q); err == nil {
			t.Errorf("%s accepted", bad)
		}
	}
}

func TestIPAM(t *testing.T) {
	p := newIPAM()
	a, err := p.allocate()
	if err != nil {
		t.Fatal(err)
	}
	b, _ := p.allocate()
	if a == b || !PodCIDR.Contains(a) || a.As4()[3] < 2 {
		t.Fatalf("allocated %s and %s", a, b)
	}
	p.release(a)
	if c, _ := p.allocate(); c == a {
		t.Fatalf("released %s handed out again at once", a)
	}
}
