package loopetcd

import (
	"context"
	"net"
	"net/url"
	"path/filepath"
	"testing"

	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/internal/etcdtest"
)

// A port taken between its pick and etcd's bind (another process on a
// busy machine) costs a new pick, not the start: here the first client
// port picked is one a listener already holds.
func TestStartPicksAgainWhenAPortIsTaken(t *testing.T) {
	taken, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer taken.Close()
	picks := 0
	pickLoopbackURL = func(scheme string) (url.URL, error) {
		picks++
		if scheme == "https" && picks <= 2 {
			return url.URL{Scheme: scheme, Host: taken.Addr().String()}, nil
		}
		return freeLoopbackURL(scheme)
	}
	t.Cleanup(func() { pickLoopbackURL = freeLoopbackURL })

	base := filepath.Join(t.TempDir(), "base.db")
	etcdtest.SnapshotFile(t, base, 64<<10)
	m, err := Start(context.Background(), Options{Snapshot: base, DataDir: filepath.Join(t.TempDir(), "member")})
	if err != nil {
		t.Fatalf("start with the first client port taken: %v", err)
	}
	defer m.Close()
	if m.Endpoint == "https://"+taken.Addr().String() {
		t.Fatalf("serves on the taken port %s", m.Endpoint)
	}
	if _, err := m.Client.Get(context.Background(), "/x"); err != nil {
		t.Fatal(err)
	}
}
