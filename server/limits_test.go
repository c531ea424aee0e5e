package server_test

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/emptypb"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	ebv1 "github.com/kubectl-etcdbackup/kubectl-etcdbackup/api/etcdbackup/v1"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/server"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/server/auth"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/server/config"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/server/servertest"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/storage/filesystem"
)

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

func TestUploadsPerLocationLimit(t *testing.T) {
	srv := servertest.StartWith(t, servertest.Options{Locations: []string{"default", "other"}, Limits: config.Limits{UploadsPerLocation: 2}})
	first, cancelFirst := openUpload(t, srv, "default", "held-1")
	openUpload(t, srv, "default", "held-2")
	waitInProgress(t, srv, "default", 2)

	_, err := srv.Client.Upload(context.Background(), bytes.NewReader(trailed(t, 1)), &ebv1.UploadHeader{Name: "third"}, nil)
	wantRefusal(t, err, codes.ResourceExhausted, `2 uploads to location "default" are in progress`, "limits.uploadsPerLocation")
	// The limit is per location.
	if _, err := srv.Client.Upload(context.Background(), bytes.NewReader(trailed(t, 1)), &ebv1.UploadHeader{Name: "elsewhere", Location: "other"}, nil); err != nil {
		t.Fatalf("upload to another location: %v", err)
	}
	// A finished upload frees its slot.
	if _, err := first.CloseAndRecv(); err != nil {
		t.Fatal(err)
	}
	cancelFirst()
	if _, err := srv.Client.Upload(context.Background(), bytes.NewReader(trailed(t, 1)), &ebv1.UploadHeader{Name: "third"}, nil); err != nil {
		t.Fatalf("upload after one finished: %v", err)
	}
	if got := strings.Join(listNames(t, srv, "default"), ","); got != "third,held-1" {
		t.Errorf("listed %s; want third,held-1 (the refused upload stored nothing)", got)
	}
}

func TestIdleUploadIsAborted(t *testing.T) {
	const idle = 300 * time.Millisecond
	srv := servertest.StartWith(t, servertest.Options{Limits: config.Limits{UploadIdleTimeout: metav1.Duration{Duration: idle}}})
	before := tree(t, srv.Dir)

	stream, _ := openUpload(t, srv, "", "stalled")
	start := time.Now()
	err := stream.RecvMsg(&ebv1.UploadBackupResponse{})
	wantRefusal(t, err, codes.DeadlineExceeded, `upload of "stalled"`, "300ms", "limits.uploadIdleTimeout", "nothing was stored")
	if d := time.Since(start); d > 5*time.Second {
		t.Errorf("aborted after %s; the idle limit is %s", d, idle)
	}
	// Its name and temporary data are released.
	deadline := time.Now().Add(10 * time.Second)
	for tree(t, srv.Dir) != before {
		if time.Now().After(deadline) {
			t.Fatalf("the aborted upload left:\n%s", tree(t, srv.Dir))
		}
		time.Sleep(20 * time.Millisecond)
	}
	if _, err := srv.Client.Upload(context.Background(), bytes.NewReader(trailed(t, 1)), &ebv1.UploadHeader{Name: "stalled"}, nil); err != nil {
		t.Fatalf("upload of the aborted upload's name: %v", err)
	}

	// A stream that never sends its header is ended too.
	silent, err := srv.Client.Backups.UploadBackup(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	wantRefusal(t, silent.RecvMsg(&ebv1.UploadBackupResponse{}), codes.DeadlineExceeded, "no header", "limits.uploadIdleTimeout")

	// The limit is between messages, not on the whole upload: a slow
	// upload that keeps sending completes. Its seven chunks make one
	// snapshot whole to etcd's trailer.
	data := trailed(t, 7*512)
	slow, _ := openUploadOf(t, srv, "", "slow", data[:512])
	for i := 1; i <= 6; i++ {
		time.Sleep(idle / 3)
		end := (i + 1) * 512
		if i == 6 {
			end = len(data) // the last page and etcd's trailer
		}
		if err := slow.Send(&ebv1.UploadBackupRequest{Msg: &ebv1.UploadBackupRequest_Chunk{Chunk: data[i*512 : end]}}); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := slow.CloseAndRecv(); err != nil {
		t.Fatalf("slow upload sending every %s, for %s in all: %v", idle/3, 2*idle, err)
	}
}

func TestLabelAndFieldLimits(t *testing.T) {
	srv := servertest.StartWith(t, servertest.Options{Limits: config.Limits{MaxLabels: 3, MaxLabelBytes: 40, MaxFieldBytes: 16}})
	upload := func(h *ebv1.UploadHeader) error {
		h.Name = "b"
		_, err := srv.Client.Upload(context.Background(), bytes.NewReader(trailed(t, 1)), h, nil)
		return err
	}
	long := strings.Repeat("x", 17)
	for _, tc := range []struct {
		header *ebv1.UploadHeader
		want   []string
	}{
		{&ebv1.UploadHeader{Labels: map[string]string{"a": "1", "b": "2", "c": "3", "d": "4"}}, []string{"4 labels", "limit is 3", "limits.maxLabels"}},
		{&ebv1.UploadHeader{Labels: map[string]string{"key-one": strings.Repeat("v", 20), "key-two": strings.Repeat("w", 20)}}, []string{"54 bytes", "limit is 40", "limits.maxLabelBytes"}},
		{&ebv1.UploadHeader{Source: &ebv1.BackupSource{Description: long}}, []string{"source description is 17 bytes", "limit is 16", "limits.maxFieldBytes"}},
		{&ebv1.UploadHeader{Source: &ebv1.BackupSource{Target: long}}, []string{"source target", "limits.maxFieldBytes"}},
		{&ebv1.UploadHeader{Etcd: &ebv1.EtcdInfo{MemberName: long}}, []string{"etcd member name", "limits.maxFieldBytes"}},
		{&ebv1.UploadHeader{Etcd: &ebv1.EtcdInfo{Version: long}}, []string{"etcd version", "limits.maxFieldBytes"}},
	} {
		wantRefusal(t, upload(tc.header), codes.InvalidArgument, tc.want...)
	}
	if names := listNames(t, srv, ""); len(names) != 0 {
		t.Fatalf("refused uploads stored %v", names)
	}
	// At the limits is accepted.
	if err := upload(&ebv1.UploadHeader{Labels: map[string]string{"a": "1", "b": "2", "c": strings.Repeat("v", 35)}, Source: &ebv1.BackupSource{Description: long[:16]}}); err != nil {
		t.Fatalf("upload at the limits: %v", err)
	}

	// The defaults hold without configuration.
	def := servertest.Start(t, "")
	many := map[string]string{}
	for i := range 65 {
		many[fmt.Sprintf("l%d", i)] = "v"
	}
	_, err := def.Client.Upload(context.Background(), bytes.NewReader(trailed(t, 1)), &ebv1.UploadHeader{Name: "b", Labels: many}, nil)
	wantRefusal(t, err, codes.InvalidArgument, "65 labels", "limit is 64", "limits.maxLabels")
}

func TestMaxConcurrentStreams(t *testing.T) {
	srv := servertest.StartWith(t, servertest.Options{Limits: config.Limits{MaxConcurrentStreams: 2}})
	openUpload(t, srv, "default", "s1")
	openUpload(t, srv, "default", "s2")
	waitInProgress(t, srv, "default", 2)
	// A third stream on the same connection waits for a free one.
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	_, err := srv.Client.Info.GetServerInfo(ctx, &ebv1.GetServerInfoRequest{})
	wantCode(t, err, codes.DeadlineExceeded)
	// The limit is per connection.
	conn, err := grpc.NewClient("passthrough:///"+srv.Addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if _, err := ebv1.NewInfoServiceClient(conn).GetServerInfo(context.Background(), &ebv1.GetServerInfoRequest{}); err != nil {
		t.Fatalf("another connection: %v", err)
	}
}

// panicService is a service whose handlers panic, registered on the
// server's own gRPC server to reach its interceptors.
var panicService = grpc.ServiceDesc{
	ServiceName: "test.Panic",
	HandlerType: (*any)(nil),
	Methods: []grpc.MethodDesc{{MethodName: "Unary", Handler: func(srv any, ctx context.Context, dec func(any) error, ic grpc.UnaryServerInterceptor) (any, error) {
		in := new(emptypb.Empty)
		if err := dec(in); err != nil {
			return nil, err
		}
		h := func(context.Context, any) (any, error) { panic("unary handler exploded") }
		return ic(ctx, in, &grpc.UnaryServerInfo{Server: srv, FullMethod: "/test.Panic/Unary"}, h)
	}}},
	Streams: []grpc.StreamDesc{{StreamName: "Stream", ServerStreams: true, Handler: func(any, grpc.ServerStream) error {
		panic("stream handler exploded")
	}}},
}

type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

func TestPanicInHandlerIsInternal(t *testing.T) {
	loc, err := filesystem.New(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	var logs syncBuffer
	s, err := server.New(server.Config{Locations: []server.NamedLocation{{Name: "default", Location: loc}}, Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	if err != nil {
		t.Fatal(err)
	}
	g := s.NewGRPCServer(auth.AllowAll{})
	g.RegisterService(&panicService, struct{}{})
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = g.Serve(lis) }()
	t.Cleanup(g.Stop)
	conn, err := grpc.NewClient("passthrough:///"+lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ctx := context.Background()

	err = conn.Invoke(ctx, "/test.Panic/Unary", &emptypb.Empty{}, &emptypb.Empty{})
	wantRefusal(t, err, codes.Internal, "internal error; see the server log")
	stream, serr := conn.NewStream(ctx, &panicService.Streams[0], "/test.Panic/Stream")
	if serr != nil {
		t.Fatal(serr)
	}
	if err := stream.CloseSend(); err != nil {
		t.Fatal(err)
	}
	serr = stream.RecvMsg(&emptypb.Empty{})
	wantRefusal(t, serr, codes.Internal, "internal error; see the server log")
	for _, e := range []error{err, serr} {
		if strings.Contains(status.Convert(e).Message(), "exploded") {
			t.Errorf("the panic value reached the client: %v", e)
		}
	}

	// The server still serves.
	if _, err := ebv1.NewInfoServiceClient(conn).GetServerInfo(ctx, &ebv1.GetServerInfoRequest{}); err != nil {
		t.Fatalf("after the panics: %v", err)
	}
	for _, want := range []string{"unary handler exploded", "stream handler exploded", "method=/test.Panic/Unary", "limits_test.go"} {
		if !strings.Contains(logs.String(), want) {
			t.Errorf("the log does not say %q (panic value, method and stack):\n%s", want, logs.String())
		}
	}
}

func TestListBackupsPages(t *testing.T) {
	srv := servertest.Start(t, "")
	const n = 1203
	names := make([]string, n)
	for i := range names {
		names[i] = fmt.Sprintf("b-%04d", i)
	}
	created := time.Now().Add(-time.Hour)
	srv.WriteBackups(t, "default", created, names...)
	// Two more created at one instant: the order, and so the pages, go by
	// name among them.
	srv.WriteBackups(t, "default", created.Add(-time.Minute), "same-b")
	srv.WriteBackups(t, "default", created.Add(-time.Minute), "same-a")
	ctx := context.Background()

	list := func(req *ebv1.ListBackupsRequest) (pages []int, all []string) {
		t.Helper()
		for {
			resp, err := srv.Client.Backups.ListBackups(ctx, req)
			if err != nil {
				t.Fatal(err)
			}
			pages = append(pages, len(resp.GetBackups()))
			for _, b := range resp.GetBackups() {
				all = append(all, b.GetName())
			}
			if resp.GetNextPageToken() == "" {
				return pages, all
			}
			req.PageToken = resp.GetNextPageToken()
		}
	}
	pages, all := list(&ebv1.ListBackupsRequest{})
	if fmt.Sprint(pages) != "[500 500 205]" || len(all) != n+2 || all[0] != "b-1202" || all[n-1] != "b-0000" || all[n] != "same-a" || all[n+1] != "same-b" {
		t.Fatalf("pages %v, %d backups, first %s, last %v", pages, len(all), all[0], all[n-1:])
	}
	if pages, _ := list(&ebv1.ListBackupsRequest{PageSize: 5000}); fmt.Sprint(pages) != "[1000 205]" {
		t.Errorf("page size 5000: pages %v; want at most 1000 each", pages)
	}
	if pages, _ := list(&ebv1.ListBackupsRequest{PageSize: 600}); fmt.Sprint(pages) != "[600 600 5]" {
		t.Errorf("page size 600: pages %v", pages)
	}

	// A backup deleted between pages does not shift the next page: each
	// backup is listed once.
	first, err := srv.Client.Backups.ListBackups(ctx, &ebv1.ListBackupsRequest{PageSize: 10})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := srv.Client.Backups.DeleteBackup(ctx, &ebv1.DeleteBackupRequest{Name: "b-1200"}); err != nil {
		t.Fatal(err)
	}
	next, err := srv.Client.Backups.ListBackups(ctx, &ebv1.ListBackupsRequest{PageSize: 10, PageToken: first.GetNextPageToken()})
	if err != nil {
		t.Fatal(err)
	}
	if got := next.GetBackups()[0].GetName(); got != "b-1192" {
		t.Errorf("the page after b-1193 starts at %s; want b-1192", got)
	}

	_, err = srv.Client.Backups.ListBackups(ctx, &ebv1.ListBackupsRequest{PageToken: "not-a-token"})
	wantRefusal(t, err, codes.InvalidArgument, "page token")
	_, err = srv.Client.Backups.ListBackups(ctx, &ebv1.ListBackupsRequest{PageToken: first.GetNextPageToken(), LabelSelector: "env=prod"})
	wantRefusal(t, err, codes.InvalidArgument, "page token", "env=prod")
	_, err = srv.Client.Backups.ListBackups(ctx, &ebv1.ListBackupsRequest{PageSize: -1})
	wantRefusal(t, err, codes.InvalidArgument, "page size")
}
