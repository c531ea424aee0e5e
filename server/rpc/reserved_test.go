package rpc_test

import (
	"bytes"
	"context"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"k8s.io/client-go/kubernetes/fake"

	ebv1 "github.com/kubectl-etcdbackup/kubectl-etcdbackup/api/etcdbackup/v1"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/server"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/server/config"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/server/jobs"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/server/servertest"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/storage/filesystem"
)

// Names of a target's scheduled runs are the schedule's: a user's upload
// or on-demand backup that takes one is refused, saying what to do, and
// nothing is stored (issue 37 #5). Other names pass.
func TestScheduledNamesAreReserved(t *testing.T) {
	ctx := context.Background()
	srv := servertest.StartWith(t, servertest.Options{
		Targets: []config.Target{{Name: "cp", Endpoints: []string{"http://127.0.0.1:1"}, InsecurePlaintext: true, Schedule: "*/5 * * * *"}},
	})
	for _, name := range []string{"cp-20261201-100500", "cp-29991231-235500", "cp-20261201-100500-2"} {
		_, err := srv.Client.Upload(ctx, bytes.NewReader(trailed(t, 1)), &ebv1.UploadHeader{Name: name}, nil)
		servertest.WantRefusal(t, err, codes.InvalidArgument, `name "`+name+`" has the form of target "cp"'s scheduled backups`, "choose another name")
	}
	if names := srv.Names(t, "default"); len(names) != 0 {
		t.Fatalf("stored after the refused uploads: %v", names)
	}
	if _, err := srv.Client.Upload(ctx, bytes.NewReader(trailed(t, 1)), &ebv1.UploadHeader{Name: "cp-restored-by-hand"}, nil); err != nil {
		t.Fatalf("an upload under another name: %v", err)
	}

	loc, err := filesystem.New(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	l, err := jobs.New(fake.NewClientset(), "etcdbackup-system", config.Agents{Image: "agent:dev"})
	if err != nil {
		t.Fatal(err)
	}
	s, err := server.New(server.Config{
		Locations: []server.NamedLocation{{Name: "default", Location: loc}},
		Targets:   []config.Target{{Name: "cp", Endpoints: []string{"http://127.0.0.1:1"}, InsecurePlaintext: true}},
		Agents:    l,
		Now:       func() time.Time { return time.Date(2026, 1, 31, 12, 0, 0, 0, time.UTC) },
	})
	if err != nil {
		t.Fatal(err)
	}
	_, err = s.CreateBackup(ctx, &ebv1.CreateBackupRequest{Target: "cp", Name: "cp-20260131-120500"})
	servertest.WantRefusal(t, err, codes.InvalidArgument, "scheduled backups", "choose another name")

	// The fulls a delta capture takes are the server's too: retention
	// counts them, so no user may give a backup their names.
	for name, what := range map[string]string{
		"cp-chain-20261201-100500": "the fulls target \"cp\"'s delta capture starts its chains from",
		"cp-fold-12345":            "target \"cp\"'s folded delta chains",
	} {
		_, err := srv.Client.Upload(ctx, bytes.NewReader(trailed(t, 1)), &ebv1.UploadHeader{Name: name}, nil)
		servertest.WantRefusal(t, err, codes.InvalidArgument, `name "`+name+`" has the form of `+what, "choose another name")
		_, err = s.CreateBackup(ctx, &ebv1.CreateBackupRequest{Target: "cp", Name: name})
		servertest.WantRefusal(t, err, codes.InvalidArgument, what, "choose another name")
	}
	for _, name := range []string{"cp-chain-of-custody", "cp-fold-x1", "cp-folder"} {
		if _, err := srv.Client.Upload(ctx, bytes.NewReader(trailed(t, 1)), &ebv1.UploadHeader{Name: name}, nil); err != nil {
			t.Fatalf("upload of %q: %v", name, err)
		}
	}
}
