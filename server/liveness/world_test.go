// The restore world of server/rpc's restore tests: a server with backup
// b1 and a target whose members' client URLs a test chooses.

package liveness_test

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"net"
	"testing"

	batchv1 "k8s.io/api/batch/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/server"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/server/config"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/server/jobs"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/storage"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/storage/filesystem"
)

// closedURL is a client URL where nothing listens.
func closedURL(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	return "http://" + addr
}

// silentURL accepts connections and closes them at once, as a Service
// without endpoints may.
func silentURL(t *testing.T) string {
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

type restoreWorld struct {
	srv    *server.Server
	client *fake.Clientset
	loc    storage.Location
	// sha256 is backup b1's.
	sha256 string
}

func newRestoreWorld(t *testing.T, clientURLs ...string) *restoreWorld {
	t.Helper()
	loc, err := filesystem.New(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	up, err := loc.Create(ctx, "b1")
	if err != nil {
		t.Fatal(err)
	}
	data := []byte("not really a snapshot")
	if _, err := up.Write(data); err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256(data)
	if err := up.Commit(ctx, &storage.Manifest{Name: "b1", Size: int64(len(data)), SHA256: hex.EncodeToString(sum[:])}); err != nil {
		t.Fatal(err)
	}
	cs := fake.NewClientset()
	l, err := jobs.New(cs, "etcdbackup-system", config.Agents{Image: "agent:dev"})
	if err != nil {
		t.Fatal(err)
	}
	target := config.Target{Name: "app", Endpoints: []string{closedURL(t)}, InsecurePlaintext: true, Namespace: "app", InitialClusterToken: "tok"}
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
	return &restoreWorld{srv: srv, client: cs, loc: loc, sha256: hex.EncodeToString(sum[:])}
}

func (w *restoreWorld) jobs(t *testing.T) []batchv1.Job {
	t.Helper()
	list, err := w.client.BatchV1().Jobs("app").List(context.Background(), metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return list.Items
}
