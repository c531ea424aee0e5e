package plugin

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	clientv3 "go.etcd.io/etcd/client/v3"

	ebv1 "github.com/kubectl-etcdbackup/kubectl-etcdbackup/api/etcdbackup/v1"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/client"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/crypt"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/internal/agetest"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/server/servertest"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/snapshot"
)

const marker = "s3cr3t-value-4c1d"

// noFiles fails t if any of paths exists.
func noFiles(t *testing.T, paths ...string) {
	t.Helper()
	for _, p := range paths {
		if _, err := os.Stat(p); !os.IsNotExist(err) {
			t.Errorf("%s exists after a refused download: %v", p, err)
		}
	}
}

// An etcd snapshot with a marker, uploaded with --encrypt-to: the stored
// object hides the marker; download needs the identity, refuses a wrong
// one and a flipped byte without leaving a file, and with the right one
// writes exactly the original snapshot, to a file or to stdout.
func TestEncryptedUploadDownloadVerify(t *testing.T) {
	srv := servertest.Start(t, "")
	addr := "--server-address=" + srv.Addr
	snapFile := etcdSnapshot(t, map[string]string{"/registry/secrets/default/db": marker})
	snap, _ := os.ReadFile(snapFile)
	key, breakGlass, wrong := agetest.NewKey(t), agetest.NewKey(t), agetest.NewKey(t)
	pub := filepath.Join(t.TempDir(), "break-glass.pub")
	os.WriteFile(pub, []byte("# break-glass, in the safe\n"+breakGlass.Recipient+"\n"), 0o600)

	mustFail(t, "this is an age identity (a secret key)", addr, "upload", snapFile, "--name", "x", "--encrypt-to", key.Identity.String())
	r := mustRun(t, addr, "upload", snapFile, "--name", "enc", "--encrypt-to", key.Recipient, "--encrypt-to-file", pub)
	if !strings.Contains(r.out, "age-encrypted to 2 recipient(s)") || !strings.Contains(r.out, sha(snap)) {
		t.Fatalf("upload said %q", r.out)
	}
	stored, err := os.ReadFile(filepath.Join(srv.Dir, "backups", "enc.db"))
	if err != nil {
		t.Fatal(err)
	}
	if bytes.Contains(stored, []byte(marker)) || !bytes.HasPrefix(stored, crypt.Magic) {
		t.Fatal("the stored object shows the marker or is not an age file")
	}

	dir := t.TempDir()
	out := filepath.Join(dir, "snapshot.db")
	t.Setenv(IdentityEnv, "")
	r = mustFail(t, "--identity", addr, "download", "enc", "-o", out)
	if !strings.Contains(r.err.Error(), "age-encrypted") {
		t.Fatalf("refusal %v", r.err)
	}
	t.Logf("no identity: %v", r.err)
	noFiles(t, out, out+".part")
	r = mustFail(t, "none of the identities given", addr, "download", "enc", "-o", out, "--identity", wrong.File)
	t.Logf("wrong identity: %v", r.err)
	noFiles(t, out, out+".part")

	mustRun(t, addr, "download", "enc", "-o", out, "--identity", wrong.File, "--identity", breakGlass.File)
	if got, _ := os.ReadFile(out); !bytes.Equal(got, snap) {
		t.Fatalf("download wrote %d bytes, not the original %d-byte snapshot", len(got), len(snap))
	}
	if _, err := snapshot.Check(out); err != nil {
		t.Fatal(err)
	}
	t.Setenv(IdentityEnv, key.File)
	if r := mustRun(t, addr, "download", "enc", "-o", "-"); r.out != string(snap) {
		t.Fatalf("-o - wrote %d bytes", len(r.out))
	}
	raw := filepath.Join(dir, "enc.age")
	mustRun(t, addr, "download", "enc", "-o", raw, "--raw")
	if got, _ := os.ReadFile(raw); !bytes.Equal(got, stored) {
		t.Fatal("--raw did not write the stored bytes")
	}

	// verify: the server checks what it can and says so; with the
	// identity the client checks the rest.
	t.Setenv(IdentityEnv, "")
	r = mustRun(t, addr, "verify", "enc")
	if !strings.Contains(r.out, "age-encrypted") || !strings.Contains(r.out, "--identity") {
		t.Fatalf("verify without identity: %q", r.out)
	}
	r = mustRun(t, addr, "verify", "enc", "--identity", key.File)
	if !strings.Contains(r.out, "is intact") || !strings.Contains(r.out, "keys") {
		t.Fatalf("verify with identity: %q", r.out)
	}

	// A flipped ciphertext byte: refused, nothing written, verify says corrupt.
	stored[len(stored)-200] ^= 1
	if err := os.WriteFile(filepath.Join(srv.Dir, "backups", "enc.db"), stored, 0o600); err != nil {
		t.Fatal(err)
	}
	out2 := filepath.Join(dir, "flipped.db")
	r = mustFail(t, "", addr, "download", "enc", "-o", out2, "--identity", key.File)
	t.Logf("flipped byte: %v", r.err)
	noFiles(t, out2, out2+".part")
	mustFail(t, "corrupt", addr, "verify", "enc", "--identity", key.File)

	// Whoever can write the bucket can rewrite the manifest's SHA-256 too:
	// then age's authentication is what refuses the altered bytes.
	manifest := filepath.Join(srv.Dir, "backups", "enc.json")
	m, _ := os.ReadFile(manifest)
	var doc map[string]any
	if err := json.Unmarshal(m, &doc); err != nil {
		t.Fatal(err)
	}
	doc["sha256"] = sha(stored)
	m, _ = json.Marshal(doc)
	os.WriteFile(manifest, m, 0o600)
	r = mustFail(t, "damaged or was altered", addr, "download", "enc", "-o", out2, "--identity", key.File)
	t.Logf("flipped byte, manifest rewritten: %v", r.err)
	noFiles(t, out2, out2+".part")
}

// restore --local --identity brings the marker back; without the identity
// the refusal names --identity and nothing is written.
func TestRestoreLocalEncrypted(t *testing.T) {
	t.Setenv(IdentityEnv, "")
	addr := startServer(t)
	key := agetest.NewKey(t)
	mustRun(t, addr, "upload", etcdSnapshot(t, map[string]string{"marker": marker}), "--name", "enc", "--encrypt-to", key.Recipient)
	dataDir := filepath.Join(t.TempDir(), "etcd")
	peer := freeURL(t)
	args := []string{addr, "restore", "enc", "--local", "--data-dir", dataDir, "--member-name", "m1",
		"--initial-cluster", "m1=" + peer.String(), "--initial-advertise-peer-urls", peer.String()}
	mustFail(t, "--identity KEYFILE", args...)
	noFiles(t, dataDir)
	mustRun(t, append(args, "--identity", key.File)...)
	c := startEtcd(t, dataDir, "m1", peer)
	resp, err := c.Get(context.Background(), "marker", clientv3.WithPrefix())
	if err != nil || len(resp.Kvs) != 1 || string(resp.Kvs[0].Value) != marker {
		t.Fatalf("restored marker: %v %v", resp, err)
	}
}

// A zstd backup downloads as a plain snapshot; --raw keeps the zstd bytes.
func TestCompressedBackupDownloadsPlain(t *testing.T) {
	srv := servertest.Start(t, "")
	addr := "--server-address=" + srv.Addr
	snapFile := etcdSnapshot(t, map[string]string{"k": marker})
	snap, _ := os.ReadFile(snapFile)
	ctx := context.Background()
	body, err := snapshot.Compress(ctx, bytes.NewReader(snap), ebv1.CompressionZstd)
	if err != nil {
		t.Fatal(err)
	}
	defer body.Close()
	if _, err := srv.Client.UploadWith(ctx, body, client.UploadRequest{
		Header: &ebv1.UploadHeader{Name: "z", Compression: ebv1.CompressionZstd},
		Raw:    func() (int64, string) { return int64(len(snap)), sha(snap) },
	}); err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	mustRun(t, addr, "download", "z", "-o", filepath.Join(dir, "plain.db"))
	if got, _ := os.ReadFile(filepath.Join(dir, "plain.db")); !bytes.Equal(got, snap) {
		t.Fatal("plain download is not the snapshot")
	}
	mustRun(t, addr, "download", "z", "-o", filepath.Join(dir, "z.zst"), "--raw")
	stored, _ := os.ReadFile(filepath.Join(srv.Dir, "backups", "z.db"))
	if got, _ := os.ReadFile(filepath.Join(dir, "z.zst")); !bytes.Equal(got, stored) || bytes.Equal(got, snap) {
		t.Fatal("--raw is not the stored zstd bytes")
	}
}
