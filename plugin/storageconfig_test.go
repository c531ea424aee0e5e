package plugin

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/internal/agetest"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/internal/etcdtest"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/ledger"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/server/breakglass"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/server/servertest"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/storage"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/storage/filesystem"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/storage/s3/s3test"
)

// useBreakGlass wires --storage-config as the binary does.
func useBreakGlass(t *testing.T) {
	t.Helper()
	OpenStorage = breakglass.Open
	t.Cleanup(func() { OpenStorage = nil })
	// No cluster to reach: any attempt to read a kubeconfig or contact an
	// API server fails.
	t.Setenv("KUBECONFIG", os.DevNull)
	t.Setenv("HOME", t.TempDir())
}

func writeConfig(t *testing.T, body string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "storage.yaml")
	if err := os.WriteFile(path, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// The control plane is down and only the server's volume is left (its
// directory, as a node holds a PersistentVolume): with --storage-config,
// and no kubeconfig at all, every reading command works on it as it does
// online, with the same checks, and writes nothing there.
func TestStorageConfigReadsAFilesystemLocation(t *testing.T) {
	srv := servertest.Start(t, "")
	addr := "--server-address=" + srv.Addr
	snap := etcdSnapshot(t, map[string]string{"/registry/before": "v1"})
	want, err := os.ReadFile(snap)
	if err != nil {
		t.Fatal(err)
	}
	mustRun(t, addr, "upload", snap, "--name", "cp-1", "--labels", "env=prod")
	other := filepath.Join(t.TempDir(), "other.db")
	etcdtest.SnapshotFile(t, other, 64<<10)
	mustRun(t, addr, "upload", other, "--name", "cp-2")
	online := mustRun(t, addr, "get", "cp-1", "-o", "json").out
	srv.Stop()

	useBreakGlass(t)
	cfg := writeConfig(t, fmt.Sprintf("locations:\n  - name: default\n    filesystem: {path: %s}\n", srv.Dir))
	before := servertest.TreeDigestBesidesLedger(t, srv.Dir)

	r := mustRun(t, "list", "--storage-config", cfg, "-o", "name")
	if r.out != "backup/cp-2\nbackup/cp-1\n" && r.out != "backup/cp-1\nbackup/cp-2\n" {
		t.Errorf("list: %q", r.out)
	}
	r = mustRun(t, "list", "--storage-config", cfg, "-l", "env=prod", "-o", "wide")
	if !strings.Contains(r.out, "cp-1") || strings.Contains(r.out, "cp-2") {
		t.Errorf("list -l env=prod -o wide:\n%s", r.out)
	}
	if got := mustRun(t, "get", "cp-1", "--storage-config", cfg, "-o", "json").out; got != online {
		t.Errorf("get -o json with --storage-config:\n%s\nonline:\n%s", got, online)
	}
	var b Backup
	if err := json.Unmarshal([]byte(online), &b); err != nil {
		t.Fatal(err)
	}
	if e := b.Status.Etcd; e == nil || !e.SnapshotStatus || e.Revision == 0 || e.TotalKeys == 0 || e.Hash == "" {
		t.Errorf("the uploaded backup records no snapshot status: %+v", b.Status.Etcd)
	}
	r = mustRun(t, "describe", "cp-1", "--storage-config", cfg)
	for _, w := range []string{"Name:", "cp-1", "Revision:", "Keys:", "Hash:"} {
		if !strings.Contains(r.out, w) {
			t.Errorf("describe lacks %q:\n%s", w, r.out)
		}
	}
	r = mustRun(t, "verify", "cp-1", "--storage-config", cfg)
	if !strings.Contains(r.out, "intact") && !strings.Contains(r.out, "verified") {
		t.Errorf("verify: %s", r.out)
	}
	out := filepath.Join(t.TempDir(), "out.db")
	r = mustRun(t, "download", "cp-1", "--storage-config", cfg, "-o", out)
	got, err := os.ReadFile(out)
	if err != nil || sha(got) != sha(want) {
		t.Fatalf("downloaded %d bytes (%v), want the uploaded snapshot", len(got), err)
	}

	dataDir := filepath.Join(t.TempDir(), "member")
	peer := freeURL(t)
	r = mustRun(t, "restore", "cp-1", "--local", "--storage-config", cfg, "--data-dir", dataDir,
		"--member-name", "m1", "--initial-cluster", "m1="+peer.String(), "--initial-advertise-peer-urls", peer.String())
	if !strings.Contains(r.out, "revision bumped by 1000000000") {
		t.Errorf("restore says nothing of the revision bump:\n%s", r.out)
	}
	c := startEtcd(t, dataDir, "m1", peer)
	resp, err := c.Get(context.Background(), "/registry/before")
	if err != nil || len(resp.Kvs) != 1 || string(resp.Kvs[0].Value) != "v1" {
		t.Fatalf("the restored member: %+v, %v", resp, err)
	}

	if after := servertest.TreeDigestBesidesLedger(t, srv.Dir); after != before {
		t.Errorf("the location changed under --storage-config:\nbefore:\n%s\nafter:\n%s", before, after)
	}
	// Only the ledger grew: each read of the backup's bytes on this
	// machine (verify, download, restore) is recorded.
	entries := breakGlassEntries(t, srv.Dir)
	if want := []string{"break-glass read cp-1", "break-glass read cp-1", "break-glass read cp-1"}; !slices.Equal(entries, want) {
		t.Errorf("the break-glass reads in the ledger: %q", entries)
	}
}

// breakGlassEntries are the break-glass reads in the filesystem
// location at dir's ledger, as "ACTION BACKUP".
func breakGlassEntries(t *testing.T, dir string) []string {
	t.Helper()
	loc, err := filesystem.NewReadOnly(dir)
	if err != nil {
		t.Fatal(err)
	}
	recs, err := loc.ReadLedger(context.Background(), 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	r := ledger.Verify(recs)
	if r.Problem != "" {
		t.Fatalf("the ledger: %s", r.Problem)
	}
	var out []string
	for _, e := range r.Entries {
		if e.Action == ledger.ActionBreakGlass {
			out = append(out, e.Action+" "+e.Backup)
		}
	}
	return out
}

// Every check of the online path holds: a stored backup whose bytes were
// altered is refused by download and verify, and nothing is written.
func TestStorageConfigChecksWhatItReads(t *testing.T) {
	srv := servertest.Start(t, "")
	addr := "--server-address=" + srv.Addr
	snap := etcdSnapshot(t, map[string]string{"k": "v"})
	mustRun(t, addr, "upload", snap, "--name", "b")
	srv.Stop()
	data := filepath.Join(srv.Dir, "backups", "b.db")
	f, err := os.OpenFile(data, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteAt([]byte("XXXX"), 8192); err != nil {
		t.Fatal(err)
	}
	f.Close()

	useBreakGlass(t)
	cfg := writeConfig(t, fmt.Sprintf("locations:\n  - name: default\n    filesystem: {path: %s}\n", srv.Dir))
	out := filepath.Join(t.TempDir(), "out.db")
	r := run(t, "download", "b", "--storage-config", cfg, "-o", out)
	if r.err == nil || !strings.Contains(r.err.Error(), "SHA-256") {
		t.Errorf("download of an altered backup: %v", r.err)
	}
	if _, err := os.Stat(out); err == nil {
		t.Errorf("%s was written from an altered backup", out)
	}
	r = run(t, "verify", "b", "--storage-config", cfg)
	if r.err == nil || ExitCode(r.err) != ExitFailed {
		t.Errorf("verify of an altered backup: exit %d, %v\n%s", ExitCode(r.err), r.err, r.out)
	}
}

// An encrypted backup is decrypted on this machine with --identity, as
// online.
func TestStorageConfigDecryptsWithIdentity(t *testing.T) {
	srv := servertest.Start(t, "")
	addr := "--server-address=" + srv.Addr
	key := agetest.NewKey(t)
	snap := etcdSnapshot(t, map[string]string{"k": "v"})
	want, _ := os.ReadFile(snap)
	mustRun(t, addr, "upload", snap, "--name", "enc", "--encrypt-to", key.Recipient)
	srv.Stop()

	useBreakGlass(t)
	cfg := writeConfig(t, fmt.Sprintf("locations:\n  - name: default\n    filesystem: {path: %s}\n", srv.Dir))
	out := filepath.Join(t.TempDir(), "out.db")
	r := run(t, "download", "enc", "--storage-config", cfg, "-o", out)
	if r.err == nil || !strings.Contains(r.err.Error(), "--identity") {
		t.Errorf("download of an encrypted backup without --identity: %v", r.err)
	}
	mustRun(t, "download", "enc", "--storage-config", cfg, "-o", out, "--identity", key.File)
	if got, _ := os.ReadFile(out); sha(got) != sha(want) {
		t.Errorf("decrypted download differs from the snapshot")
	}
}

// The bucket itself, with credentials the operator holds: the same
// commands, over S3, writing nothing to the bucket. Relative credential
// paths are the config file's.
func TestStorageConfigReadsAnS3Location(t *testing.T) {
	store := s3test.Start(t)
	s3cfg := store.Config("servertest").S3Config
	srv := servertest.StartWith(t, servertest.Options{Configured: []storage.LocationConfig{{Name: "s3", S3: &s3cfg}}})
	addr := "--server-address=" + srv.Addr
	snap := etcdSnapshot(t, map[string]string{"/registry/x": "y"})
	want, _ := os.ReadFile(snap)
	mustRun(t, addr, "upload", snap, "--name", "in-s3", "--location", "s3")
	srv.Stop()
	ctx := context.Background()
	keysBefore, err := store.Keys(ctx)
	if err != nil {
		t.Fatal(err)
	}

	useBreakGlass(t)
	dir := t.TempDir()
	for name, from := range map[string]string{"id": store.AccessKeyIDFile, "secret": store.SecretAccessKeyFile} {
		b, err := os.ReadFile(from)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, name), b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	cfg := filepath.Join(dir, "storage.yaml")
	body := fmt.Sprintf(`apiVersion: v1
kind: ConfigMap
metadata: {name: etcdbackup-config, namespace: etcdbackup-system}
data:
  config.yaml: |
    locations:
      - name: s3
        s3:
          bucket: %s
          prefix: servertest
          region: %s
          endpoint: %s
          pathStyle: true
          caBundleFile: %s
          accessKeyIDFile: id
          secretAccessKeyFile: secret
    targets:
      - name: control-plane
        endpoints: [https://10.0.0.1:2379]
        tlsSecret: etcd-client
`, store.Bucket, store.Region, store.Endpoint, store.CAFile)
	if err := os.WriteFile(cfg, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	r := mustRun(t, "list", "--storage-config", cfg, "-o", "name")
	if r.out != "backup/in-s3\n" {
		t.Errorf("list: %q", r.out)
	}
	out := filepath.Join(t.TempDir(), "out.db")
	mustRun(t, "download", "in-s3", "--storage-config", cfg, "-o", out)
	if got, _ := os.ReadFile(out); sha(got) != sha(want) {
		t.Errorf("downloaded snapshot differs")
	}
	mustRun(t, "verify", "in-s3", "--storage-config", cfg)
	keysAfter, err := store.Keys(ctx)
	if err != nil {
		t.Fatal(err)
	}
	// Nothing but the ledger changed: each read of the backup's bytes is
	// recorded there.
	backups := func(keys []string) string {
		return strings.Join(slices.DeleteFunc(slices.Clone(keys), func(k string) bool { return strings.Contains(k, "/ledger/") }), ",")
	}
	if backups(keysAfter) != backups(keysBefore) || len(keysAfter) <= len(keysBefore) {
		t.Errorf("bucket keys changed: %v → %v; want only ledger records added", keysBefore, keysAfter)
	}
}

// Mistakes are named with what to do, and change nothing.
func TestStorageConfigErrors(t *testing.T) {
	useBreakGlass(t)
	empty := t.TempDir()
	for _, tc := range []struct {
		name string
		cfg  string // "" for a missing file
		args []string
		want string
		code int
	}{
		{"missing file", "", []string{"list"}, "no such file", ExitError},
		{"no locations", "targets: []\n", []string{"list"}, "locations: Required value", ExitError},
		{"misspelled key", "locations:\n  - name: d\n    filesystem: {paht: /x}\n", []string{"list"}, `unknown field "paht"`, ExitError},
		{"no credentials", "locations:\n  - name: s3\n    s3: {bucket: b}\n", []string{"list"}, "no credentials configured", ExitError},
		{"not a location's directory", "locations:\n  - name: d\n    filesystem: {path: " + empty + "}\n", []string{"get", "x"}, "no backups directory", ExitError},
		{"with --server-address", "locations:\n  - name: d\n    filesystem: {path: /x}\n", []string{"list", "--server-address=" + nowhere}, "does not go with --server-address", ExitUsage},
		{"in-cluster restore", "locations:\n  - name: d\n    filesystem: {path: /x}\n", []string{"restore", "b", "--target", "cp"}, "goes with --local", ExitUsage},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := filepath.Join(t.TempDir(), "missing.yaml")
			if tc.cfg != "" {
				cfg = writeConfig(t, tc.cfg)
			}
			r := run(t, append(tc.args, "--storage-config", cfg)...)
			if r.err == nil || !strings.Contains(r.err.Error(), tc.want) || ExitCode(r.err) != tc.code {
				t.Errorf("error %v (exit %d), want %q (exit %d)", r.err, ExitCode(r.err), tc.want, tc.code)
			}
		})
	}
	// Commands that write do not take it.
	for _, args := range [][]string{{"upload", "f"}, {"delete", "b"}, {"backup"}, {"prune"}} {
		r := run(t, append(args, "--storage-config", "x.yaml")...)
		if r.err == nil || !strings.Contains(r.err.Error(), "unknown flag: --storage-config") {
			t.Errorf("%v --storage-config: %v", args, r.err)
		}
	}
}
