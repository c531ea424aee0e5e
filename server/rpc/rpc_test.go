package rpc_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	ebv1 "github.com/kubectl-etcdbackup/kubectl-etcdbackup/api/etcdbackup/v1"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/client"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/internal/etcdtest"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/server/servertest"
)

type testServer struct {
	*servertest.Server
	client *client.Client
	dir    string
	conn   *grpc.ClientConn
	stop   func()
}

// startServer runs a real server on a loopback port over a real
// filesystem location.
func startServer(t *testing.T, dir string) *testServer {
	t.Helper()
	s := servertest.Start(t, dir)
	return &testServer{Server: s, client: s.Client, dir: s.Dir, conn: s.Conn, stop: s.Stop}
}

func randomBytes(t testing.TB, n int) []byte {
	b := make([]byte, n)
	if _, err := rand.Read(b); err != nil {
		t.Fatal(err)
	}
	return b
}

// trailed returns random bytes of about n (rounded up to whole 512-byte
// pages) that end in their SHA-256, as etcd ends a snapshot: the server
// stores a plain upload only if it passes that check.
func trailed(t testing.TB, n int) []byte {
	return etcdtest.TrailedBytes(t, etcdtest.TrailedSize(n))
}

func sha(b []byte) string {
	s := sha256.Sum256(b)
	return hex.EncodeToString(s[:])
}

func (ts *testServer) upload(t *testing.T, name string, data []byte) *ebv1.Backup {
	t.Helper()
	b, err := ts.client.Upload(context.Background(), bytes.NewReader(data), &ebv1.UploadHeader{Name: name}, nil)
	if err != nil {
		t.Fatalf("upload %q: %v", name, err)
	}
	return b
}

func (ts *testServer) names(t *testing.T) []string {
	t.Helper()
	resp, err := ts.client.Backups.ListBackups(context.Background(), &ebv1.ListBackupsRequest{})
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, b := range resp.GetBackups() {
		names = append(names, b.GetName())
	}
	return names
}

// tree lists every file under dir with its size, to prove a request
// changed nothing on disk.
func tree(t *testing.T, dir string) string {
	t.Helper()
	var lines []string
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		info, err := d.Info()
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(dir, p)
		lines = append(lines, rel+" "+info.Mode().String()+" "+strconv.FormatInt(info.Size(), 10))
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	sort.Strings(lines)
	return strings.Join(lines, "\n")
}

func wantCode(t *testing.T, err error, code codes.Code) {
	t.Helper()
	if status.Code(err) != code {
		t.Fatalf("got %v, want code %v", err, code)
	}
}

// wantRefusal checks err's code and that its message says every part of
// want (the limit's config key, the field, ...).
func wantRefusal(t *testing.T, err error, code codes.Code, want ...string) {
	t.Helper()
	if status.Code(err) != code {
		t.Fatalf("got %v, want code %v", err, code)
	}
	for _, w := range want {
		if !strings.Contains(status.Convert(err).Message(), w) {
			t.Errorf("%q does not say %q", status.Convert(err).Message(), w)
		}
	}
}

func listNames(t *testing.T, srv *servertest.Server, location string) []string {
	t.Helper()
	resp, err := srv.Client.Backups.ListBackups(context.Background(), &ebv1.ListBackupsRequest{Location: location})
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, b := range resp.GetBackups() {
		names = append(names, b.GetName())
	}
	return names
}

// openUpload starts an upload of name that sends its header and one
// chunk, a whole etcd snapshot to the server's trailer check, then holds
// the stream open; cancel ends it.
func openUpload(t *testing.T, srv *servertest.Server, location, name string) (ebv1.BackupService_UploadBackupClient, context.CancelFunc) {
	t.Helper()
	return openUploadOf(t, srv, location, name, trailed(t, 1))
}

// openUploadOf is openUpload with first as its one chunk.
func openUploadOf(t *testing.T, srv *servertest.Server, location, name string, first []byte) (ebv1.BackupService_UploadBackupClient, context.CancelFunc) {
	t.Helper()
	// Bounded, so a server that never ends it fails the test instead of
	// hanging it.
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	stream, err := srv.Client.Backups.UploadBackup(ctx)
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

// waitInProgress waits until the location has n uploads in progress:
// the server claims an upload's name, then opens its temporary file.
func waitInProgress(t *testing.T, srv *servertest.Server, location string, n int) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		entries, err := os.ReadDir(filepath.Join(srv.Dirs[location], ".tmp"))
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
