package rpc_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"

	ebv1 "github.com/kubectl-etcdbackup/kubectl-etcdbackup/api/etcdbackup/v1"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/client"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/server/config"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/server/rpc"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/server/servertest"
)

// An empty upload is no etcd snapshot: it is refused as such, saying what
// to upload instead, and nothing is stored.
func TestEmptyBackup(t *testing.T) {
	ts := servertest.Start(t, "")
	before := servertest.Tree(t, ts.Dir)
	_, err := ts.Client.Upload(context.Background(), bytes.NewReader(nil), &ebv1.UploadHeader{Name: "empty"}, nil)
	servertest.WantCode(t, err, codes.DataLoss)
	for _, want := range []string{`upload of "empty"`, "not a whole etcd snapshot", "ended after 0 bytes", "nothing was stored", "etcdutl snapshot save"} {
		if !strings.Contains(status.Convert(err).Message(), want) {
			t.Errorf("message %q does not say %q", status.Convert(err).Message(), want)
		}
	}
	if names := ts.Names(t, ""); len(names) != 0 {
		t.Fatalf("listed after the refused empty upload: %v", names)
	}
	_, err = ts.Client.Download(context.Background(), io.Discard, client.DownloadRequest{Name: "empty"})
	servertest.WantCode(t, err, codes.NotFound)
	if after := servertest.Tree(t, ts.Dir); after != before {
		t.Fatalf("disk changed:\nbefore:\n%s\nafter:\n%s", before, after)
	}
}

func TestWrongDeclaredChecksumIsDataLossAndStoresNothing(t *testing.T) {
	ts := servertest.Start(t, "")
	// Whole to etcd's trailer check: only the declared checksum or size
	// is wrong.
	data := trailed(t, 1<<20)
	before := servertest.Tree(t, ts.Dir)
	wrong := sha([]byte("something else"))
	_, err := ts.Client.Upload(context.Background(), bytes.NewReader(data), &ebv1.UploadHeader{Name: "bad", ExpectedSha256: wrong}, nil)
	servertest.WantCode(t, err, codes.DataLoss)
	if !strings.Contains(status.Convert(err).Message(), "nothing was stored") {
		t.Fatalf("message does not say nothing was stored: %v", err)
	}
	size := int64(len(data) + 1)
	_, err = ts.Client.Upload(context.Background(), bytes.NewReader(data), &ebv1.UploadHeader{Name: "bad", ExpectedSize: &size}, nil)
	servertest.WantCode(t, err, codes.DataLoss)
	size = int64(len(data) - 1)
	_, err = ts.Client.Upload(context.Background(), bytes.NewReader(data), &ebv1.UploadHeader{Name: "bad", ExpectedSize: &size}, nil)
	servertest.WantCode(t, err, codes.DataLoss)
	if names := ts.Names(t, ""); len(names) != 0 {
		t.Fatalf("listed after failed uploads: %v", names)
	}
	if after := servertest.Tree(t, ts.Dir); after != before {
		t.Fatalf("disk changed:\nbefore:\n%s\nafter:\n%s", before, after)
	}
	// The right checksum is accepted.
	if _, err := ts.Client.Upload(context.Background(), bytes.NewReader(data), &ebv1.UploadHeader{Name: "bad", ExpectedSha256: sha(data)}, nil); err != nil {
		t.Fatal(err)
	}
}

// A user's plain upload is held to etcd's trailer as an agent's is: random
// bytes are refused as DataLoss that names etcd's check and says what to
// upload, nothing is listed and no temporary data is left; bytes that end
// in their SHA-256 are stored.
func TestUserUploadIsCheckedAgainstEtcdsTrailer(t *testing.T) {
	ts := servertest.Start(t, "")
	ctx := context.Background()
	before := servertest.Tree(t, ts.Dir)
	junk := randomBytes(t, 4096+32) // a snapshot's size, not its trailer
	_, err := ts.Client.Upload(ctx, bytes.NewReader(junk), &ebv1.UploadHeader{Name: "junk"}, nil)
	servertest.WantCode(t, err, codes.DataLoss)
	for _, want := range []string{`upload of "junk"`, "not a whole etcd snapshot", "etcd's own check", "etcd's SHA-256 trailer does not match", "nothing was stored", "etcdutl snapshot save"} {
		if !strings.Contains(status.Convert(err).Message(), want) {
			t.Errorf("message %q does not say %q", status.Convert(err).Message(), want)
		}
	}
	cut := trailed(t, 4096)
	_, err = ts.Client.Upload(ctx, bytes.NewReader(cut[:len(cut)-1]), &ebv1.UploadHeader{Name: "junk"}, nil)
	servertest.WantCode(t, err, codes.DataLoss)
	if !strings.Contains(status.Convert(err).Message(), "not a whole database") {
		t.Errorf("a cut snapshot: %v; want it said", err)
	}
	if names := ts.Names(t, ""); len(names) != 0 {
		t.Fatalf("listed after refused uploads: %v", names)
	}
	if entries, err := os.ReadDir(filepath.Join(ts.Dir, ".tmp")); err != nil || len(entries) != 0 {
		t.Fatalf("the location's temporary space holds %d files after refused uploads (%v)", len(entries), err)
	}
	if after := servertest.Tree(t, ts.Dir); after != before {
		t.Fatalf("disk changed:\nbefore:\n%s\nafter:\n%s", before, after)
	}

	b := ts.Upload(t, "junk", cut)
	if b.GetSize() != int64(len(cut)) || b.GetSha256() != sha(cut) || b.GetSource().GetKind() != "upload" {
		t.Fatalf("stored %d bytes, SHA-256 %s, source %q; want %d, %s, upload", b.GetSize(), b.GetSha256(), b.GetSource().GetKind(), len(cut), sha(cut))
	}
}

func TestTrailerMismatchIsDataLoss(t *testing.T) {
	ts := servertest.Start(t, "")
	stream, err := ts.Client.Backups.UploadBackup(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	send := func(m *ebv1.UploadBackupRequest) {
		if err := stream.Send(m); err != nil && !errors.Is(err, io.EOF) {
			t.Fatal(err)
		}
	}
	// Whole to etcd's trailer check: only the client's trailer is wrong.
	data := trailed(t, 1)
	send(&ebv1.UploadBackupRequest{Msg: &ebv1.UploadBackupRequest_Header{Header: &ebv1.UploadHeader{Name: "x"}}})
	send(&ebv1.UploadBackupRequest{Msg: &ebv1.UploadBackupRequest_Chunk{Chunk: data}})
	send(&ebv1.UploadBackupRequest{Msg: &ebv1.UploadBackupRequest_Trailer{Trailer: &ebv1.UploadTrailer{Size: int64(len(data)), Sha256: sha([]byte("HELLO"))}}})
	_, err = stream.CloseAndRecv()
	servertest.WantCode(t, err, codes.DataLoss)
	if !strings.Contains(status.Convert(err).Message(), "the client sent") {
		t.Fatalf("refused, but not for the trailer's SHA-256: %v", err)
	}
	if names := ts.Names(t, ""); len(names) != 0 {
		t.Fatalf("listed: %v", names)
	}
}

// blockingReader yields n bytes, then blocks until released.
type blockingReader struct {
	r       io.Reader
	reached chan struct{}
	once    sync.Once
	release chan struct{}
}

func (b *blockingReader) Read(p []byte) (int, error) {
	n, err := b.r.Read(p)
	if errors.Is(err, io.EOF) {
		b.once.Do(func() { close(b.reached) })
		<-b.release
	}
	return n, err
}

func TestCancelledUploadLeavesNothing(t *testing.T) {
	ts := servertest.Start(t, "")
	before := servertest.Tree(t, ts.Dir)
	r := &blockingReader{r: bytes.NewReader(randomBytes(t, 3<<20)), reached: make(chan struct{}), release: make(chan struct{})}
	ctx, cancel := context.WithCancel(context.Background())
	errc := make(chan error, 1)
	go func() {
		_, err := ts.Client.Upload(ctx, r, &ebv1.UploadHeader{Name: "cancelled"}, nil)
		errc <- err
	}()
	<-r.reached
	// While in progress: not listed, and a second upload of the name is
	// refused at once.
	if names := ts.Names(t, ""); len(names) != 0 {
		t.Fatalf("an upload in progress is listed: %v", names)
	}
	_, err := ts.Client.Upload(context.Background(), bytes.NewReader([]byte("x")), &ebv1.UploadHeader{Name: "cancelled"}, nil)
	servertest.WantCode(t, err, codes.AlreadyExists)
	cancel()
	close(r.release)
	servertest.WantCode(t, <-errc, codes.Canceled)
	// The server learns of the cancellation asynchronously.
	if err := wait.PollUntilContextTimeout(t.Context(), 20*time.Millisecond, 10*time.Second, true, func(context.Context) (bool, error) {
		return servertest.Tree(t, ts.Dir) == before, nil
	}); err != nil {
		t.Fatalf("garbage left after cancelled upload:\n%s", servertest.Tree(t, ts.Dir))
	}
	if names := ts.Names(t, ""); len(names) != 0 {
		t.Fatalf("listed after cancel: %v", names)
	}
}

func TestRestartCleansInterruptedUploads(t *testing.T) {
	dir := t.TempDir()
	ts := servertest.Start(t, dir)
	ts.Upload(t, "kept", trailed(t, 1))
	ts.Stop()
	// What a crash leaves: a temporary upload, and data published without
	// its manifest.
	if err := os.WriteFile(filepath.Join(dir, ".tmp", "upload-123.db"), []byte("partial"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "backups", "orphan.db"), []byte("no manifest"), 0o600); err != nil {
		t.Fatal(err)
	}
	ts2 := servertest.Start(t, dir)
	if names := ts2.Names(t, ""); len(names) != 1 || names[0] != "kept" {
		t.Fatalf("list = %v", names)
	}
	for _, p := range []string{".tmp/upload-123.db", "backups/orphan.db"} {
		if _, err := os.Stat(filepath.Join(dir, p)); !errors.Is(err, fs.ErrNotExist) {
			t.Errorf("%s not cleaned: %v", p, err)
		}
	}
	// The orphan's name is free again.
	ts2.Upload(t, "orphan", trailed(t, 1))
}

// An oversized chunk is refused rather than buffered.
func TestChunkLimit(t *testing.T) {
	ts := servertest.Start(t, "")
	stream, err := ts.Client.Backups.UploadBackup(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	_ = stream.Send(&ebv1.UploadBackupRequest{Msg: &ebv1.UploadBackupRequest_Header{Header: &ebv1.UploadHeader{Name: "big"}}})
	_ = stream.Send(&ebv1.UploadBackupRequest{Msg: &ebv1.UploadBackupRequest_Chunk{Chunk: make([]byte, rpc.MaxChunkBytes+1)}})
	_, err = stream.CloseAndRecv()
	servertest.WantCode(t, err, codes.InvalidArgument)
	if names := ts.Names(t, ""); len(names) != 0 {
		t.Fatalf("listed: %v", names)
	}
}

func TestUploadsPerLocationLimit(t *testing.T) {
	srv := servertest.StartWith(t, servertest.Options{Locations: []string{"default", "other"}, Limits: config.Limits{UploadsPerLocation: 2}})
	first, cancelFirst := srv.OpenUpload(t, "default", "held-1")
	srv.OpenUpload(t, "default", "held-2")
	srv.WaitInProgress(t, "default", 2)

	_, err := srv.Client.Upload(context.Background(), bytes.NewReader(trailed(t, 1)), &ebv1.UploadHeader{Name: "third"}, nil)
	servertest.WantRefusal(t, err, codes.ResourceExhausted, `2 uploads to location "default" are in progress`, "limits.uploadsPerLocation")
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
	if got := strings.Join(srv.Names(t, "default"), ","); got != "third,held-1" {
		t.Errorf("listed %s; want third,held-1 (the refused upload stored nothing)", got)
	}
}

func TestIdleUploadIsAborted(t *testing.T) {
	const idle = 300 * time.Millisecond
	srv := servertest.StartWith(t, servertest.Options{Limits: config.Limits{UploadIdleTimeout: metav1.Duration{Duration: idle}}})
	before := servertest.Tree(t, srv.Dir)

	stream, _ := srv.OpenUpload(t, "", "stalled")
	start := time.Now()
	err := stream.RecvMsg(&ebv1.UploadBackupResponse{})
	servertest.WantRefusal(t, err, codes.DeadlineExceeded, `upload of "stalled"`, "300ms", "limits.uploadIdleTimeout", "nothing was stored")
	if d := time.Since(start); d > 5*time.Second {
		t.Errorf("aborted after %s; the idle limit is %s", d, idle)
	}
	// Its name and temporary data are released.
	if err := wait.PollUntilContextTimeout(t.Context(), 20*time.Millisecond, 10*time.Second, true, func(context.Context) (bool, error) {
		return servertest.Tree(t, srv.Dir) == before, nil
	}); err != nil {
		t.Fatalf("the aborted upload left:\n%s", servertest.Tree(t, srv.Dir))
	}
	if _, err := srv.Client.Upload(context.Background(), bytes.NewReader(trailed(t, 1)), &ebv1.UploadHeader{Name: "stalled"}, nil); err != nil {
		t.Fatalf("upload of the aborted upload's name: %v", err)
	}

	// A stream that never sends its header is ended too.
	silent, err := srv.Client.Backups.UploadBackup(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	servertest.WantRefusal(t, silent.RecvMsg(&ebv1.UploadBackupResponse{}), codes.DeadlineExceeded, "no header", "limits.uploadIdleTimeout")

	// The limit is between messages, not on the whole upload: a slow
	// upload that keeps sending completes. Its seven chunks make one
	// snapshot whole to etcd's trailer.
	data := trailed(t, 7*512)
	slow, _ := srv.OpenUploadOf(t, "", "slow", data[:512])
	for i := 1; i <= 6; i++ {
		// The spacing of the messages is what is under test: the server's
		// idle timer runs on real time between real gRPC messages, with no
		// condition to wait for and no clock to inject (100 ms).
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
		// Text printed on operators' terminals: no escape sequences.
		{&ebv1.UploadHeader{Source: &ebv1.BackupSource{Description: "a\x1b]0;x\x07"}}, []string{"source description holds control character U+001B at byte 1", "plain text"}},
		{&ebv1.UploadHeader{Source: &ebv1.BackupSource{Target: "cp\r"}}, []string{"source target holds control character U+000D"}},
	} {
		servertest.WantRefusal(t, upload(tc.header), codes.InvalidArgument, tc.want...)
	}
	if names := srv.Names(t, ""); len(names) != 0 {
		t.Fatalf("refused uploads stored %v", names)
	}
	// At the limits is accepted.
	if err := upload(&ebv1.UploadHeader{Labels: map[string]string{"a": "1", "b": "2", "c": strings.Repeat("v", 35)}, Source: &ebv1.BackupSource{Description: "ünïcode ok " + long[:3]}}); err != nil {
		t.Fatalf("upload at the limits: %v", err)
	}

	// The defaults hold without configuration.
	def := servertest.Start(t, "")
	many := map[string]string{}
	for i := range 65 {
		many[fmt.Sprintf("l%d", i)] = "v"
	}
	_, err := def.Client.Upload(context.Background(), bytes.NewReader(trailed(t, 1)), &ebv1.UploadHeader{Name: "b", Labels: many}, nil)
	servertest.WantRefusal(t, err, codes.InvalidArgument, "65 labels", "limit is 64", "limits.maxLabels")
}
