package auth

import (
	"testing"

	corev1 "k8s.io/api/core/v1"
)

// Only digests decide: a runtime reports an image by any of its names
// (TestInstallDoc's mirrored image ran reported under its upstream name).
func TestRunningImages(t *testing.T) {
	const d1 = "sha256:2f0e3fbd1c4a6a3c3c2b38a4b4f3e96a0a0d7d9b2b43c5c3bd0b1e9c8a7f6e5d"
	const d2 = "sha256:1d7193876c99362f15eec294b4beb68699e605ab2aef539bb6a0e93d639821d4"
	for _, tc := range []struct {
		spec, image, imageID string
		same                 bool
	}{
		{"registry.internal/etcdbackup/agent:v1@" + d1, "ghcr.io/x/agent:v1", "ghcr.io/x/agent@" + d1, true},
		{"registry.internal/etcdbackup/agent:v1@" + d1, "ghcr.io/x/agent:v1", d2, true},      // a config digest: nothing to compare
		{"registry.internal/etcdbackup/agent:v1@" + d1, "", "", true},                        // not reported yet
		{"agent:dev", "docker.io/library/evil:latest", "docker.io/library/evil@" + d2, true}, // nothing pinned
		{"registry.internal/etcdbackup/agent:v1@" + d1, "registry.internal/etcdbackup/agent:v1", "registry.internal/etcdbackup/agent@" + d2, false},
		{"ghcr.io/x/agent@" + d1, "docker.io/library/evil:latest", "docker.io/library/evil@" + d2, false},
	} {
		pod := &corev1.Pod{
			Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "agent", Image: tc.spec}}},
			Status: corev1.PodStatus{ContainerStatuses: []corev1.ContainerStatus{{Name: "agent", Image: tc.image, ImageID: tc.imageID,
				State: corev1.ContainerState{Running: &corev1.ContainerStateRunning{}}}}},
		}
		if err := runningImages(pod); (err == nil) != tc.same {
			t.Errorf("spec %s, running %s (%s): %v", tc.spec, tc.image, tc.imageID, err)
		}
	}
}
