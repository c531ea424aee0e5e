package servertest

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	ebv1 "github.com/kubectl-etcdbackup/kubectl-etcdbackup/api/etcdbackup/v1"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/internal/etcdtest"
)

// Upload stores data as backup name in the default location, through
// the client.
func (s *Server) Upload(t testing.TB, name string, data []byte) *ebv1.Backup {
	t.Helper()
	b, err := s.Client.Upload(context.Background(), bytes.NewReader(data), &ebv1.UploadHeader{Name: name}, nil)
	if err != nil {
		t.Fatalf("upload %q: %v", name, err)
	}
	return b
}

// Names lists the backups of location ("" for the default) by name, in
// the order the server lists them.
func (s *Server) Names(t testing.TB, location string) []string {
	t.Helper()
	resp, err := s.Client.Backups.ListBackups(context.Background(), &ebv1.ListBackupsRequest{Location: location})
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, b := range resp.GetBackups() {
		names = append(names, b.GetName())
	}
	return names
}

// OpenUpload starts an upload of name that sends its header and one
// chunk, a whole etcd snapshot to the server's trailer check, then holds
// the stream open; cancel ends it.
func (s *Server) OpenUpload(t testing.TB, location, name string) (ebv1.BackupService_UploadBackupClient, context.CancelFunc) {
	t.Helper()
	return s.OpenUploadOf(t, location, name, etcdtest.TrailedBytes(t, etcdtest.TrailedSize(1)))
}

// OpenUploadOf is OpenUpload with first as its one chunk.
func (s *Server) OpenUploadOf(t testing.TB, location, name string, first []byte) (ebv1.BackupService_UploadBackupClient, context.CancelFunc) {
	t.Helper()
	// Bounded, so a server that never ends it fails the test instead of
	// hanging it.
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	stream, err := s.Client.Backups.UploadBackup(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := stream.Send(&ebv1.UploadBackupRequest{Msg: &ebv1.UploadBackupRequest_Header{Header: &ebv1.UploadHeader{Name: name, Location: location}}}); err != nil {
		t.Fatal(err)
	}
	if err := stream.Send(&ebv1.UploadBackupRequest{Msg: &ebv1.UploadBackupRequest_Chunk{Chunk: first}}); err != nil {
		t.Fatal(err)
	}
	return stream, cancel
}

// WaitInProgress waits until the filesystem location has n uploads in
// progress: the server claims an upload's name, then opens its temporary
// file.
func (s *Server) WaitInProgress(t testing.TB, location string, n int) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		entries, err := os.ReadDir(filepath.Join(s.Dirs[location], ".tmp"))
		if err != nil {
			t.Fatal(err)
		}
		if len(entries) == n {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d uploads in progress in location %q; want %d", len(entries), location, n)
		}
		time.Sleep(10 * time.Millisecond)
	}
}
