package servertest

import (
	"context"
	"net"
	"testing"

	batchv1 "k8s.io/api/batch/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/server"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/server/config"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/server/jobs"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/server/servertest/backuptest"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/storage"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/storage/filesystem"
)

// RestoreWorld is what restore tests start from: a server, whose
// handlers the test calls (it does not listen), over one filesystem
// location holding backup b1, with agents launched on a fake cluster and
// target "app" (namespace app, initial cluster token "tok") whose members
// m0, m1, … have the client URLs the test chose and claims data-m0,
// data-m1, ….
type RestoreWorld struct {
	Server    *server.Server
	Clientset *fake.Clientset
	Location  storage.Location
	Agents    *jobs.Launcher
	// SHA256 is backup b1's.
	SHA256 string
}

// NewRestoreWorld builds a RestoreWorld whose target's members answer,
// or not, at clientURLs (see ClosedURL, SilentURL); none is a target
// without members, for a test that needs only b1 in a location.
func NewRestoreWorld(t testing.TB, clientURLs ...string) *RestoreWorld {
	t.Helper()
	loc, err := filesystem.New(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	b1 := &storage.Manifest{Name: "b1"}
	backuptest.Put(t, loc, b1, []byte("not really a snapshot"))
	cs := fake.NewClientset()
	l, err := jobs.New(cs, "etcdbackup-system", config.Agents{Image: "agent:dev"})
	if err != nil {
		t.Fatal(err)
	}
	target := config.Target{Name: "app", Endpoints: []string{ClosedURL(t)}, InsecurePlaintext: true, Namespace: "app", InitialClusterToken: "tok"}
	for i, u := range clientURLs {
		name := "m" + string(rune('0'+i))
		target.Members = append(target.Members, config.Member{
			Name: name, PeerURL: "http://" + name + ".app.svc:2380", ClientURL: u, DataDir: "data",
			Volume: config.MemberVolume{PersistentVolumeClaim: &config.ClaimRef{ClaimName: "data-" + name}},
		})
	}
	if err := l.Start(t.Context(), []config.Target{target}); err != nil {
		t.Fatal(err)
	}
	srv, err := server.New(server.Config{
		Locations: []server.NamedLocation{{Name: "default", Location: loc}},
		Targets:   []config.Target{target},
		Agents:    l,
	})
	if err != nil {
		t.Fatal(err)
	}
	return &RestoreWorld{Server: srv, Clientset: cs, Location: loc, Agents: l, SHA256: b1.SHA256}
}

// Jobs lists the Jobs in namespace app.
func (w *RestoreWorld) Jobs(t testing.TB) []batchv1.Job {
	t.Helper()
	list, err := w.Clientset.BatchV1().Jobs("app").List(context.Background(), metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return list.Items
}

// Synced waits until the server's agent caches hold what the test
// changed through the fake clientset.
func (w *RestoreWorld) Synced(t testing.TB) {
	t.Helper()
	if err := w.Agents.Sync(t.Context()); err != nil {
		t.Fatal(err)
	}
}

// ClosedURL is a client URL where nothing listens.
func ClosedURL(t testing.TB) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	return "http://" + addr
}

// SilentURL accepts connections and closes them at once, as a Service
// without endpoints may.
func SilentURL(t testing.TB) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			c.Close()
		}
	}()
	return "http://" + l.Addr().String()
}
