package s3_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"regexp"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	s3sdk "github.com/aws/aws-sdk-go-v2/service/s3"
	s3types "github.com/aws/aws-sdk-go-v2/service/s3/types"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/storage"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/storage/s3"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/storage/s3/s3test"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/storage/storagetest"
)

// partSize is S3's minimum, so that a few MiB make a multipart upload.
const partSize = 5 << 20

func newLocation(t testing.TB, srv *s3test.Server, prefix string, edit ...func(*s3.Config)) *s3.Location {
	t.Helper()
	cfg := srv.Config(prefix)
	cfg.PartSizeMiB = partSize >> 20
	cfg.Concurrency = 2
	cfg.Logger = slog.New(slog.NewTextHandler(testWriter{t}, nil))
	for _, e := range edit {
		e(&cfg)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	l, err := s3.New(ctx, cfg)
	if err != nil {
		t.Fatalf("s3.New: %v", err)
	}
	return l
}

type testWriter struct{ t testing.TB }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimRight(string(p), "\n"))
	return len(p), nil
}

var unsafeChars = regexp.MustCompile(`[^a-zA-Z0-9-]+`)

// conformance runs the shared storage suite, each subtest in its own prefix
// of one versitygw.
func conformance(t *testing.T, edit ...func(*s3.Config)) {
	srv := s3test.Start(t)
	storagetest.Run(t, storagetest.Suite{
		New: func(t *testing.T) storage.Location {
			return newLocation(t, srv, "conformance/"+unsafeChars.ReplaceAllString(t.Name(), "-"), edit...)
		},
		BigSize: 3*partSize + 12345,
		CheckClean: func(t *testing.T, _ storage.Location) {
			noOpenUploads(t, srv)
		},
	})
}

// TestConformance: SDK default checksums (CRC32 in aws-chunked trailers
// over HTTPS).
func TestConformance(t *testing.T) { conformance(t) }

// TestConformanceChecksumWhenRequired: no aws-chunked encoding, for stores
// that reject it.
func TestConformanceChecksumWhenRequired(t *testing.T) {
	conformance(t, func(c *s3.Config) { c.RequestChecksum = s3.ChecksumWhenRequired })
}

func noOpenUploads(t testing.TB, srv *s3test.Server) {
	t.Helper()
	ups, err := srv.OpenMultipartUploads(context.Background())
	if err != nil {
		t.Fatalf("list multipart uploads: %v", err)
	}
	if len(ups) > 0 {
		t.Errorf("multipart uploads left open: %q", ups)
	}
}

func keys(t testing.TB, srv *s3test.Server) []string {
	t.Helper()
	k, err := srv.Keys(context.Background())
	if err != nil {
		t.Fatalf("list keys: %v", err)
	}
	return k
}

// TestLayout: data and manifest keys under the prefix, nothing else.
func TestLayout(t *testing.T) {
	srv := s3test.Start(t)
	loc := newLocation(t, srv, "/team-a/etcd/")
	storagetest.Put(t, loc, "nightly-1", storagetest.Data(1, 1000))
	got := strings.Join(keys(t, srv), " ")
	if want := "team-a/etcd/backups/nightly-1.db team-a/etcd/backups/nightly-1.json"; got != want {
		t.Errorf("keys = %q, want %q", got, want)
	}
	if d := loc.Describe(); d != "s3://etcdbackup/team-a/etcd at "+srv.Endpoint {
		t.Errorf("Describe() = %q", d)
	}
	if loc.Type() != "s3" {
		t.Errorf("Type() = %q", loc.Type())
	}
	// The manifest records the ETag of its data.
	ctx := context.Background()
	c := srv.Client()
	dh, err := c.HeadObject(ctx, &s3sdk.HeadObjectInput{Bucket: aws.String(srv.Bucket), Key: aws.String("team-a/etcd/backups/nightly-1.db")})
	if err != nil {
		t.Fatal(err)
	}
	mh, err := c.HeadObject(ctx, &s3sdk.HeadObjectInput{Bucket: aws.String(srv.Bucket), Key: aws.String("team-a/etcd/backups/nightly-1.json")})
	if err != nil {
		t.Fatal(err)
	}
	if got := mh.Metadata["etcdbackup-data-etag"]; got == "" || got != aws.ToString(dh.ETag) {
		t.Errorf("manifest metadata data ETag = %q, data ETag %q", got, aws.ToString(dh.ETag))
	}
	if err := loc.Delete(ctx, "nightly-1"); err != nil {
		t.Fatal(err)
	}
	if k := keys(t, srv); len(k) != 0 {
		t.Errorf("keys after delete: %q", k)
	}
}

// TestListSkipsForeignObjects: objects under the prefix that are not
// manifests of this program do not break List.
func TestListSkipsForeignObjects(t *testing.T) {
	srv := s3test.Start(t)
	loc := newLocation(t, srv, "foreign")
	ctx := context.Background()
	storagetest.Put(t, loc, "good", storagetest.Data(1, 10))
	for key, body := range map[string]string{
		"foreign/backups/garbage.json":  "not json",
		"foreign/backups/renamed.json":  `{"name":"other"}`,
		"foreign/backups/sub/deep.json": `{"name":"deep"}`,
		"foreign/backups/readme.txt":    "hello",
	} {
		if _, err := srv.Client().PutObject(ctx, &s3sdk.PutObjectInput{
			Bucket: aws.String(srv.Bucket), Key: aws.String(key), Body: strings.NewReader(body),
		}); err != nil {
			t.Fatal(err)
		}
	}
	ms, err := loc.List(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(ms) != 1 || ms[0].Name != "good" {
		t.Errorf("List = %v, want only \"good\"", ms)
	}
	if _, err := loc.Stat(ctx, "garbage"); err == nil || errors.Is(err, storage.ErrNotFound) {
		t.Errorf("Stat of an undecodable manifest = %v, want an error other than ErrNotFound", err)
	}
}

// TestOpenDetectsReplacedData: data replaced behind the manifest's back
// (a delete and re-upload between the two reads of Open) is not served
// under the old manifest.
func TestOpenDetectsReplacedData(t *testing.T) {
	srv := s3test.Start(t)
	loc := newLocation(t, srv, "replaced")
	ctx := context.Background()
	storagetest.Put(t, loc, "b", storagetest.Data(1, 1000))
	if _, err := srv.Client().PutObject(ctx, &s3sdk.PutObjectInput{
		Bucket: aws.String(srv.Bucket), Key: aws.String("replaced/backups/b.db"), Body: strings.NewReader("other data"),
	}); err != nil {
		t.Fatal(err)
	}
	for _, off := range []int64{0, 10} {
		if r, _, err := loc.Open(ctx, "b", off, 0); !errors.Is(err, storage.ErrNotFound) {
			if err == nil {
				r.Close()
			}
			t.Errorf("Open at %d of replaced data = %v, want ErrNotFound", off, err)
		}
	}
}

// TestAbortMidMultipart: an upload aborted after several parts were sent
// leaves no object and no open multipart upload.
func TestAbortMidMultipart(t *testing.T) {
	srv := s3test.Start(t)
	loc := newLocation(t, srv, "abort")
	ctx := context.Background()
	up, err := loc.Create(ctx, "partial")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := io.Copy(up, storagetest.Data(1, 4*partSize+1)); err != nil {
		t.Fatal(err)
	}
	if err := up.Abort(); err != nil {
		t.Fatal(err)
	}
	if k := keys(t, srv); len(k) > 0 {
		t.Errorf("objects after abort: %q", k)
	}
	noOpenUploads(t, srv)
}

// TestCancelCreateContext: cancelling the context the upload was created
// with aborts it; Commit fails and nothing remains.
func TestCancelCreateContext(t *testing.T) {
	srv := s3test.Start(t)
	loc := newLocation(t, srv, "cancel")
	ctx, cancel := context.WithCancel(context.Background())
	up, err := loc.Create(ctx, "cancelled")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := io.Copy(up, storagetest.Data(1, 2*partSize+1)); err != nil {
		t.Fatal(err)
	}
	cancel()
	if err := up.Commit(context.Background(), storagetest.NewManifest("cancelled", 2*partSize+1, "")); err == nil {
		t.Fatal("commit of a cancelled upload succeeded")
	}
	if err := up.Abort(); err != nil {
		t.Fatal(err)
	}
	if k := keys(t, srv); len(k) > 0 {
		t.Errorf("objects after cancel: %q", k)
	}
	noOpenUploads(t, srv)
}

// TestKillServerWhileWriting: versitygw is killed (SIGKILL) while parts
// stream: a Write fails soon after (the transfer manager stops reading),
// Commit fails, and once the server is back nothing is listed and the
// location aborts the multipart upload it could not abort while the server
// was down.
func TestKillServerWhileWriting(t *testing.T) {
	srv := s3test.Start(t)
	loc := newLocation(t, srv, "kill")
	ctx := context.Background()
	up, err := loc.Create(ctx, "interrupted")
	if err != nil {
		t.Fatal(err)
	}
	const total = 40 * partSize
	data := storagetest.Data(2, total)
	buf := make([]byte, 256<<10)
	var written int64
	var werr error
	for written < total {
		n, _ := io.ReadFull(data, buf)
		if written >= 3*partSize && srv.Running() {
			srv.Kill()
		}
		var m int
		m, werr = up.Write(buf[:n])
		written += int64(m)
		if werr != nil {
			break
		}
	}
	if werr == nil {
		t.Fatalf("all %d bytes were accepted with the S3 server killed after %d", total, 3*partSize)
	}
	t.Logf("write failed after %d MiB: %v", written>>20, werr)
	if err := up.Commit(ctx, storagetest.NewManifest("interrupted", written, "")); err == nil {
		t.Fatal("commit succeeded")
	}
	if err := up.Abort(); err != nil {
		t.Logf("abort with the server down: %v", err)
	}
	if err := srv.Restart(); err != nil {
		t.Fatal(err)
	}
	if ms, err := loc.List(ctx); err != nil || len(ms) != 0 {
		t.Errorf("List after restart = %v, %v; want nothing", ms, err)
	}
	if k := keys(t, srv); len(k) != 0 {
		t.Errorf("objects after restart: %q", k)
	}
	// The next upload retries the abort that failed.
	storagetest.Put(t, loc, "after", storagetest.Data(3, 100))
	noOpenUploads(t, srv)
	if sum, n := storagetest.ReadAt(t, loc, "after", 0); n != 100 || sum == "" {
		t.Errorf("read after restart: %d bytes", n)
	}
}

// TestKillServerBeforeCommit: versitygw is killed (SIGKILL) mid-upload. Commit
// fails; after a restart on the same data nothing is listed, and the
// location aborts the multipart upload it could not abort while the
// server was down.
func TestKillServerBeforeCommit(t *testing.T) {
	srv := s3test.Start(t)
	loc := newLocation(t, srv, "kill")
	ctx := context.Background()
	storagetest.Put(t, loc, "before", storagetest.Data(1, 100))

	up, err := loc.Create(ctx, "interrupted")
	if err != nil {
		t.Fatal(err)
	}
	// Three parts: the first ones are stored by the time the last is read.
	if _, err := io.Copy(up, storagetest.Data(2, 3*partSize)); err != nil {
		t.Fatal(err)
	}
	if ups, _ := srv.OpenMultipartUploads(ctx); len(ups) != 1 {
		t.Fatalf("open multipart uploads before the kill: %q", ups)
	}
	srv.Kill()
	_, werr := io.Copy(up, storagetest.Data(3, partSize))
	start := time.Now()
	cerr := up.Commit(ctx, storagetest.NewManifest("interrupted", 4*partSize, ""))
	if cerr == nil {
		t.Fatal("commit succeeded with the S3 server killed")
	}
	t.Logf("write after kill: %v; commit failed after %v: %v", werr, time.Since(start).Round(time.Millisecond), cerr)
	if err := up.Abort(); err != nil {
		t.Errorf("abort after a failed commit: %v", err)
	}

	if err := srv.Restart(); err != nil {
		t.Fatal(err)
	}
	// On disk the interrupted upload is still open: nobody could abort it.
	if ups, _ := srv.OpenMultipartUploads(ctx); len(ups) != 1 {
		t.Errorf("open multipart uploads after the restart: %q, want the interrupted one", ups)
	}
	ms, err := loc.List(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(ms) != 1 || ms[0].Name != "before" {
		t.Errorf("listed after restart: %v, want only \"before\"", ms)
	}
	if _, err := loc.Stat(ctx, "interrupted"); !errors.Is(err, storage.ErrNotFound) {
		t.Errorf("Stat(interrupted) = %v, want ErrNotFound", err)
	}
	// A fresh location (a restarted data server) leaves it: it is young and
	// could be another server's.
	fresh := newLocation(t, srv, "kill")
	if ups, _ := srv.OpenMultipartUploads(ctx); len(ups) != 1 {
		t.Errorf("a fresh location aborted a young upload: %q", ups)
	}
	// The location that failed to abort it does so at its next cleanup.
	res, err := loc.CleanOrphans(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if res.AbortedUploads != 1 {
		t.Errorf("CleanOrphans = %+v, want 1 aborted upload", res)
	}
	noOpenUploads(t, srv)
	// The name is free again.
	storagetest.Put(t, fresh, "interrupted", storagetest.Data(4, 1000))
}

// TestStaleUploadCleanup: a multipart upload left by a dead server is
// aborted by the next location to start once older than StaleUploadAge.
func TestStaleUploadCleanup(t *testing.T) {
	srv := s3test.Start(t)
	ctx := context.Background()
	loc := newLocation(t, srv, "stale")
	up, err := loc.Create(ctx, "left-open")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := io.Copy(up, storagetest.Data(1, 2*partSize)); err != nil {
		t.Fatal(err)
	}
	srv.Kill() // the upload can neither finish nor be aborted
	_ = up.Abort()
	if err := srv.Restart(); err != nil {
		t.Fatal(err)
	}
	if ups, _ := srv.OpenMultipartUploads(ctx); len(ups) != 1 {
		t.Fatalf("open uploads after restart: %q", ups)
	}
	// Another prefix's cleanup never touches it.
	newLocation(t, srv, "other", func(c *s3.Config) { c.StaleUploadAge = time.Nanosecond })
	if ups, _ := srv.OpenMultipartUploads(ctx); len(ups) != 1 {
		t.Fatalf("another prefix aborted the upload: %q", ups)
	}
	// S3 times have a resolution of 1 s, from the store's clock: the
	// locations started until the upload is older than StaleUploadAge
	// leave it; the first after aborts it.
	if err := wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		newLocation(t, srv, "stale", func(c *s3.Config) { c.StaleUploadAge = time.Second })
		ups, err := srv.OpenMultipartUploads(ctx)
		return len(ups) == 0, err
	}); err != nil {
		t.Errorf("the stale upload is not aborted: %v", err)
	}
	noOpenUploads(t, srv)
}

// TestOrphanData: data without a manifest (a crash between the two writes)
// is never listed, blocks its name while young, and is removed once older
// than OrphanAge.
func TestOrphanData(t *testing.T) {
	srv := s3test.Start(t)
	ctx := context.Background()
	loc := newLocation(t, srv, "orphan")
	storagetest.Put(t, loc, "crashed", storagetest.Data(1, 1000))
	// Simulate the crash: remove the manifest behind the location's back.
	if err := os.Remove(filepath.Join(srv.Dir, "data", srv.Bucket, "orphan", "backups", "crashed.json")); err != nil {
		t.Fatal(err)
	}
	if ms, err := loc.List(ctx); err != nil || len(ms) != 0 {
		t.Fatalf("List = %v, %v; want nothing", ms, err)
	}
	if _, err := loc.Create(ctx, "crashed"); !errors.Is(err, storage.ErrAlreadyExists) || !strings.Contains(err.Error(), "interrupted") {
		t.Errorf("Create over young orphan data = %v, want ErrAlreadyExists explaining it", err)
	}
	// Each location started cleans up at its start: the first once the
	// data is older than OrphanAge (by the store's clock) removes it.
	var aged *s3.Location
	if err := wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, 30*time.Second, true, func(context.Context) (bool, error) {
		aged = newLocation(t, srv, "orphan", func(c *s3.Config) { c.OrphanAge = time.Second })
		return len(keys(t, srv)) == 0, nil
	}); err != nil {
		t.Errorf("keys after cleanup: %q", keys(t, srv))
	}
	storagetest.Put(t, aged, "crashed", storagetest.Data(2, 1000))
}

// TestWrongCA: a server certificate from another CA fails at once, saying
// it is a certificate problem.
func TestWrongCA(t *testing.T) {
	srv := s3test.Start(t)
	other := s3test.Start(t)
	cfg := srv.Config("")
	cfg.CABundleFile = other.CAFile
	start := time.Now()
	_, err := s3.New(context.Background(), cfg)
	if err == nil {
		t.Fatal("New trusted a certificate of another CA")
	}
	t.Logf("after %v: %v", time.Since(start).Round(time.Millisecond), err)
	if !strings.Contains(err.Error(), "certificate") || !strings.Contains(err.Error(), "caBundleFile") {
		t.Errorf("error does not say it is about the certificate: %v", err)
	}
	if time.Since(start) > 5*time.Second {
		t.Errorf("certificate failure took %v: it must not be retried", time.Since(start))
	}
	// No CA at all: the system roots do not know the test CA either.
	cfg.CABundleFile = ""
	if _, err := s3.New(context.Background(), cfg); err == nil || !strings.Contains(err.Error(), "certificate") {
		t.Errorf("New without the CA = %v, want a certificate error", err)
	}
	// Explicitly insecure works.
	cfg.InsecureSkipVerify = true
	if _, err := s3.New(context.Background(), cfg); err != nil {
		t.Errorf("New with insecureSkipVerify: %v", err)
	}
}

// TestWrongCredentials: a wrong secret is refused with an error naming the
// bucket, the endpoint and the credential files, but not the secret.
func TestWrongCredentials(t *testing.T) {
	srv := s3test.Start(t)
	dir := t.TempDir()
	const wrongSecret = "WRONGSECRETdoNotPrintMe0123456789"
	secretFile := filepath.Join(dir, "secret")
	if err := os.WriteFile(secretFile, []byte(wrongSecret), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg := srv.Config("")
	cfg.SecretAccessKeyFile = secretFile
	_, err := s3.New(context.Background(), cfg)
	if err == nil {
		t.Fatal("New succeeded with a wrong secret")
	}
	t.Log(err)
	msg := err.Error()
	for _, secret := range []string{wrongSecret, srv.SecretAccessKey} {
		if strings.Contains(msg, secret) {
			t.Errorf("error contains a secret: %v", err)
		}
	}
	for _, want := range []string{srv.Bucket, srv.Endpoint, secretFile, "denied"} {
		if !strings.Contains(msg, want) {
			t.Errorf("error does not mention %q: %v", want, err)
		}
	}

	// Credentials from environment variables work, and a missing variable
	// is named.
	cfg = srv.Config("")
	cfg.AccessKeyIDFile, cfg.SecretAccessKeyFile = "", ""
	cfg.AccessKeyIDEnv, cfg.SecretAccessKeyEnv = "TEST_S3_ID", "TEST_S3_SECRET"
	t.Setenv("TEST_S3_ID", srv.AccessKeyID)
	t.Setenv("TEST_S3_SECRET", "")
	if _, err := s3.New(context.Background(), cfg); err == nil || !strings.Contains(err.Error(), "TEST_S3_SECRET") {
		t.Errorf("New with an empty secret variable = %v, want an error naming it", err)
	}
	t.Setenv("TEST_S3_SECRET", srv.SecretAccessKey)
	if _, err := s3.New(context.Background(), cfg); err != nil {
		t.Errorf("New with credentials from the environment: %v", err)
	}
}

// TestIsolatedFromAWSEnvironment: AWS_* variables and ~/.aws do not change
// a location that does not ask for the default chain.
func TestIsolatedFromAWSEnvironment(t *testing.T) {
	srv := s3test.Start(t)
	home := t.TempDir()
	if err := os.MkdirAll(filepath.Join(home, ".aws"), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(home, ".aws", "config"), []byte("[default]\nregion = eu-west-3\nendpoint_url = https://127.0.0.1:1\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	t.Setenv("HOME", home)
	t.Setenv("AWS_ACCESS_KEY_ID", "AKIAWRONG")
	t.Setenv("AWS_SECRET_ACCESS_KEY", "wrong")
	t.Setenv("AWS_ENDPOINT_URL", "https://127.0.0.1:1")
	t.Setenv("AWS_ENDPOINT_URL_S3", "https://127.0.0.1:1")
	t.Setenv("AWS_REGION", "eu-west-3")
	t.Setenv("AWS_CA_BUNDLE", filepath.Join(home, "missing.pem"))
	loc := newLocation(t, srv, "isolated")
	storagetest.Put(t, loc, "ok", storagetest.Data(1, 10))

	// With the default chain the environment's credentials are used.
	t.Setenv("AWS_ENDPOINT_URL", "")
	t.Setenv("AWS_ENDPOINT_URL_S3", "")
	t.Setenv("AWS_CA_BUNDLE", "")
	t.Setenv("AWS_ACCESS_KEY_ID", srv.AccessKeyID)
	t.Setenv("AWS_SECRET_ACCESS_KEY", srv.SecretAccessKey)
	cfg := srv.Config("isolated")
	cfg.AccessKeyIDFile, cfg.SecretAccessKeyFile = "", ""
	cfg.DefaultCredentialChain = true
	cfg.Region = "us-east-1"
	chain, err := s3.New(context.Background(), cfg)
	if err != nil {
		t.Fatalf("New with the default chain: %v", err)
	}
	if _, err := chain.Stat(context.Background(), "ok"); err != nil {
		t.Error(err)
	}
}

func TestConfigValidation(t *testing.T) {
	for _, tc := range []struct {
		name string
		cfg  s3.Config
		want string
	}{
		{"no bucket", s3.Config{S3Config: storage.S3Config{AccessKeyIDFile: "a", SecretAccessKeyFile: "b"}}, "bucket is required"},
		{"no credentials", s3.Config{S3Config: storage.S3Config{Bucket: "b"}}, "no credentials configured"},
		{"two credential sources", s3.Config{S3Config: storage.S3Config{Bucket: "b", AccessKeyIDFile: "a", SecretAccessKeyFile: "b", DefaultCredentialChain: true}}, "more than one way"},
		{"half files", s3.Config{S3Config: storage.S3Config{Bucket: "b", AccessKeyIDFile: "a"}}, "both accessKeyIDFile and secretAccessKeyFile"},
		{"small parts", s3.Config{S3Config: storage.S3Config{Bucket: "b", DefaultCredentialChain: true, PartSizeMiB: 1}}, "part size"},
		{"concurrency", s3.Config{S3Config: storage.S3Config{Bucket: "b", DefaultCredentialChain: true, Concurrency: -1}}, "concurrency"},
		{"endpoint with secret", s3.Config{S3Config: storage.S3Config{Bucket: "b", DefaultCredentialChain: true, Endpoint: "https://user:hunter2@s3.example"}}, "must not contain credentials"},
		{"endpoint scheme", s3.Config{S3Config: storage.S3Config{Bucket: "b", DefaultCredentialChain: true, Endpoint: "s3.example:9000"}}, "scheme"},
		{"ca and insecure", s3.Config{S3Config: storage.S3Config{Bucket: "b", DefaultCredentialChain: true, CABundleFile: "x", InsecureSkipVerify: true}}, "insecureSkipVerify"},
		{"prefix traversal", s3.Config{S3Config: storage.S3Config{Bucket: "b", DefaultCredentialChain: true, Prefix: "a/../b"}}, "prefix"},
		{"checksum", s3.Config{S3Config: storage.S3Config{Bucket: "b", DefaultCredentialChain: true, RequestChecksum: "always"}}, "request checksum"},
		{"missing CA file", s3.Config{S3Config: storage.S3Config{Bucket: "b", DefaultCredentialChain: true, CABundleFile: "/nonexistent/ca.pem"}}, "CA bundle"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := s3.New(context.Background(), tc.cfg)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("New = %v, want an error containing %q", err, tc.want)
			}
			if strings.Contains(err.Error(), "hunter2") {
				t.Errorf("error contains the endpoint's password: %v", err)
			}
		})
	}
}

// TestMissingBucket names the bucket and the endpoint.
func TestMissingBucket(t *testing.T) {
	srv := s3test.Start(t)
	cfg := srv.Config("")
	cfg.Bucket = "no-such-bucket"
	_, err := s3.New(context.Background(), cfg)
	if err == nil || !strings.Contains(err.Error(), "no-such-bucket") || !strings.Contains(err.Error(), srv.Endpoint) {
		t.Fatalf("New = %v, want an error naming the bucket and endpoint", err)
	}
	t.Log(err)
}

// TestUploadMemoryBounded: a 256 MiB upload from a generated reader keeps
// the heap far below the backup's size.
func TestUploadMemoryBounded(t *testing.T) {
	if testing.Short() {
		t.Skip("uploads 256 MiB")
	}
	srv := s3test.Start(t)
	loc := newLocation(t, srv, "memory")
	const size = 256 << 20
	peak, elapsed := measureUpload(t, loc, "big", size)
	t.Logf("%d MiB in %v (%.0f MiB/s), peak heap in use %.1f MiB (part size %d MiB, concurrency 2)",
		size>>20, elapsed.Round(time.Millisecond), float64(size)/(1<<20)/elapsed.Seconds(), float64(peak)/(1<<20), partSize>>20)
	// (Concurrency+2) × PartSize = 20 MiB of part buffers, plus the SDK.
	if limit := uint64(64 << 20); peak > limit {
		t.Errorf("peak heap in use %d MiB exceeds %d MiB", peak>>20, limit>>20)
	}
	if sum, n := storagetest.ReadAt(t, loc, "big", size-partSize); n != partSize {
		t.Errorf("ranged read of the last part: %d bytes (%s)", n, sum)
	}
}

// measureUpload uploads size generated bytes and samples HeapInuse while
// it runs; it returns the peak above the baseline before the upload.
func measureUpload(t testing.TB, loc storage.Location, name string, size int64) (peak uint64, elapsed time.Duration) {
	t.Helper()
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	base := ms.HeapInuse
	stop := make(chan struct{})
	sampled := make(chan uint64)
	go func() {
		var max uint64
		tick := time.NewTicker(10 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-stop:
				sampled <- max
				return
			case <-tick.C:
				var ms runtime.MemStats
				runtime.ReadMemStats(&ms)
				if ms.HeapInuse > base && ms.HeapInuse-base > max {
					max = ms.HeapInuse - base
				}
			}
		}
	}()
	start := time.Now()
	m, err := storagetest.TryPut(context.Background(), loc, name, storagetest.Data(42, size))
	elapsed = time.Since(start)
	close(stop)
	peak = <-sampled
	if err != nil {
		t.Fatal(err)
	}
	if m.Size != size {
		t.Fatalf("uploaded %d bytes, want %d", m.Size, size)
	}
	return peak, elapsed
}

// BenchmarkUpload reports the throughput and the peak heap of 256 MiB
// uploads to versitygw over HTTPS, per part size and concurrency.
func BenchmarkUpload(b *testing.B) {
	srv := s3test.Start(b)
	const size = 256 << 20
	for _, c := range []struct{ part, conc int }{{5, 1}, {5, 2}, {8, 4}, {16, 4}} {
		b.Run(fmt.Sprintf("part=%dMiB/concurrency=%d", c.part, c.conc), func(b *testing.B) {
			loc := newLocation(b, srv, fmt.Sprintf("bench-%d-%d", c.part, c.conc), func(cfg *s3.Config) {
				cfg.PartSizeMiB = int64(c.part)
				cfg.Concurrency = c.conc
			})
			b.SetBytes(size)
			var peak uint64
			for i := 0; b.Loop(); i++ {
				p, _ := measureUpload(b, loc, fmt.Sprintf("b-%d", i), size)
				peak = max(peak, p)
			}
			b.ReportMetric(float64(peak)/(1<<20), "peak-heap-MiB")
			b.ReportMetric(float64(peak)/size*100, "peak-heap-%-of-size")
		})
	}
}

// TestConditionalDataWrite: data that appears under the backup's key
// during an upload (another server's, or a crash's leftover) is never
// overwritten: Commit fails with ErrAlreadyExists and aborts.
func TestConditionalDataWrite(t *testing.T) {
	srv := s3test.Start(t)
	loc := newLocation(t, srv, "cond")
	ctx := context.Background()
	for _, size := range []int64{1000, 2*partSize + 1} { // single PUT, multipart
		name := fmt.Sprintf("contested-%d", size)
		up, err := loc.Create(ctx, name)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := io.Copy(up, storagetest.Data(1, size)); err != nil {
			t.Fatal(err)
		}
		key := "cond/backups/" + name + ".db"
		if _, err := srv.Client().PutObject(ctx, &s3sdk.PutObjectInput{
			Bucket: aws.String(srv.Bucket), Key: aws.String(key), Body: strings.NewReader("foreign"),
		}); err != nil {
			t.Fatal(err)
		}
		err = up.Commit(ctx, storagetest.NewManifest(name, size, ""))
		if !errors.Is(err, storage.ErrAlreadyExists) {
			t.Fatalf("commit over foreign data = %v, want ErrAlreadyExists", err)
		}
		t.Log(err)
		out, err := srv.Client().GetObject(ctx, &s3sdk.GetObjectInput{Bucket: aws.String(srv.Bucket), Key: aws.String(key)})
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(out.Body)
		out.Body.Close()
		if string(b) != "foreign" {
			t.Errorf("foreign data was overwritten")
		}
		if _, err := loc.Stat(ctx, name); !errors.Is(err, storage.ErrNotFound) {
			t.Errorf("Stat = %v, want ErrNotFound", err)
		}
		noOpenUploads(t, srv)
	}
}

// TestChecksumModes: the request checksum setting reaches the transfer
// manager (which ignores the client's): with when_supported versitygw
// stores the CRC32 the SDK sent in aws-chunked trailers, with
// when_required no checksum is sent at all.
func TestChecksumModes(t *testing.T) {
	srv := s3test.Start(t)
	ctx := context.Background()
	for _, mode := range []string{s3.ChecksumWhenSupported, s3.ChecksumWhenRequired} {
		loc := newLocation(t, srv, mode, func(c *s3.Config) { c.RequestChecksum = mode })
		for _, size := range []int64{1000, 2*partSize + 1} {
			name := fmt.Sprintf("sum-%d", size)
			storagetest.Put(t, loc, name, storagetest.Data(1, size))
			h, err := srv.Client().HeadObject(ctx, &s3sdk.HeadObjectInput{
				Bucket: aws.String(srv.Bucket), Key: aws.String(mode + "/backups/" + name + ".db"), ChecksumMode: s3types.ChecksumModeEnabled,
			})
			if err != nil {
				t.Fatal(err)
			}
			crc := aws.ToString(h.ChecksumCRC32)
			t.Logf("%s, %d bytes: stored CRC32 %q (%s)", mode, size, crc, h.ChecksumType)
			if (mode == s3.ChecksumWhenSupported) != (crc != "") {
				t.Errorf("%s, %d bytes: stored CRC32 %q", mode, size, crc)
			}
		}
	}
}

// TestFailureBetweenDataAndManifest: the store dies after the data is
// complete, before the manifest is written. Commit fails, nothing is
// listed after the restart, and the data left without a manifest is never
// served. If instead another writer's manifest appears in that instant,
// Commit fails with ErrAlreadyExists and leaves it alone.
func TestFailureBetweenDataAndManifest(t *testing.T) {
	srv := s3test.Start(t)
	loc := newLocation(t, srv, "between")
	ctx := context.Background()

	reset := s3.SetHookBeforeManifest(func(string) { srv.Kill() })
	_, err := storagetest.TryPut(ctx, loc, "dies", storagetest.Data(1, 2*partSize+1))
	reset()
	if err == nil {
		t.Fatal("commit succeeded with the store killed before the manifest")
	}
	t.Log(err)
	if err := srv.Restart(); err != nil {
		t.Fatal(err)
	}
	if ms, err := loc.List(ctx); err != nil || len(ms) != 0 {
		t.Errorf("List = %v, %v; want nothing", ms, err)
	}
	if got := strings.Join(keys(t, srv), " "); got != "between/backups/dies.db" {
		t.Errorf("keys = %q, want only the unlisted data", got)
	}
	noOpenUploads(t, srv)

	reset = s3.SetHookBeforeManifest(func(name string) {
		if _, err := srv.Client().PutObject(ctx, &s3sdk.PutObjectInput{
			Bucket: aws.String(srv.Bucket), Key: aws.String("between/backups/" + name + ".json"), Body: strings.NewReader(`{"name":"` + name + `"}`),
		}); err != nil {
			t.Error(err)
		}
	})
	defer reset()
	_, err = storagetest.TryPut(ctx, loc, "contested", storagetest.Data(2, 1000))
	if !errors.Is(err, storage.ErrAlreadyExists) {
		t.Fatalf("commit against a manifest written meanwhile = %v, want ErrAlreadyExists", err)
	}
	m, err := loc.Stat(ctx, "contested")
	if err != nil || m.Size != 0 {
		t.Errorf("the other writer's manifest changed: %+v, %v", m, err)
	}
}

// objects is every object of the bucket, key → content, and the open
// multipart uploads: what a location that writes nothing leaves as is.
func objects(t testing.TB, srv *s3test.Server) map[string]string {
	t.Helper()
	ctx := context.Background()
	out := map[string]string{}
	for _, k := range keys(t, srv) {
		o, err := srv.Client().GetObject(ctx, &s3sdk.GetObjectInput{Bucket: aws.String(srv.Bucket), Key: aws.String(k)})
		if err != nil {
			t.Fatalf("get %s: %v", k, err)
		}
		b, err := io.ReadAll(o.Body)
		o.Body.Close()
		if err != nil {
			t.Fatalf("read %s: %v", k, err)
		}
		out[k] = string(b)
	}
	ups, err := srv.OpenMultipartUploads(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, u := range ups {
		out["multipart upload "+u] = ""
	}
	return out
}

// TestReadOnly: a location opened read-only reads what the owner stored
// and writes nothing, not even the cleanup a read-write open does (shown
// by one afterwards): data without a manifest and a stale multipart
// upload stay, Create, Delete and CleanOrphans are refused.
func TestReadOnly(t *testing.T) {
	srv := s3test.Start(t)
	ctx := context.Background()
	owner := newLocation(t, srv, "ro")
	m := storagetest.Put(t, owner, "kept", storagetest.Data(1, 100<<10))
	storagetest.Put(t, owner, "other", storagetest.Data(2, 1000))
	c := srv.Client()
	if _, err := c.PutObject(ctx, &s3sdk.PutObjectInput{Bucket: aws.String(srv.Bucket), Key: aws.String("ro/backups/orphan.db"),
		Body: strings.NewReader("data whose manifest was never written")}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.CreateMultipartUpload(ctx, &s3sdk.CreateMultipartUploadInput{Bucket: aws.String(srv.Bucket), Key: aws.String("ro/backups/stale.db")}); err != nil {
		t.Fatal(err)
	}
	before := objects(t, srv)
	if len(before) != 6 {
		t.Fatalf("before: %d objects and uploads, want 5 objects and 1 upload: %q", len(before), keys(t, srv))
	}

	// Cleanup as eager as it gets, were it to run.
	eager := func(c *s3.Config) { c.OrphanAge, c.StaleUploadAge = time.Nanosecond, time.Nanosecond }
	loc := newLocation(t, srv, "ro", eager, func(c *s3.Config) { c.ReadOnly = true })
	if err := loc.Check(ctx); err != nil {
		t.Fatalf("check: %v", err)
	}
	ms, err := loc.List(ctx)
	if err != nil || len(ms) != 2 {
		t.Fatalf("list: %d manifests, %v; want kept and other", len(ms), err)
	}
	if got, err := loc.Stat(ctx, "kept"); err != nil || got.SHA256 != m.SHA256 {
		t.Fatalf("stat: %+v, %v", got, err)
	}
	if sum, _ := storagetest.ReadAt(t, loc, "kept", 0); sum != m.SHA256 {
		t.Fatalf("read: SHA-256 %s, want %s", sum, m.SHA256)
	}
	if _, n := storagetest.ReadRange(t, loc, "kept", 1000, 500); n != 500 {
		t.Fatalf("read a range: %d bytes, want 500", n)
	}
	if _, err := loc.Create(ctx, "new"); !errors.Is(err, storage.ErrReadOnly) {
		t.Fatalf("create: %v, want storage.ErrReadOnly", err)
	}
	if err := loc.Delete(ctx, "kept"); !errors.Is(err, storage.ErrReadOnly) {
		t.Fatalf("delete: %v, want storage.ErrReadOnly", err)
	}
	if _, err := loc.CleanOrphans(ctx); !errors.Is(err, storage.ErrReadOnly) {
		t.Fatalf("CleanOrphans: %v, want storage.ErrReadOnly", err)
	}
	after := objects(t, srv)
	for k, v := range before {
		if got, ok := after[k]; !ok || got != v {
			t.Errorf("%s changed or went: %q, was %q", k, got, v)
		}
	}
	for k := range after {
		if _, ok := before[k]; !ok {
			t.Errorf("%s appeared", k)
		}
	}

	// What the read-only open left is what a read-write one cleans.
	newLocation(t, srv, "ro", eager)
	cleaned := objects(t, srv)
	if _, ok := cleaned["ro/backups/orphan.db"]; ok || len(cleaned) != 4 {
		t.Errorf("a read-write open did not clean what the read-only one left: %q", keys(t, srv))
	}
}

// TestListRereadsChangedManifests: List keeps the manifests it read and
// reads again only those whose object changed (by its ETag); a changed
// one — a drill's verdict, or someone rewriting it — is never listed as
// it was, and a deleted one is not listed at all.
func TestListRereadsChangedManifests(t *testing.T) {
	srv := s3test.Start(t)
	loc := newLocation(t, srv, "relist")
	ctx := context.Background()
	for _, n := range []string{"a", "b", "c"} {
		storagetest.Put(t, loc, n, storagetest.Data(1, 10))
	}
	list := func() map[string]*storage.Manifest { t.Helper(); return storagetest.ListByName(t, loc) }
	if got := list(); len(got) != 3 {
		t.Fatalf("first List: %v", got)
	}
	v := &storage.Verification{Time: time.Now().UTC().Truncate(time.Second), Result: storage.VerificationSucceeded, Revision: 7}
	if err := loc.SetVerification(ctx, "a", v); err != nil {
		t.Fatal(err)
	}
	// Someone rewrites b's manifest in the bucket (a label added).
	m := list()["b"]
	m.Labels = map[string]string{"edited": "yes"}
	body, err := json.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := srv.Client().PutObject(ctx, &s3sdk.PutObjectInput{
		Bucket: aws.String(srv.Bucket), Key: aws.String("relist/backups/b.json"), Body: bytes.NewReader(body),
	}); err != nil {
		t.Fatal(err)
	}
	if err := loc.Delete(ctx, "c"); err != nil {
		t.Fatal(err)
	}
	got := list()
	if len(got) != 2 || got["a"].Verification == nil || got["a"].Verification.Revision != 7 || got["b"].Labels["edited"] != "yes" {
		t.Fatalf("List after changes: a %+v, b labels %v, %d listed; want a verified, b edited, c gone", got["a"].Verification, got["b"].Labels, len(got))
	}
	// What a caller does to a listed manifest is not what the next List
	// returns.
	got["b"].Labels["edited"] = "by the caller"
	got["b"].Name = "changed"
	if again := list(); again["b"] == nil || again["b"].Name != "b" || again["b"].Labels["edited"] != "yes" {
		t.Fatalf("a caller's change to a listed manifest leaked into the next List: %+v", again["b"])
	}
}
