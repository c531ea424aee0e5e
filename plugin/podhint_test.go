package plugin

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/cli-runtime/pkg/genericclioptions"
	"k8s.io/client-go/rest"

	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/tunnel"
)

func TestPodHintPath(t *testing.T) {
	dir := t.TempDir()
	g := &GlobalOptions{ConfigFlags: genericclioptions.NewConfigFlags(true), ServerService: "etcdbackup"}
	g.ConfigFlags.CacheDir = &dir
	got := g.podHintPath("https://10.0.0.1:6443/some path")
	if want := filepath.Join(dir, "etcdbackup", "10.0.0.1_6443_some_path", DefaultNamespace+"_etcdbackup.json"); got != want {
		t.Errorf("hint path %q, want %q", got, want)
	}
	empty := ""
	g.ConfigFlags.CacheDir = &empty
	if got := g.podHintPath("https://10.0.0.1:6443"); got != "" {
		t.Errorf("hint path without a cache dir: %q, want none", got)
	}
}

// The endpoint a dial resolves is kept for the next command, written
// only when it changed; a missing or damaged file is no hint.
func TestPodHintKept(t *testing.T) {
	path := filepath.Join(t.TempDir(), "etcdbackup", "host", "ns_svc.json")
	newDialer := func() *tunnel.Dialer {
		d, err := tunnel.New(&rest.Config{Host: "https://127.0.0.1:1"}, tunnel.Target{Namespace: "ns", Service: "svc"})
		if err != nil {
			t.Fatal(err)
		}
		return d
	}
	ep := func(name string) *tunnel.Endpoint {
		return &tunnel.Endpoint{Pod: &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: name}}, Port: 9443}
	}

	d := newDialer()
	usePodHint(d, path)
	d.Resolved(ep("server-1"))
	data, err := os.ReadFile(path)
	if err != nil || string(data) != `{"pod":"server-1","port":9443}` {
		t.Fatalf("hint file: %q, %v", data, err)
	}

	// Unchanged: not written again.
	if err := os.Chmod(filepath.Dir(path), 0o500); err != nil {
		t.Fatal(err)
	}
	d = newDialer()
	usePodHint(d, path)
	d.Resolved(ep("server-1"))
	// Changed, and the directory not writable: no error, the old hint stays.
	d.Resolved(ep("server-2"))
	if err := os.Chmod(filepath.Dir(path), 0o700); err != nil {
		t.Fatal(err)
	}
	if data, _ := os.ReadFile(path); os.Geteuid() != 0 && string(data) != `{"pod":"server-1","port":9443}` {
		t.Fatalf("hint file after a failed write: %q", data)
	}

	if err := os.WriteFile(path, []byte("not json"), 0o600); err != nil {
		t.Fatal(err)
	}
	d = newDialer()
	usePodHint(d, path)
	d.Resolved(ep("server-3"))
	if data, _ := os.ReadFile(path); string(data) != `{"pod":"server-3","port":9443}` {
		t.Fatalf("hint file after a damaged one: %q", data)
	}
	entries, _ := os.ReadDir(filepath.Dir(path))
	for _, e := range entries {
		if strings.Contains(e.Name(), ".json.") {
			t.Errorf("temporary file %s left behind", e.Name())
		}
	}
}
