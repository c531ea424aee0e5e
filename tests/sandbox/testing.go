package sandbox

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"
)

// DirEnv names a directory under which StartForTest keeps each test's
// sandbox dir (logs, certificates, the node's files) instead of a
// temporary one removed at the end.
const DirEnv = "ETCDBACKUP_SANDBOX_DIR"

// RequireEnv, when set to 1, turns "kube binaries missing" from a skip into
// a failure (for CI, where the sandbox must run).
const RequireEnv = "ETCDBACKUP_REQUIRE_SANDBOX"

// ErrNotRoot is why StartForTest skips for a user other than root: the node
// runs in network and mount namespaces of its own, with containerd.
var ErrNotRoot = errors.New("the sandbox's node must run as root (network and mount namespaces, containerd, cgroups)")

// StartForTest starts a sandbox in a fresh t.TempDir() and stops it when the
// test ends. If the kube binaries are missing, or the test does not run as
// root, it skips the test with how to fix that — or fails it when
// ETCDBACKUP_REQUIRE_SANDBOX=1. With Config.NetworkPolicy on a kernel that
// cannot enforce it (ErrNetworkPolicyUnsupported) it skips, saying so,
// whatever ETCDBACKUP_REQUIRE_SANDBOX says: no build fixes that. Progress lines
// go to t.Log; when the test failed, the tail of the apiserver log does too.
func StartForTest(t testing.TB) *Sandbox {
	t.Helper()
	return StartForTestWith(t, Config{})
}

// StartForTestWith is StartForTest with a configuration: Images, say. An
// empty Dir is a fresh t.TempDir(), an empty BinDir the default one, a nil
// Log the test's log.
func StartForTestWith(t testing.TB, cfg Config) *Sandbox {
	t.Helper()
	binDir, nodeDir, err := ResolveBinDirs(cfg.BinDir, cfg.NodeDir)
	if err == nil {
		err = CheckBinaries(binDir, nodeDir)
	}
	if err == nil && os.Geteuid() != 0 {
		err = ErrNotRoot
	}
	if err == nil && cfg.NetworkPolicy {
		if err = checkNetworkPolicyBinary(nodeDir); err == nil {
			err = CheckNetworkPolicy()
		}
	}
	if errors.Is(err, ErrNetworkPolicyUnsupported) {
		t.Skipf("sandbox: NetworkPolicy: %v", err)
	}
	if err != nil {
		if (errors.Is(err, ErrBinariesMissing) || errors.Is(err, ErrNotRoot)) && os.Getenv(RequireEnv) != "1" {
			t.Skipf("sandbox: %v; set %s=1 to fail instead of skipping", err, RequireEnv)
		}
		t.Fatalf("sandbox: %v", err)
	}
	// Long enough to wait for the sandbox of a test in another package
	// (one runs per machine); each start step has a bound of its own.
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Minute)
	defer cancel()
	logw := &testLogWriter{t: t}
	cfg.BinDir, cfg.NodeDir = binDir, nodeDir
	if cfg.Dir == "" {
		cfg.Dir = t.TempDir()
		// To keep the logs of a run: ETCDBACKUP_SANDBOX_DIR=DIR.
		if d := os.Getenv(DirEnv); d != "" {
			cfg.Dir = filepath.Join(d, strings.NewReplacer("/", "_", " ", "_").Replace(t.Name()))
		}
	}
	if cfg.Log == nil {
		cfg.Log = logw
	}
	s, err := Start(ctx, cfg)
	if err != nil {
		t.Fatalf("start sandbox: %v", err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			ps := []*process{s.apiserver.process}
			for _, n := range s.allNodes() {
				ps = append(ps, n.kubelet)
			}
			for _, p := range ps {
				if p != nil {
					t.Logf("sandbox: last lines of %s:\n%s", p.logPath, p.logTail(30))
				}
			}
			t.Logf("sandbox: logs of the controllers, containerd, the kubelet and kube-proxy are in %s", s.dir)
		}
		if err := s.Stop(); err != nil {
			t.Errorf("stop sandbox: %v", err)
		}
		logw.close()
	})
	return s
}

// testLogWriter turns progress lines into t.Log lines, and stops forwarding
// once the test is over (t.Log panics after that).
type testLogWriter struct {
	t      testing.TB
	mu     sync.Mutex
	closed bool
}

func (w *testLogWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if !w.closed {
		w.t.Log(string(bytes.TrimRight(p, "\n")))
	}
	return len(p), nil
}

func (w *testLogWriter) close() {
	w.mu.Lock()
	w.closed = true
	w.mu.Unlock()
}
