package breakglass_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	ebv1 "github.com/kubectl-etcdbackup/kubectl-etcdbackup/api/etcdbackup/v1"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/server/breakglass"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/server/servertest/backuptest"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/storage"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/storage/filesystem"
)

// Break-glass serves the read path over the locations of a config file:
// a location that cannot be opened is LOCATION_UNAVAILABLE and costs only
// itself, the calls that change things are not served, and a location's
// files are as they were.
func TestServesTheReadPathAlone(t *testing.T) {
	good, missing := t.TempDir(), t.TempDir()
	fs, err := filesystem.New(good)
	if err != nil {
		t.Fatal(err)
	}
	backuptest.Put(t, fs, &storage.Manifest{Name: "b1"}, []byte("not a snapshot"))
	cfg := filepath.Join(t.TempDir(), "config.yaml")
	// missing holds no backups/ directory: not a location, so unavailable.
	if err := os.WriteFile(cfg, []byte("locations:\n  - name: good\n    filesystem: {path: "+good+"}\n  - name: missing\n    filesystem: {path: "+missing+"}\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	dial, _, stop, err := breakglass.Open(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer stop()
	conn, err := grpc.NewClient("passthrough:///breakglass", grpc.WithContextDialer(dial), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	info, err := ebv1.NewInfoServiceClient(conn).GetServerInfo(ctx, &ebv1.GetServerInfoRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if l := info.GetLocations(); len(l) != 2 || l[0].GetUnavailable() || !l[1].GetUnavailable() {
		t.Fatalf("locations %v: want good available, missing unavailable", l)
	}
	backups := ebv1.NewBackupServiceClient(conn)
	list, err := backups.ListBackups(ctx, &ebv1.ListBackupsRequest{Location: "good"})
	if err != nil || len(list.GetBackups()) != 1 || list.GetBackups()[0].GetName() != "b1" {
		t.Fatalf("list of good: %v, %v", list, err)
	}
	_, err = backups.ListBackups(ctx, &ebv1.ListBackupsRequest{Location: "missing"})
	if loc, ok := ebv1.UnavailableLocation(status.Convert(err)); !ok || loc != "missing" {
		t.Fatalf("list of missing: %v; want LOCATION_UNAVAILABLE of it", err)
	}
	// describe's events: none, as a server without agents says.
	if _, err := backups.GetBackupEvents(ctx, &ebv1.GetBackupEventsRequest{Name: "b1", Location: "good"}); status.Code(err) != codes.FailedPrecondition {
		t.Fatalf("events: %v; want FailedPrecondition", err)
	}
	for what, call := range map[string]func() error{
		"delete": func() error {
			_, err := backups.DeleteBackup(ctx, &ebv1.DeleteBackupRequest{Name: "b1", Location: "good"})
			return err
		},
		"create": func() error {
			_, err := backups.CreateBackup(ctx, &ebv1.CreateBackupRequest{Name: "b2", Location: "good"})
			return err
		},
	} {
		if err := call(); status.Code(err) != codes.Unimplemented {
			t.Errorf("%s: %v; want Unimplemented", what, err)
		}
	}
	if _, err := fs.Stat(ctx, "b1"); err != nil {
		t.Fatalf("b1 after break-glass: %v", err)
	}
	if _, err := fs.Stat(ctx, "b2"); !errors.Is(err, storage.ErrNotFound) {
		t.Fatalf("b2 after break-glass: %v", err)
	}
}
