package jobs_test

import (
	"context"
	"os"
	"slices"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
	"sigs.k8s.io/yaml"

	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/server/jobs"
)

func serverPod(init ...corev1.Container) *corev1.Pod {
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "etcdbackup-server-7d9f-abcde"},
		Spec: corev1.PodSpec{
			InitContainers: init,
			Containers:     []corev1.Container{{Name: "server", Image: "registry.internal/etcdbackup/etcdbackup-server:v1.2.3"}},
		},
	}
}

func TestAgentImageFromOwnPod(t *testing.T) {
	ctx := context.Background()
	const agent = "registry.internal/etcdbackup/etcdbackup-agent@sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"
	cs := fake.NewClientset(serverPod(
		corev1.Container{Name: "something-else", Image: "busybox"},
		corev1.Container{Name: jobs.AgentImageContainer, Image: agent},
	))
	got, err := jobs.AgentImage(ctx, cs, ns, "etcdbackup-server-7d9f-abcde")
	if err != nil || got != agent {
		t.Fatalf("AgentImage = %q, %v; want %q", got, err, agent)
	}

	// A pod without the init container (an older manifest): no image, no
	// error; the server then runs without on-demand backups, as before.
	cs = fake.NewClientset(serverPod())
	if got, err := jobs.AgentImage(ctx, cs, ns, "etcdbackup-server-7d9f-abcde"); err != nil || got != "" {
		t.Fatalf("without the init container: %q, %v; want \"\", nil", got, err)
	}
}

func TestAgentImageErrors(t *testing.T) {
	ctx := context.Background()
	if _, err := jobs.AgentImage(ctx, fake.NewClientset(), ns, ""); err == nil || !strings.Contains(err.Error(), "POD_NAME") {
		t.Errorf("no pod name: %v, want it to name POD_NAME", err)
	}
	if _, err := jobs.AgentImage(ctx, fake.NewClientset(), ns, "gone"); err == nil || !strings.Contains(err.Error(), ns+"/gone") {
		t.Errorf("missing pod: %v, want it to name the pod", err)
	}
	cs := fake.NewClientset(serverPod())
	cs.PrependReactor("get", "pods", func(k8stesting.Action) (bool, runtime.Object, error) {
		return true, nil, apierrors.NewForbidden(schema.GroupResource{Resource: "pods"}, "x", nil)
	})
	if _, err := jobs.AgentImage(ctx, cs, ns, "etcdbackup-server-7d9f-abcde"); err == nil || !strings.Contains(err.Error(), "get pods") {
		t.Errorf("forbidden: %v, want it to name the missing permission", err)
	}
}

// TestShippedDeploymentNamesAgentImage: manifests/ carries the agent image
// as the init container AgentImage reads, and kustomization.yaml rewrites
// it with the server's, so `images:` in an overlay moves both.
func TestShippedDeploymentNamesAgentImage(t *testing.T) {
	b, err := os.ReadFile("../../manifests/server.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var found *corev1.Container
	for doc := range strings.SplitSeq(string(b), "\n---\n") {
		var d appsv1.Deployment
		if err := yaml.Unmarshal([]byte(doc), &d); err != nil {
			t.Fatal(err)
		}
		if d.Kind != "Deployment" {
			continue
		}
		for i, c := range d.Spec.Template.Spec.InitContainers {
			if c.Name == jobs.AgentImageContainer {
				found = &d.Spec.Template.Spec.InitContainers[i]
			}
		}
		env := map[string]string{}
		for _, e := range d.Spec.Template.Spec.Containers[0].Env {
			if e.ValueFrom != nil && e.ValueFrom.FieldRef != nil {
				env[e.Name] = e.ValueFrom.FieldRef.FieldPath
			}
		}
		if env["POD_NAME"] != "metadata.name" || env["POD_NAMESPACE"] != "metadata.namespace" {
			t.Errorf("server container env from the downward API: %v; want POD_NAME and POD_NAMESPACE", env)
		}
	}
	if found == nil {
		t.Fatalf("manifests/server.yaml: no init container %q in the Deployment", jobs.AgentImageContainer)
	}
	if found.Image != "etcdbackup-agent" || !slices.Equal(found.Args, []string{"--version"}) {
		t.Errorf("init container %s: image %q args %q; want etcdbackup-agent --version", found.Name, found.Image, found.Args)
	}
	k, err := os.ReadFile("../../manifests/kustomization.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var kust struct {
		Images []struct {
			Name string `json:"name"`
		} `json:"images"`
	}
	if err := yaml.Unmarshal(k, &kust); err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, im := range kust.Images {
		names = append(names, im.Name)
	}
	if !slices.Contains(names, "etcdbackup-server") || !slices.Contains(names, "etcdbackup-agent") {
		t.Errorf("manifests/kustomization.yaml images: %v; want etcdbackup-server and etcdbackup-agent", names)
	}
}
