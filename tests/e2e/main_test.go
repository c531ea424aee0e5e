// Package e2e tests the real binaries: the plugin invoked as a user would
// (directly, and as `kubectl etcdbackup` through a real kubectl and a real
// API server), against a real data server process.
package e2e

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/internal/etcdtest"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/tests/sandbox"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/tests/world"
)

// binDir holds the plugin and server built once for all tests.
var binDir string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "etcdbackup-e2e-bin-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	err = world.BuildBinaries(ctx, dir)
	cancel()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.RemoveAll(dir)
		os.Exit(1)
	}
	binDir = dir
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

var (
	imagesOnce sync.Once
	images     *world.Images
	imagesErr  error
)

// productImages builds the product's images once for the tests that need
// a cluster (the others run the binaries on the host).
func productImages(t *testing.T) *world.Images {
	t.Helper()
	imagesOnce.Do(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
		defer cancel()
		began := time.Now()
		images, imagesErr = world.BuildImages(ctx, filepath.Join(binDir, "images"))
		if imagesErr == nil {
			t.Logf("product images ready in %s: %s, %s, %s", time.Since(began).Round(time.Millisecond), images.Server, images.Agent, images.CLI)
		}
	})
	if imagesErr != nil {
		t.Fatal(imagesErr)
	}
	return images
}

// startSandbox starts the sandbox (or skips the test, see
// sandbox.StartForTest) and imports the product's images into its node.
func startSandbox(t *testing.T) (*sandbox.Sandbox, *world.Images) {
	t.Helper()
	return startSandboxWith(t, sandbox.Config{})
}

// startSandboxEnforcing starts a sandbox whose node enforces NetworkPolicy
// (the shipped one included) when this kernel can, and one that does not,
// saying so, when it cannot: the server's own refusals are tested either
// way.
func startSandboxEnforcing(t *testing.T) (*sandbox.Sandbox, *world.Images) {
	t.Helper()
	err := sandbox.CheckNetworkPolicy()
	if err != nil {
		t.Logf("NetworkPolicy is not enforced in this sandbox: %v", err)
	}
	return startSandboxWith(t, sandbox.Config{NetworkPolicy: err == nil})
}

func startSandboxWith(t *testing.T, cfg sandbox.Config) (*sandbox.Sandbox, *world.Images) {
	t.Helper()
	sb := sandbox.StartForTestWith(t, cfg)
	im := productImages(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if err := sb.ImportImages(ctx, im.Archives...); err != nil {
		t.Fatal(err)
	}
	return sb, im
}

func startServer(t *testing.T) *world.ServerProcess {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	srv, err := world.StartServer(ctx, binDir, t.TempDir(), &testLog{t: t, prefix: "server: "})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := srv.Stop(); err != nil {
			t.Errorf("server: %v", err)
		}
	})
	return srv
}

// plugin runs the plugin binary directly with args.
func plugin(t *testing.T, args ...string) world.Result {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, filepath.Join(binDir, world.PluginBinary), args...)
	cmd.Dir = t.TempDir()
	return world.RunCommand(cmd)
}

func mustSucceed(t *testing.T, r world.Result, what string) world.Result {
	t.Helper()
	if r.ExitCode != 0 {
		t.Fatalf("%s failed: %s", what, r)
	}
	return r
}

func mustFail(t *testing.T, r world.Result, what string) world.Result {
	t.Helper()
	if r.ExitCode == 0 {
		t.Fatalf("%s succeeded, want failure: %s", what, r)
	}
	return r
}

// writeSnapshotFile writes a real etcd snapshot of about n bytes (at least
// the ~25 KiB of an empty member's) to path and returns its bytes: upload
// sends nothing else. Snapshots of the same size are the same bytes (one
// etcd member filled per size and test binary).
func writeSnapshotFile(t *testing.T, path string, n int) []byte {
	t.Helper()
	return etcdtest.SnapshotFile(t, path, n)
}

// writeJunkFile writes n random bytes to path, which are no etcd snapshot.
func writeJunkFile(t *testing.T, path string, n int) []byte {
	t.Helper()
	b := make([]byte, n)
	if _, err := rand.Read(b); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, b, 0o600); err != nil {
		t.Fatal(err)
	}
	return b
}

func sha(b []byte) string {
	s := sha256.Sum256(b)
	return hex.EncodeToString(s[:])
}

func mustEqualFile(t *testing.T, path string, want []byte) {
	t.Helper()
	got, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, want) {
		t.Fatalf("%s: %d bytes, sha %s; want %d bytes, sha %s", path, len(got), sha(got), len(want), sha(want))
	}
}

type testLog struct {
	t      *testing.T
	prefix string
}

func (l *testLog) Write(p []byte) (int, error) {
	defer func() { _ = recover() }() // t.Log after the test ended panics
	l.t.Log(l.prefix + string(bytes.TrimRight(p, "\n")))
	return len(p), nil
}
