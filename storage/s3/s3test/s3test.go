// Package s3test runs a real S3 server for tests: versitygw v1.8.0 (built by
// `make s3-bins` from the tools module tools/s3) on loopback, over HTTPS
// with a CA made for the test, on a posix data directory.
//
// It is a regular (non-_test) package so that end-to-end tests can start an
// S3 store for the data server too. It imports the AWS SDK only for
// Server.Client, the tests' window on the bucket.
package s3test

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/hex"
	"encoding/pem"
	"encoding/xml"
	"errors"
	"fmt"
	"io"
	"math/big"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	v4 "github.com/aws/aws-sdk-go-v2/aws/signer/v4"
	"github.com/aws/aws-sdk-go-v2/credentials"
	s3sdk "github.com/aws/aws-sdk-go-v2/service/s3"
	"github.com/aws/smithy-go/logging"

	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/storage"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/storage/s3"
)

const (
	// BinDirEnv names the directory holding the versitygw binary; default
	// <repo root>/.cache/s3/bin, where `make s3-bins` puts it.
	BinDirEnv = "ETCDBACKUP_S3_BIN_DIR"
	// RequireEnv, when 1, turns a missing binary from a skip into a failure.
	RequireEnv = "ETCDBACKUP_REQUIRE_SANDBOX"
	// Bucket is the bucket every Server starts with.
	Bucket = "etcdbackup"
	// Region is what versitygw signs for by default.
	Region = "us-east-1"

	rootModule = "github.com/kubectl-etcdbackup/kubectl-etcdbackup"
	binName    = "versitygw"
)

// ErrBinaryMissing is wrapped by errors about a missing versitygw binary.
var ErrBinaryMissing = errors.New("versitygw binary missing (run `make s3-bins`)")

// Server is a running versitygw.
type Server struct {
	// Endpoint is https://127.0.0.1:PORT.
	Endpoint string
	// Bucket exists and is empty at start.
	Bucket string
	Region string
	// CAFile is the PEM CA that signed the server's certificate.
	CAFile string
	// AccessKeyID and SecretAccessKey are the root credentials; the files
	// hold the same values, like a mounted Secret.
	AccessKeyID         string
	SecretAccessKey     string
	AccessKeyIDFile     string
	SecretAccessKeyFile string
	// Dir holds everything: data/ (the posix backend), iam/, pki/, the log.
	Dir string

	bin      string
	addr     string
	dnsNames []string
	certPEM  []byte
	logPath  string

	mu   sync.Mutex
	cmd  *exec.Cmd
	exit chan struct{} // closed when cmd has been waited for
}

// Start starts versitygw for t and stops it when t ends. It skips t if the
// binary is missing, unless ETCDBACKUP_REQUIRE_SANDBOX=1.
func Start(t testing.TB) *Server {
	t.Helper()
	bin, err := FindBinary()
	if err != nil {
		if errors.Is(err, ErrBinaryMissing) && os.Getenv(RequireEnv) != "1" {
			t.Skipf("s3test: %v; set %s=1 to fail instead of skipping", err, RequireEnv)
		}
		t.Fatalf("s3test: %v", err)
	}
	s, err := New(t.TempDir(), bin)
	if err != nil {
		t.Fatalf("s3test: %v", err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("s3test: last lines of %s:\n%s", s.logPath, s.LogTail(30))
		}
		s.Kill()
	})
	if err := s.Restart(); err != nil {
		t.Fatalf("s3test: %v", err)
	}
	return s
}

// FindBinary returns the versitygw binary: in $ETCDBACKUP_S3_BIN_DIR, else
// in <repo root>/.cache/s3/bin.
func FindBinary() (string, error) {
	dir := os.Getenv(BinDirEnv)
	if dir == "" {
		root, err := repoRoot()
		if err != nil {
			return "", fmt.Errorf("%w: %v (set %s)", ErrBinaryMissing, err, BinDirEnv)
		}
		dir = filepath.Join(root, ".cache", "s3", "bin")
	}
	bin := filepath.Join(dir, binName)
	fi, err := os.Stat(bin)
	if err != nil || fi.IsDir() || fi.Mode()&0o111 == 0 {
		return "", fmt.Errorf("%w: no executable %s", ErrBinaryMissing, bin)
	}
	return bin, nil
}

func repoRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		if b, err := os.ReadFile(filepath.Join(dir, "go.mod")); err == nil {
			for line := range strings.SplitSeq(string(b), "\n") {
				if strings.TrimSpace(line) == "module "+rootModule {
					return dir, nil
				}
			}
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", fmt.Errorf("no go.mod of %s above the working directory", rootModule)
		}
		dir = parent
	}
}

// New prepares a server in dir (PKI, credentials, an empty bucket) without
// starting it; Restart starts it. Its certificate is valid for 127.0.0.1,
// localhost and dnsNames (e.g. a Service name pods use).
func New(dir, bin string, dnsNames ...string) (*Server, error) {
	s := &Server{
		dnsNames:        dnsNames,
		Bucket:          Bucket,
		Region:          Region,
		Dir:             dir,
		bin:             bin,
		AccessKeyID:     "AK" + randomHex(9),
		SecretAccessKey: "SK" + randomHex(19),
		logPath:         filepath.Join(dir, "versitygw.log"),
	}
	for _, d := range []string{"data", "versions", "iam", "pki", "credentials"} {
		if err := os.MkdirAll(filepath.Join(dir, d), 0o700); err != nil {
			return nil, err
		}
	}
	// The posix backend serves every directory of its root as a bucket.
	if err := os.Mkdir(filepath.Join(dir, "data", s.Bucket), 0o700); err != nil {
		return nil, err
	}
	s.AccessKeyIDFile = filepath.Join(dir, "credentials", "access-key-id")
	s.SecretAccessKeyFile = filepath.Join(dir, "credentials", "secret-access-key")
	if err := os.WriteFile(s.AccessKeyIDFile, []byte(s.AccessKeyID+"\n"), 0o600); err != nil {
		return nil, err
	}
	if err := os.WriteFile(s.SecretAccessKeyFile, []byte(s.SecretAccessKey+"\n"), 0o600); err != nil {
		return nil, err
	}
	if err := s.makePKI(); err != nil {
		return nil, fmt.Errorf("make PKI: %w", err)
	}
	port, err := freePort()
	if err != nil {
		return nil, err
	}
	s.addr = fmt.Sprintf("127.0.0.1:%d", port)
	s.Endpoint = "https://" + s.addr
	return s, nil
}

func randomHex(n int) string {
	b := make([]byte, n)
	if _, err := rand.Read(b); err != nil {
		panic(err)
	}
	return strings.ToUpper(hex.EncodeToString(b))
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// makePKI writes pki/ca.crt and a serving certificate for 127.0.0.1 and
// localhost signed by it.
func (s *Server) makePKI() error {
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return err
	}
	now := time.Now()
	caTmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: "s3test-ca"},
		NotBefore:             now.Add(-time.Hour),
		NotAfter:              now.Add(7 * 24 * time.Hour),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign,
		BasicConstraintsValid: true,
		IsCA:                  true,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		return err
	}
	ca, err := x509.ParseCertificate(caDER)
	if err != nil {
		return err
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return err
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(2),
		Subject:      pkix.Name{CommonName: "versitygw"},
		NotBefore:    now.Add(-time.Hour),
		NotAfter:     now.Add(7 * 24 * time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		DNSNames:     append([]string{"localhost"}, s.dnsNames...),
		IPAddresses:  []net.IP{net.IPv4(127, 0, 0, 1)},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &key.PublicKey, caKey)
	if err != nil {
		return err
	}
	keyDER, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return err
	}
	s.CAFile = filepath.Join(s.Dir, "pki", "ca.crt")
	s.certPEM = pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})
	for path, b := range map[string][]byte{
		s.CAFile:                               pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: caDER}),
		filepath.Join(s.Dir, "pki", "tls.crt"): s.certPEM,
		filepath.Join(s.Dir, "pki", "tls.key"): pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: keyDER}),
	} {
		if err := os.WriteFile(path, b, 0o600); err != nil {
			return err
		}
	}
	return nil
}

// Restart starts versitygw (again) on the same port and data directory,
// and waits until it answers HTTPS. It is a no-op if it runs.
func (s *Server) Restart() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cmd != nil {
		return nil
	}
	logf, err := os.OpenFile(s.logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return err
	}
	defer logf.Close() // the child has its own copy
	cmd := exec.Command(s.bin,
		"--access", s.AccessKeyID,
		"--secret", s.SecretAccessKey,
		"--region", s.Region,
		"--port", s.addr,
		"--iam-dir", filepath.Join(s.Dir, "iam"),
		"--cert", filepath.Join(s.Dir, "pki", "tls.crt"),
		"--key", filepath.Join(s.Dir, "pki", "tls.key"),
		// Versioning, and with it object lock, for the buckets that ask
		// (LockedBucket); the others stay unversioned.
		"posix", "--versioning-dir", filepath.Join(s.Dir, "versions"), filepath.Join(s.Dir, "data"))
	// Nothing from the test's environment (VGW_*, ROOT_*, AWS_*) applies.
	cmd.Env = []string{"PATH=/usr/bin:/bin", "HOME=" + s.Dir}
	cmd.Dir = s.Dir
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = childSysProcAttr()
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("start versitygw: %w", err)
	}
	exit := make(chan struct{})
	// Owned by the Server: Kill waits for it.
	go func() {
		_ = cmd.Wait()
		close(exit)
	}()
	s.cmd, s.exit = cmd, exit
	if err := s.waitReady(exit, 20*time.Second); err != nil {
		s.killLocked()
		return fmt.Errorf("versitygw did not start: %w\n%s", err, s.LogTail(20))
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if err := s.createLockedBucket(ctx); err != nil {
		s.killLocked()
		return fmt.Errorf("%w\n%s", err, s.LogTail(20))
	}
	return nil
}

// waitReady polls until the server answers HTTPS with its certificate.
func (s *Server) waitReady(exit <-chan struct{}, timeout time.Duration) error {
	pool := x509.NewCertPool()
	ca, err := os.ReadFile(s.CAFile)
	if err != nil {
		return err
	}
	pool.AppendCertsFromPEM(ca)
	c := &http.Client{
		Timeout:   2 * time.Second,
		Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}},
	}
	defer c.CloseIdleConnections()
	deadline := time.Now().Add(timeout)
	for {
		resp, err := c.Get(s.Endpoint + "/")
		if err == nil {
			resp.Body.Close()
			return nil // any HTTP answer (403 unauthenticated) means it serves
		}
		select {
		case <-exit:
			return errors.New("versitygw exited")
		case <-time.After(50 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("no HTTPS answer on %s within %v: %w", s.Endpoint, timeout, err)
		}
	}
}

// Addr is the host:port it listens on.
func (s *Server) Addr() string { return s.addr }

// Kill sends SIGKILL to versitygw (as a crash would) and waits for it to
// exit. Restart brings it back on the same data.
func (s *Server) Kill() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.killLocked()
}

func (s *Server) killLocked() {
	if s.cmd == nil {
		return
	}
	_ = s.cmd.Process.Signal(syscall.SIGKILL)
	<-s.exit
	s.cmd, s.exit = nil, nil
}

// Signal sends sig to versitygw: SIGSTOP makes a store that accepts
// connections but never answers, SIGCONT brings it back. For those two
// it returns once the signal took effect (on Linux).
func (s *Server) Signal(sig os.Signal) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cmd == nil {
		return errors.New("versitygw is not running")
	}
	if err := s.cmd.Process.Signal(sig); err != nil {
		return err
	}
	switch sig {
	case syscall.SIGSTOP:
		return waitStopped(s.cmd.Process.Pid, true)
	case syscall.SIGCONT:
		return waitStopped(s.cmd.Process.Pid, false)
	}
	return nil
}

// Running reports whether versitygw runs (it was not killed).
func (s *Server) Running() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.cmd != nil
}

// LogTail returns the last n lines of versitygw's output.
func (s *Server) LogTail(n int) string {
	b, err := os.ReadFile(s.logPath)
	if err != nil {
		return err.Error()
	}
	lines := bytes.Split(bytes.TrimRight(b, "\n"), []byte("\n"))
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return string(bytes.Join(lines, []byte("\n")))
}

// Client is an SDK client on the server with the root credentials, for
// tests to look at the bucket directly (ListMultipartUploads, objects).
func (s *Server) Client() *s3sdk.Client {
	return s3sdk.New(s3sdk.Options{
		Region:       s.Region,
		BaseEndpoint: aws.String(s.Endpoint),
		UsePathStyle: true,
		Credentials:  credentials.NewStaticCredentialsProvider(s.AccessKeyID, s.SecretAccessKey, ""),
		HTTPClient:   s.httpClient(),
		Logger:       logging.Nop{},
		DisableLogOutputChecksumValidationSkipped: true,
	})
}

// OpenMultipartUploads lists the multipart uploads open in the bucket.
func (s *Server) OpenMultipartUploads(ctx context.Context) ([]string, error) {
	var keys []string
	p := s3sdk.NewListMultipartUploadsPaginator(s.Client(), &s3sdk.ListMultipartUploadsInput{Bucket: aws.String(s.Bucket)})
	for p.HasMorePages() {
		page, err := p.NextPage(ctx)
		if err != nil {
			return nil, err
		}
		for _, u := range page.Uploads {
			keys = append(keys, aws.ToString(u.Key)+" "+aws.ToString(u.UploadId))
		}
	}
	return keys, nil
}

// Keys lists every object key in the bucket.
func (s *Server) Keys(ctx context.Context) ([]string, error) {
	var keys []string
	p := s3sdk.NewListObjectsV2Paginator(s.Client(), &s3sdk.ListObjectsV2Input{Bucket: aws.String(s.Bucket)})
	for p.HasMorePages() {
		page, err := p.NextPage(ctx)
		if err != nil {
			return nil, err
		}
		for _, o := range page.Contents {
			keys = append(keys, aws.ToString(o.Key))
		}
	}
	return keys, nil
}

// Config is a storage location configuration for this server under prefix,
// with the credentials in files and the test CA trusted.
func (s *Server) Config(prefix string) s3.Config {
	return s3.Config{S3Config: storage.S3Config{
		Bucket:              s.Bucket,
		Prefix:              prefix,
		Region:              s.Region,
		Endpoint:            s.Endpoint,
		PathStyle:           true,
		CABundleFile:        s.CAFile,
		AccessKeyIDFile:     s.AccessKeyIDFile,
		SecretAccessKeyFile: s.SecretAccessKeyFile,
	}}
}

// User is an account of the server other than root, its keys in files as
// a mounted Secret holds them (ConfigAs).
type User struct {
	AccessKeyID         string
	SecretAccessKey     string
	AccessKeyIDFile     string
	SecretAccessKeyFile string
}

// CreateUser adds an account of role "user" through versitygw's admin API
// (what `versitygw admin create-user` sends): it may do nothing with the
// bucket until a bucket policy (PutBucketPolicy) lets it.
func (s *Server) CreateUser(ctx context.Context) (User, error) {
	u := User{AccessKeyID: "AU" + randomHex(9), SecretAccessKey: "SU" + randomHex(19)}
	dir := filepath.Join(s.Dir, "credentials", u.AccessKeyID)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return u, err
	}
	u.AccessKeyIDFile, u.SecretAccessKeyFile = filepath.Join(dir, "access-key-id"), filepath.Join(dir, "secret-access-key")
	if err := os.WriteFile(u.AccessKeyIDFile, []byte(u.AccessKeyID+"\n"), 0o600); err != nil {
		return u, err
	}
	if err := os.WriteFile(u.SecretAccessKeyFile, []byte(u.SecretAccessKey+"\n"), 0o600); err != nil {
		return u, err
	}
	body, err := xml.Marshal(struct {
		XMLName xml.Name `xml:"Account"`
		Access  string
		Secret  string
		Role    string
	}{Access: u.AccessKeyID, Secret: u.SecretAccessKey, Role: "user"})
	if err != nil {
		return u, err
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPatch, s.Endpoint+"/create-user", bytes.NewReader(body))
	if err != nil {
		return u, err
	}
	sum := sha256.Sum256(body)
	payload := hex.EncodeToString(sum[:])
	req.Header.Set("X-Amz-Content-Sha256", payload)
	if err := v4.NewSigner().SignHTTP(ctx, aws.Credentials{AccessKeyID: s.AccessKeyID, SecretAccessKey: s.SecretAccessKey},
		req, payload, "s3", s.Region, time.Now()); err != nil {
		return u, err
	}
	resp, err := s.httpClient().Do(req)
	if err != nil {
		return u, fmt.Errorf("create user: %w", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode >= 300 {
		msg, _ := io.ReadAll(io.LimitReader(resp.Body, 4<<10))
		return u, fmt.Errorf("create user: %s: %s", resp.Status, msg)
	}
	return u, nil
}

// PutBucketPolicy sets the bucket's policy (a JSON document), as root.
func (s *Server) PutBucketPolicy(ctx context.Context, policy string) error {
	_, err := s.Client().PutBucketPolicy(ctx, &s3sdk.PutBucketPolicyInput{Bucket: aws.String(s.Bucket), Policy: aws.String(policy)})
	return err
}

// PolicyAllowingAllBut is a bucket policy that lets user do everything
// with the bucket and its objects but the object actions denied (such as
// "s3:DeleteObject"), which an explicit Deny refuses.
func (s *Server) PolicyAllowingAllBut(user User, denied ...string) string {
	bucket, objects := "arn:aws:s3:::"+s.Bucket, "arn:aws:s3:::"+s.Bucket+"/*"
	allow := fmt.Sprintf(`{"Effect":"Allow","Principal":{"AWS":[%q]},"Action":["s3:*"],"Resource":[%q,%q]}`, user.AccessKeyID, bucket, objects)
	if len(denied) == 0 {
		return `{"Version":"2012-10-17","Statement":[` + allow + `]}`
	}
	actions := make([]string, len(denied))
	for i, a := range denied {
		actions[i] = fmt.Sprintf("%q", a)
	}
	deny := fmt.Sprintf(`{"Effect":"Deny","Principal":{"AWS":[%q]},"Action":[%s],"Resource":[%q]}`, user.AccessKeyID, strings.Join(actions, ","), objects)
	return `{"Version":"2012-10-17","Statement":[` + allow + "," + deny + `]}`
}

// UserDenied creates a user (CreateUser) whom the bucket's policy lets
// do everything but the object actions denied (PolicyAllowingAllBut),
// e.g. "s3:DeleteObject": credentials that may write but not delete.
func (s *Server) UserDenied(t testing.TB, denied ...string) User {
	t.Helper()
	user, err := s.CreateUser(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if err := s.PutBucketPolicy(t.Context(), s.PolicyAllowingAllBut(user, denied...)); err != nil {
		t.Fatal(err)
	}
	return user
}

// ConfigAs is Config with user's credentials.
func (s *Server) ConfigAs(prefix string, user User) s3.Config {
	c := s.Config(prefix)
	c.AccessKeyIDFile, c.SecretAccessKeyFile = user.AccessKeyIDFile, user.SecretAccessKeyFile
	return c
}

// httpClient trusts the server's CA.
func (s *Server) httpClient() *http.Client {
	pool := x509.NewCertPool()
	ca, _ := os.ReadFile(s.CAFile)
	pool.AppendCertsFromPEM(ca)
	return &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}}}
}
