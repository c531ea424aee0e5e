package e2e

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/snapshot"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/storage/s3/s3test"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/tests/world"
)

// The server binary with two locations from its config file — filesystem
// and a real S3 server over HTTPS with its own CA — and the agent binary
// streaming etcd into the S3 one. The plugin lists and downloads it; etcd's
// own status of the download matches the source.
func TestBackupIntoS3Location(t *testing.T) {
	s3 := s3test.Start(t)
	dir := t.TempDir()
	config := filepath.Join(dir, "config.yaml")
	err := os.WriteFile(config, fmt.Appendf(nil, `locations:
  - name: default
    filesystem: {path: %s}
  - name: s3
    s3:
      bucket: %s
      prefix: e2e
      region: %s
      endpoint: %s
      pathStyle: true
      caBundleFile: %s
      accessKeyIDFile: %s
      secretAccessKeyFile: %s
`, filepath.Join(dir, "fs"), s3.Bucket, s3.Region, s3.Endpoint, s3.CAFile, s3.AccessKeyIDFile, s3.SecretAccessKeyFile), 0o600)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	log := &testLog{t: t, prefix: "server: "}
	srv, err := world.StartServerArgs(ctx, binDir, log, "--config", config)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = srv.Stop() })
	addr := "--server-address=" + srv.Addr

	r := mustSucceed(t, plugin(t, addr, "version"), "version")
	if !strings.Contains(r.Stdout, "Storage Location: s3, s3: s3://"+s3.Bucket+"/e2e") || strings.Contains(r.Stdout, s3.SecretAccessKey) {
		t.Fatalf("version does not show the s3 location (or shows a secret): %s", r)
	}

	ms := newMembers(t, 1)
	startMembers(t, ms)
	ec := etcdClient(t, ms)
	for i := 0; i < 300; i++ {
		put(t, ec, fmt.Sprintf("/k/%04d", i), strings.Repeat("v", 2048))
	}
	mustSucceed(t, runAgent(t, "backup", "--server", srv.Addr, "--name", "to-s3", "--location", "s3", "--compression", "zstd",
		"--endpoint", ms[0].clientURL.String(), "--insecure-plaintext"), "agent backup into s3")

	r = mustSucceed(t, plugin(t, addr, "list", "--location", "s3"), "list s3")
	if !strings.Contains(r.Stdout, "to-s3") || !strings.Contains(r.Stdout, "Completed") {
		t.Fatalf("list --location s3: %s", r)
	}
	// list spans every location; --location filters.
	r = mustSucceed(t, plugin(t, addr, "list"), "list")
	if !strings.Contains(r.Stdout, "to-s3") || !strings.Contains(r.Stdout, "s3") {
		t.Fatalf("list does not show the s3 backup: %s", r)
	}
	r = mustSucceed(t, plugin(t, addr, "list", "--location", "default"), "list default")
	if strings.Contains(r.Stdout, "to-s3") {
		t.Fatalf("the s3 backup shows in the default location: %s", r)
	}
	mustSucceed(t, plugin(t, addr, "verify", "to-s3", "--location", "s3"), "verify in s3")

	out := filepath.Join(dir, "to-s3.zst")
	mustSucceed(t, plugin(t, addr, "download", "to-s3", "--location", "s3", "-o", out), "download from s3")
	db, err := snapshot.Unpack(context.Background(), out, dir)
	if err != nil {
		t.Fatal(err)
	}
	got, err := snapshot.Check(db)
	if err != nil {
		t.Fatal(err)
	}
	ctx2, cancel2 := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel2()
	st, err := ec.Status(ctx2, ms[0].clientURL.String())
	if err != nil {
		t.Fatal(err)
	}
	if got.Revision != st.Header.Revision || got.TotalKey < 300 {
		t.Fatalf("downloaded snapshot: revision %d, %d keys; etcd is at revision %d", got.Revision, got.TotalKey, st.Header.Revision)
	}
	if uploads, err := s3.OpenMultipartUploads(ctx2); err != nil || len(uploads) != 0 {
		t.Fatalf("multipart uploads left open: %v %v", uploads, err)
	}
}
