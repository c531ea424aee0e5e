package auth

import (
	"testing"

	corev1 "k8s.io/api/core/v1"
)

func TestRunningImages(t *testing.T) {
	const digest = "sha256:2f0e3fbd1c4a6a3c3c2b38a4b4f3e96a0a0d7d9b2b43c5c3bd0b1e9c8a7f6e5d"
	for _, tc := range []struct {
		spec, running string
		same          bool
	}{
		{"agent:dev", "docker.io/library/agent:dev", true},
		{"agent", "docker.io/library/agent:latest", true},
		{"team/agent:v1", "docker.io/team/agent:v1", true},
		{"ghcr.io/x/agent:v1", "ghcr.io/x/agent:v1", true},
		{"localhost:5000/agent:v1", "localhost:5000/agent:v1", true},
		{"ghcr.io/x/agent@" + digest, "ghcr.io/x/agent:v1", true},
		{"ghcr.io/x/agent:v1@" + digest, "ghcr.io/x/agent@" + digest, true},
		{"ghcr.io/x/agent:v1", "ghcr.io/x/agent:v2", false},
		{"ghcr.io/x/agent@" + digest, "ghcr.io/x/agent@sha256:00", false},
		{"ghcr.io/x/agent:v1", "docker.io/library/evil:latest", false},
		{"agent:dev", "docker.io/library/agent:evil", false},
		{"ghcr.io/x/agent:v1", "ghcr.io/y/agent:v1", false},
	} {
		pod := &corev1.Pod{
			Spec:   corev1.PodSpec{Containers: []corev1.Container{{Name: "agent", Image: tc.spec}}},
			Status: corev1.PodStatus{ContainerStatuses: []corev1.ContainerStatus{{Name: "agent", Image: tc.running, State: corev1.ContainerState{Running: &corev1.ContainerStateRunning{}}}}},
		}
		if err := runningImages(pod); (err == nil) != tc.same {
			t.Errorf("spec %s, running %s: %v", tc.spec, tc.running, err)
		}
	}
}
