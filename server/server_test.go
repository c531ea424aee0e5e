package server_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"

	ebv1 "github.com/kubectl-etcdbackup/kubectl-etcdbackup/api/etcdbackup/v1"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/client"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/internal/etcdtest"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/server"
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

func TestUploadListDownloadRoundTrip(t *testing.T) {
	ts := startServer(t, "")
	data := trailed(t, 5<<20+123) // several chunks and a partial one: 5 MiB + 544
	b := ts.upload(t, "etcd-1", data)
	if b.GetSize() != int64(len(data)) || b.GetSha256() != sha(data) {
		t.Fatalf("stored %d bytes sha %s; want %d bytes sha %s", b.GetSize(), b.GetSha256(), len(data), sha(data))
	}
	if b.GetPhase() != ebv1.BackupPhase_BACKUP_PHASE_COMPLETED || b.GetSource().GetKind() != "upload" || b.GetCreateTime() == nil {
		t.Fatalf("unexpected metadata: %v", b)
	}
	if got := ts.names(t); len(got) != 1 || got[0] != "etcd-1" {
		t.Fatalf("list = %v, want [etcd-1]", got)
	}
	var out bytes.Buffer
	got, err := ts.client.Download(context.Background(), &out, client.DownloadRequest{Name: "etcd-1"})
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(out.Bytes(), data) {
		t.Fatalf("downloaded %d bytes differ from the %d uploaded", out.Len(), len(data))
	}
	if got.GetSha256() != sha(out.Bytes()) {
		t.Fatalf("header sha %s, data sha %s", got.GetSha256(), sha(out.Bytes()))
	}
	// Survives a restart of the server on the same directory.
	ts.stop()
	ts2 := startServer(t, ts.dir)
	out.Reset()
	if _, err := ts2.client.Download(context.Background(), &out, client.DownloadRequest{Name: "etcd-1"}); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(out.Bytes(), data) {
		t.Fatal("data changed across restart")
	}
}

// An empty upload is no etcd snapshot: it is refused as such, saying what
// to upload instead, and nothing is stored.
func TestEmptyBackup(t *testing.T) {
	ts := startServer(t, "")
	before := tree(t, ts.dir)
	_, err := ts.client.Upload(context.Background(), bytes.NewReader(nil), &ebv1.UploadHeader{Name: "empty"}, nil)
	wantCode(t, err, codes.DataLoss)
	for _, want := range []string{`upload of "empty"`, "not a whole etcd snapshot", "ended after 0 bytes", "nothing was stored", "etcdutl snapshot save"} {
		if !strings.Contains(status.Convert(err).Message(), want) {
			t.Errorf("message %q does not say %q", status.Convert(err).Message(), want)
		}
	}
	if names := ts.names(t); len(names) != 0 {
		t.Fatalf("listed after the refused empty upload: %v", names)
	}
	_, err = ts.client.Download(context.Background(), io.Discard, client.DownloadRequest{Name: "empty"})
	wantCode(t, err, codes.NotFound)
	if after := tree(t, ts.dir); after != before {
		t.Fatalf("disk changed:\nbefore:\n%s\nafter:\n%s", before, after)
	}
}

func TestDownloadFromOffset(t *testing.T) {
	ts := startServer(t, "")
	data := trailed(t, 3<<20) // 3 MiB + 32
	ts.upload(t, "b", data)
	for _, off := range []int64{0, 1, 1 << 20, int64(len(data)) - 1, int64(len(data))} {
		prefix := sha256.New()
		prefix.Write(data[:off])
		var out bytes.Buffer
		if _, err := ts.client.Download(context.Background(), &out, client.DownloadRequest{Name: "b", Offset: off, Prefix: prefix}); err != nil {
			t.Fatalf("offset %d: %v", off, err)
		}
		if !bytes.Equal(out.Bytes(), data[off:]) {
			t.Fatalf("offset %d: wrong bytes", off)
		}
	}
	stream, err := ts.client.Backups.DownloadBackup(context.Background(), &ebv1.DownloadBackupRequest{Name: "b", Offset: int64(len(data)) + 1})
	if err == nil {
		_, err = stream.Recv()
	}
	wantCode(t, err, codes.OutOfRange)
	if !strings.Contains(status.Convert(err).Message(), "past the end") {
		t.Fatalf("message does not explain: %v", err)
	}
}

// A length asks for a range: the stream carries exactly those bytes (cut
// at the end of the backup) and its header says how many.
func TestDownloadRange(t *testing.T) {
	ts := startServer(t, "")
	data := trailed(t, 3<<20+5) // 3 MiB + 32: not a whole number of chunks
	ts.upload(t, "b", data)
	size := int64(len(data))
	for _, r := range [][2]int64{{0, 1}, {0, 1 << 20}, {7, 2<<20 + 3}, {size - 5, 5}, {size - 5, 1 << 30}, {1 << 20, 0}} {
		stream, err := ts.client.Backups.DownloadBackup(context.Background(), &ebv1.DownloadBackupRequest{Name: "b", Offset: r[0], Length: r[1]})
		if err != nil {
			t.Fatal(err)
		}
		end := size
		if r[1] > 0 {
			end = min(size, r[0]+r[1])
		}
		var got []byte
		for {
			m, err := stream.Recv()
			if errors.Is(err, io.EOF) {
				break
			}
			if err != nil {
				t.Fatalf("range %v: %v", r, err)
			}
			if h := m.GetHeader(); h != nil && (h.GetOffset() != r[0] || h.GetLength() != end-r[0]) {
				t.Fatalf("range %v: header says offset %d, length %d; want %d, %d", r, h.GetOffset(), h.GetLength(), r[0], end-r[0])
			}
			got = append(got, m.GetChunk()...)
		}
		if !bytes.Equal(got, data[r[0]:end]) {
			t.Fatalf("range %v: got %d bytes, want bytes %d-%d", r, len(got), r[0], end)
		}
	}
	stream, err := ts.client.Backups.DownloadBackup(context.Background(), &ebv1.DownloadBackupRequest{Name: "b", Length: -1})
	if err == nil {
		_, err = stream.Recv()
	}
	wantCode(t, err, codes.InvalidArgument)
	if !strings.Contains(status.Convert(err).Message(), "length -1 is negative") {
		t.Fatalf("message does not name the length: %v", err)
	}
}

func TestWrongDeclaredChecksumIsDataLossAndStoresNothing(t *testing.T) {
	ts := startServer(t, "")
	// Whole to etcd's trailer check: only the declared checksum or size
	// is wrong.
	data := trailed(t, 1<<20)
	before := tree(t, ts.dir)
	wrong := sha([]byte("something else"))
	_, err := ts.client.Upload(context.Background(), bytes.NewReader(data), &ebv1.UploadHeader{Name: "bad", ExpectedSha256: wrong}, nil)
	wantCode(t, err, codes.DataLoss)
	if !strings.Contains(status.Convert(err).Message(), "nothing was stored") {
		t.Fatalf("message does not say nothing was stored: %v", err)
	}
	size := int64(len(data) + 1)
	_, err = ts.client.Upload(context.Background(), bytes.NewReader(data), &ebv1.UploadHeader{Name: "bad", ExpectedSize: &size}, nil)
	wantCode(t, err, codes.DataLoss)
	size = int64(len(data) - 1)
	_, err = ts.client.Upload(context.Background(), bytes.NewReader(data), &ebv1.UploadHeader{Name: "bad", ExpectedSize: &size}, nil)
	wantCode(t, err, codes.DataLoss)
	if names := ts.names(t); len(names) != 0 {
		t.Fatalf("listed after failed uploads: %v", names)
	}
	if after := tree(t, ts.dir); after != before {
		t.Fatalf("disk changed:\nbefore:\n%s\nafter:\n%s", before, after)
	}
	// The right checksum is accepted.
	if _, err := ts.client.Upload(context.Background(), bytes.NewReader(data), &ebv1.UploadHeader{Name: "bad", ExpectedSha256: sha(data)}, nil); err != nil {
		t.Fatal(err)
	}
}

// A user's plain upload is held to etcd's trailer as an agent's is: random
// bytes are refused as DataLoss that names etcd's check and says what to
// upload, nothing is listed and no temporary data is left; bytes that end
// in their SHA-256 are stored.
func TestUserUploadIsCheckedAgainstEtcdsTrailer(t *testing.T) {
	ts := startServer(t, "")
	ctx := context.Background()
	before := tree(t, ts.dir)
	junk := randomBytes(t, 4096+32) // a snapshot's size, not its trailer
	_, err := ts.client.Upload(ctx, bytes.NewReader(junk), &ebv1.UploadHeader{Name: "junk"}, nil)
	wantCode(t, err, codes.DataLoss)
	for _, want := range []string{`upload of "junk"`, "not a whole etcd snapshot", "etcd's own check", "etcd's SHA-256 trailer does not match", "nothing was stored", "etcdutl snapshot save"} {
		if !strings.Contains(status.Convert(err).Message(), want) {
			t.Errorf("message %q does not say %q", status.Convert(err).Message(), want)
		}
	}
	cut := trailed(t, 4096)
	_, err = ts.client.Upload(ctx, bytes.NewReader(cut[:len(cut)-1]), &ebv1.UploadHeader{Name: "junk"}, nil)
	wantCode(t, err, codes.DataLoss)
	if !strings.Contains(status.Convert(err).Message(), "not a whole database") {
		t.Errorf("a cut snapshot: %v; want it said", err)
	}
	if names := ts.names(t); len(names) != 0 {
		t.Fatalf("listed after refused uploads: %v", names)
	}
	if entries, err := os.ReadDir(filepath.Join(ts.dir, ".tmp")); err != nil || len(entries) != 0 {
		t.Fatalf("the location's temporary space holds %d files after refused uploads (%v)", len(entries), err)
	}
	if after := tree(t, ts.dir); after != before {
		t.Fatalf("disk changed:\nbefore:\n%s\nafter:\n%s", before, after)
	}

	b := ts.upload(t, "junk", cut)
	if b.GetSize() != int64(len(cut)) || b.GetSha256() != sha(cut) || b.GetSource().GetKind() != "upload" {
		t.Fatalf("stored %d bytes, SHA-256 %s, source %q; want %d, %s, upload", b.GetSize(), b.GetSha256(), b.GetSource().GetKind(), len(cut), sha(cut))
	}
}

func TestTrailerMismatchIsDataLoss(t *testing.T) {
	ts := startServer(t, "")
	stream, err := ts.client.Backups.UploadBackup(context.Background())
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
	wantCode(t, err, codes.DataLoss)
	if !strings.Contains(status.Convert(err).Message(), "the client sent") {
		t.Fatalf("refused, but not for the trailer's SHA-256: %v", err)
	}
	if names := ts.names(t); len(names) != 0 {
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
	ts := startServer(t, "")
	before := tree(t, ts.dir)
	r := &blockingReader{r: bytes.NewReader(randomBytes(t, 3<<20)), reached: make(chan struct{}), release: make(chan struct{})}
	ctx, cancel := context.WithCancel(context.Background())
	errc := make(chan error, 1)
	go func() {
		_, err := ts.client.Upload(ctx, r, &ebv1.UploadHeader{Name: "cancelled"}, nil)
		errc <- err
	}()
	<-r.reached
	// While in progress: not listed, and a second upload of the name is
	// refused at once.
	if names := ts.names(t); len(names) != 0 {
		t.Fatalf("an upload in progress is listed: %v", names)
	}
	_, err := ts.client.Upload(context.Background(), bytes.NewReader([]byte("x")), &ebv1.UploadHeader{Name: "cancelled"}, nil)
	wantCode(t, err, codes.AlreadyExists)
	cancel()
	close(r.release)
	wantCode(t, <-errc, codes.Canceled)
	// The server learns of the cancellation asynchronously.
	deadline := time.Now().Add(10 * time.Second)
	for tree(t, ts.dir) != before {
		if time.Now().After(deadline) {
			t.Fatalf("garbage left after cancelled upload:\n%s", tree(t, ts.dir))
		}
		time.Sleep(20 * time.Millisecond)
	}
	if names := ts.names(t); len(names) != 0 {
		t.Fatalf("listed after cancel: %v", names)
	}
}

func TestRestartCleansInterruptedUploads(t *testing.T) {
	dir := t.TempDir()
	ts := startServer(t, dir)
	ts.upload(t, "kept", trailed(t, 1))
	ts.stop()
	// What a crash leaves: a temporary upload, and data published without
	// its manifest.
	if err := os.WriteFile(filepath.Join(dir, ".tmp", "upload-123.db"), []byte("partial"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "backups", "orphan.db"), []byte("no manifest"), 0o600); err != nil {
		t.Fatal(err)
	}
	ts2 := startServer(t, dir)
	if names := ts2.names(t); len(names) != 1 || names[0] != "kept" {
		t.Fatalf("list = %v", names)
	}
	for _, p := range []string{".tmp/upload-123.db", "backups/orphan.db"} {
		if _, err := os.Stat(filepath.Join(dir, p)); !errors.Is(err, fs.ErrNotExist) {
			t.Errorf("%s not cleaned: %v", p, err)
		}
	}
	// The orphan's name is free again.
	ts2.upload(t, "orphan", trailed(t, 1))
}

func TestBadNamesAreInvalidArgumentAndTouchNothing(t *testing.T) {
	ts := startServer(t, "")
	ts.upload(t, "existing", trailed(t, 1))
	if err := os.WriteFile(filepath.Join(filepath.Dir(ts.dir), "x.json"), []byte(`{"name":"x"}`), 0o600); err != nil {
		t.Fatal(err)
	}
	before := tree(t, filepath.Dir(ts.dir))
	bad := []string{"../x", "/abs", "", strings.Repeat("a", 300), "UPPER", "a/b", ".", "..", "x\x00y", "-lead"}
	ctx := context.Background()
	for _, name := range bad {
		_, err := ts.client.Upload(ctx, bytes.NewReader([]byte("data")), &ebv1.UploadHeader{Name: name}, nil)
		wantCode(t, err, codes.InvalidArgument)
		_, err = ts.client.Backups.GetBackup(ctx, &ebv1.GetBackupRequest{Name: name})
		wantCode(t, err, codes.InvalidArgument)
		_, err = ts.client.Backups.DeleteBackup(ctx, &ebv1.DeleteBackupRequest{Name: name})
		wantCode(t, err, codes.InvalidArgument)
		_, err = ts.client.Download(ctx, io.Discard, client.DownloadRequest{Name: name})
		wantCode(t, err, codes.InvalidArgument)
		_, err = ts.client.Backups.ListBackups(ctx, &ebv1.ListBackupsRequest{Location: name})
		if name == "" {
			if err != nil {
				t.Fatal(err)
			}
		} else {
			wantCode(t, err, codes.NotFound)
		}
	}
	if after := tree(t, filepath.Dir(ts.dir)); after != before {
		t.Fatalf("disk changed:\nbefore:\n%s\nafter:\n%s", before, after)
	}
	// The message says what is wrong.
	_, err := ts.client.Backups.GetBackup(ctx, &ebv1.GetBackupRequest{Name: strings.Repeat("a", 300)})
	if !strings.Contains(status.Convert(err).Message(), "limit is 200") {
		t.Fatalf("unhelpful message: %v", err)
	}
	// Bad labels, hash formats and compression are refused too.
	for _, h := range []*ebv1.UploadHeader{
		{Name: "ok", Labels: map[string]string{"bad key!": "v"}},
		{Name: "ok", ExpectedSha256: "not-hex"},
		{Name: "ok", ExpectedSha256: strings.ToUpper(sha(nil))},
		{Name: "ok", Compression: "gzip"},
		{Name: "ok", Source: &ebv1.BackupSource{Kind: "stolen"}},
	} {
		_, err := ts.client.Upload(ctx, bytes.NewReader([]byte("data")), h, nil)
		wantCode(t, err, codes.InvalidArgument)
	}
	if after := tree(t, filepath.Dir(ts.dir)); after != before {
		t.Fatalf("disk changed by bad headers")
	}
}

func TestImmutableAndNotFound(t *testing.T) {
	ts := startServer(t, "")
	ctx := context.Background()
	first := trailed(t, 1)
	ts.upload(t, "a", first)
	_, err := ts.client.Upload(ctx, bytes.NewReader(trailed(t, 1)), &ebv1.UploadHeader{Name: "a"}, nil)
	wantCode(t, err, codes.AlreadyExists)
	var out bytes.Buffer
	if _, err := ts.client.Download(ctx, &out, client.DownloadRequest{Name: "a"}); err != nil || !bytes.Equal(out.Bytes(), first) {
		t.Fatalf("original changed: %d bytes, equal %v, %v", out.Len(), bytes.Equal(out.Bytes(), first), err)
	}
	_, err = ts.client.Backups.GetBackup(ctx, &ebv1.GetBackupRequest{Name: "missing"})
	wantCode(t, err, codes.NotFound)
	_, err = ts.client.Download(ctx, io.Discard, client.DownloadRequest{Name: "missing"})
	wantCode(t, err, codes.NotFound)
	if _, err := ts.client.Backups.DeleteBackup(ctx, &ebv1.DeleteBackupRequest{Name: "a"}); err != nil {
		t.Fatal(err)
	}
	_, err = ts.client.Backups.DeleteBackup(ctx, &ebv1.DeleteBackupRequest{Name: "a"})
	wantCode(t, err, codes.NotFound)
	// Deleted names can be reused.
	ts.upload(t, "a", trailed(t, 1))
}

func TestConcurrentDownloads(t *testing.T) {
	ts := startServer(t, "")
	data := trailed(t, 8<<20)
	ts.upload(t, "shared", data)
	var wg sync.WaitGroup
	errs := make(chan error, 8)
	for i := 0; i < 8; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			h := sha256.New()
			n := &countingWriter{w: h}
			b, err := ts.client.Download(context.Background(), n, client.DownloadRequest{Name: "shared"})
			if err == nil && (n.n != int64(len(data)) || hex.EncodeToString(h.Sum(nil)) != sha(data) || b.GetSha256() != sha(data)) {
				err = errors.New("wrong bytes")
			}
			errs <- err
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Error(err)
		}
	}
}

type countingWriter struct {
	w io.Writer
	n int64
}

func (c *countingWriter) Write(p []byte) (int, error) {
	c.n += int64(len(p))
	return c.w.Write(p)
}

func TestListFiltersAndSorts(t *testing.T) {
	ts := startServer(t, "")
	ctx := context.Background()
	for _, n := range []string{"b", "a", "c"} {
		if _, err := ts.client.Upload(ctx, bytes.NewReader(trailed(t, 1)), &ebv1.UploadHeader{Name: n, Labels: map[string]string{"env": map[bool]string{true: "prod", false: "dev"}[n != "b"]}}, nil); err != nil {
			t.Fatal(err)
		}
		time.Sleep(5 * time.Millisecond)
	}
	resp, err := ts.client.Backups.ListBackups(ctx, &ebv1.ListBackupsRequest{LabelSelector: "env=prod"})
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, b := range resp.GetBackups() {
		got = append(got, b.GetName())
	}
	if strings.Join(got, ",") != "c,a" {
		t.Fatalf("list env=prod = %v, want newest first [c a]", got)
	}
	_, err = ts.client.Backups.ListBackups(ctx, &ebv1.ListBackupsRequest{LabelSelector: "env in (("})
	wantCode(t, err, codes.InvalidArgument)
}

func TestHealthAndServerInfo(t *testing.T) {
	ts := startServer(t, "")
	h, err := healthpb.NewHealthClient(ts.conn).Check(context.Background(), &healthpb.HealthCheckRequest{})
	if err != nil || h.GetStatus() != healthpb.HealthCheckResponse_SERVING {
		t.Fatalf("health: %v %v", h, err)
	}
	info, err := ts.client.Info.GetServerInfo(context.Background(), &ebv1.GetServerInfoRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if len(info.GetLocations()) != 1 || info.GetLocations()[0].GetName() != "default" || !info.GetLocations()[0].GetDefault() ||
		info.GetLimits().GetMaxChunkBytes() != server.MaxChunkBytes {
		t.Fatalf("info: %v", info)
	}
}

// An oversized chunk is refused rather than buffered.
func TestChunkLimit(t *testing.T) {
	ts := startServer(t, "")
	stream, err := ts.client.Backups.UploadBackup(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	_ = stream.Send(&ebv1.UploadBackupRequest{Msg: &ebv1.UploadBackupRequest_Header{Header: &ebv1.UploadHeader{Name: "big"}}})
	_ = stream.Send(&ebv1.UploadBackupRequest{Msg: &ebv1.UploadBackupRequest_Chunk{Chunk: make([]byte, server.MaxChunkBytes+1)}})
	_, err = stream.CloseAndRecv()
	wantCode(t, err, codes.InvalidArgument)
	if names := ts.names(t); len(names) != 0 {
		t.Fatalf("listed: %v", names)
	}
}

// SIGTERM (Serve's context ending) lets a download in flight finish.
func TestShutdownDrainsInFlightDownload(t *testing.T) {
	ts := startServer(t, "")
	data := trailed(t, 16<<20)
	ts.upload(t, "big", data)
	pr, pw := io.Pipe()
	errc := make(chan error, 1)
	var got bytes.Buffer
	go func() {
		_, err := ts.client.Download(context.Background(), io.MultiWriter(&got, pw), client.DownloadRequest{Name: "big"})
		pw.CloseWithError(err)
		errc <- err
	}()
	// Read the first bytes so the stream is surely in flight, then stop
	// the server while the rest is still coming.
	if _, err := io.ReadFull(pr, make([]byte, 1<<20)); err != nil {
		t.Fatal(err)
	}
	stopped := make(chan struct{})
	go func() { ts.stop(); close(stopped) }()
	if _, err := io.Copy(io.Discard, pr); err != nil {
		t.Fatalf("download interrupted by shutdown: %v", err)
	}
	if err := <-errc; err != nil {
		t.Fatal(err)
	}
	<-stopped
	if !bytes.Equal(got.Bytes(), data) {
		t.Fatal("drained download has wrong bytes")
	}
}
