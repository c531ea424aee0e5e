package e2e

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/tests/world"
)

// One download outlives its server pod: the pod is killed mid-transfer
// and its replacement held back for over a minute (the Deployment scaled
// to 0), longer than a drain or gRPC's first reconnects would cover. The
// same invocation finds the new pod through the tunnel, resumes at the
// byte it reached and writes exactly the backup's bytes.
func TestDownloadSurvivesServerReplacement(t *testing.T) {
	c := startCluster(t)
	dir := t.TempDir()

	t.Run("file", func(t *testing.T) {
		want := uploadSnapshot(t, c, filepath.Join(dir, "big"), "big", 1<<30)
		out := filepath.Join(dir, "big.out")
		// Raw: the bytes as stored; a plain download resumes through the
		// same client call.
		cmd := c.kubectl.Command(context.Background(), "etcdbackup", "download", "big", "-o", out, "--raw")
		testSurvives(t, c, cmd, out+".part", out, want, 65*time.Second)
	})
	t.Run("stdout", func(t *testing.T) {
		want := uploadSnapshot(t, c, filepath.Join(dir, "small"), "small", 256<<20)
		out := filepath.Join(dir, "small.out")
		f, err := os.Create(out)
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		cmd := c.kubectl.Command(context.Background(), "etcdbackup", "download", "small", "-o", "-", "--raw")
		// A reader slower than the tunnel, as a pipe into another program
		// may be: the download is still running when the pod dies.
		cmd.Stdout = &slowWriter{w: f, bytesPerSecond: 64 << 20}
		testSurvives(t, c, cmd, out, out, want, 20*time.Second)
	})
}

// uploadSnapshot writes a real etcd snapshot of about size bytes to path
// (upload sends nothing else), uploads it as name and returns its SHA-256.
func uploadSnapshot(t *testing.T, c *cluster, path, name string, size int64) string {
	t.Helper()
	data := writeSnapshotFile(t, path, int(size))
	size = int64(len(data))
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	began := time.Now()
	mustSucceed(t, world.RunCommand(c.kubectl.Command(ctx, "etcdbackup", "upload", path, "--name", name)), "upload "+name)
	t.Logf("uploaded %d MiB in %s", size>>20, time.Since(began).Round(time.Millisecond))
	os.Remove(path)
	return sha(data)
}

// testSurvives starts cmd (a download), kills the server pod once growing
// holds some bytes, keeps a new one from starting for holdBack, and checks
// that cmd succeeds with result holding the bytes whose SHA-256 is want.
func testSurvives(t *testing.T, c *cluster, cmd *exec.Cmd, growing, result, want string, holdBack time.Duration) {
	t.Helper()
	ctx := context.Background()
	ns := world.DefaultNamespace
	old := installedServerPod(ctx, t, c.sb, ns)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	t.Cleanup(func() {
		cmd.Process.Kill()
		<-done
	})
	// Fails the test with the download's output if it already ended.
	running := func(when string) {
		t.Helper()
		select {
		case err := <-done:
			done <- err
			t.Fatalf("the download ended (%v) %s: the test did not exercise a replaced server\n%s", err, when, stderr.String())
		default:
		}
	}

	pollUntil(ctx, t, "the download to write 16 MiB", func() bool {
		running("before 16 MiB arrived")
		st, err := os.Stat(growing)
		return err == nil && st.Size() >= 16<<20
	})
	// No replacement until holdBack passed; the old pod is killed, not
	// drained (the server would let the transfer finish for 60 s).
	scaleServer(ctx, t, c, 0)
	killed := time.Now()
	// At once: the terminating pod would otherwise serve for its grace
	// period, and a fast download may end within it.
	if err := syscall.Kill(serverPID(t, c.sb), syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	pods := c.sb.Client().CoreV1().Pods(ns)
	if err := pods.Delete(ctx, old.Name, metav1.DeleteOptions{GracePeriodSeconds: ptr.To[int64](1)}); err != nil && !apierrors.IsNotFound(err) {
		t.Fatal(err)
	}
	pollUntil(ctx, t, "the server pod to be gone", func() bool {
		_, err := pods.Get(ctx, old.Name, metav1.GetOptions{})
		return apierrors.IsNotFound(err)
	})
	st, _ := os.Stat(growing)
	t.Logf("server pod %s gone %s after the kill, the download at %d MiB", old.Name, time.Since(killed).Round(time.Millisecond), st.Size()>>20)
	running("while the server pod was being killed")
	time.Sleep(time.Until(killed.Add(holdBack)))
	running("while no server pod ran")
	scaleServer(ctx, t, c, 1)
	t.Logf("server scaled back to 1 after %s", time.Since(killed).Round(time.Millisecond))

	select {
	case err := <-done:
		done <- err
		if err != nil {
			t.Fatalf("download across the server's replacement: %v\n%s", err, stderr.String())
		}
	case <-time.After(4 * time.Minute):
		t.Fatalf("the download did not end 4 minutes after the server came back\n%s", stderr.String())
	}
	t.Logf("download done %s after the kill; stderr:\n%s", time.Since(killed).Round(time.Millisecond), stderr.String())
	if n := strings.Count(stderr.String(), "connection to the server lost ("); n != 1 {
		t.Errorf("stderr tells about the outage %d times, want once:\n%s", n, stderr.String())
	}
	if !strings.Contains(stderr.String(), "retrying for up to 2m0s") {
		t.Errorf("stderr does not say how long the download retries:\n%s", stderr.String())
	}
	if got := fileSHA(t, result); got != want {
		t.Fatalf("%s has sha256 %s, want %s", result, got, want)
	}
	if now := installedServerPod(ctx, t, c.sb, ns); now.Name == old.Name {
		t.Fatalf("the server pod is still %s: it was not replaced", old.Name)
	}
}

func scaleServer(ctx context.Context, t *testing.T, c *cluster, replicas int32) {
	t.Helper()
	deps := c.sb.Client().AppsV1().Deployments(world.DefaultNamespace)
	scale, err := deps.GetScale(ctx, "etcdbackup-server", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	scale.Spec.Replicas = replicas
	if _, err := deps.UpdateScale(ctx, "etcdbackup-server", scale, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
}

func fileSHA(t *testing.T, path string) string {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		t.Fatal(err)
	}
	return hex.EncodeToString(h.Sum(nil))
}

// slowWriter writes to w at about bytesPerSecond.
type slowWriter struct {
	w              io.Writer
	bytesPerSecond int64
	start          time.Time
	written        int64
}

func (s *slowWriter) Write(p []byte) (int, error) {
	if s.start.IsZero() {
		s.start = time.Now()
	}
	n, err := s.w.Write(p)
	s.written += int64(n)
	if ahead := time.Duration(s.written*int64(time.Second)/s.bytesPerSecond) - time.Since(s.start); ahead > 0 {
		time.Sleep(ahead)
	}
	return n, err
}
