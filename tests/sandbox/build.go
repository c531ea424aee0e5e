package sandbox

import (
	"context"
	"fmt"
	"os/exec"
	"path/filepath"
)

// PodToolImage is the image name tests give podtool (tests/sandbox/podtool),
// a small binary with modes that exercise what Pods do (serve, exit with a
// code, in-cluster config, Service names, volumes).
const PodToolImage = "sandbox-podtool"

// BuildPodTool builds tests/sandbox/podtool into dir and returns the
// binary's path, for the image table.
func BuildPodTool(ctx context.Context, dir string) (string, error) {
	root, err := repoRoot()
	if err != nil {
		return "", fmt.Errorf("sandbox: %w", err)
	}
	out := filepath.Join(dir, "podtool")
	cmd := exec.CommandContext(ctx, "go", "build", "-o", out, "./tests/sandbox/podtool")
	cmd.Dir = root
	if b, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("sandbox: go build podtool: %w\n%s", err, b)
	}
	return out, nil
}
