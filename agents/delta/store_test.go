package delta_test

import (
	"bytes"
	"context"
	"strings"
	"testing"

	agent "github.com/kubectl-etcdbackup/kubectl-etcdbackup/agents/delta"
	ebv1 "github.com/kubectl-etcdbackup/kubectl-etcdbackup/api/etcdbackup/v1"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/internal/etcdtest"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/server/servertest"
)

// The server store starts a chain after its full backup's revision, and
// names the chain when its full cannot be read. (Put needs the server's
// delta side and the Lease: the sandbox tests run it end to end.)
func TestServerStore(t *testing.T) {
	srv := servertest.Start(t, "")
	ctx := context.Background()
	if _, err := srv.Client.Upload(ctx, bytes.NewReader(etcdtest.TrailedBytes(t, 544)), &ebv1.UploadHeader{Name: "full-1",
		Etcd: &ebv1.EtcdInfo{Revision: 41}}, nil); err != nil {
		t.Fatal(err)
	}
	store := &agent.ServerStore{Client: srv.Client, Chain: "full-1", Target: "etcd-a"}
	next, ended, err := store.Position(ctx)
	if err != nil || next != 42 || ended != "" {
		t.Fatalf("Position: %d %q %v", next, ended, err)
	}
	if _, _, err := (&agent.ServerStore{Client: srv.Client, Chain: "missing"}).Position(ctx); err == nil || !strings.Contains(err.Error(), `read chain "missing"`) {
		t.Fatalf("Position of a missing chain: %v", err)
	}
}
