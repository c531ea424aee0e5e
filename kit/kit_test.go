package kit_test

import (
	"archive/tar"
	"bytes"
	"context"
	"errors"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"filippo.io/age"

	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/crypt"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/internal/agetest"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/kit"
)

const caKey = "-----BEGIN RSA PRIVATE KEY-----\nthe cluster CA's key, never in plaintext outside the node\n-----END RSA PRIVATE KEY-----\n"

// kubeadmHost lays out a kubeadm node's /etc/kubernetes under a
// directory standing for the host's root, and a secret beside it that
// no kit may hold.
func kubeadmHost(t *testing.T) string {
	t.Helper()
	host := t.TempDir()
	files := map[string]string{
		"etc/kubernetes/pki/ca.crt":                    "CA certificate",
		"etc/kubernetes/pki/ca.key":                    caKey,
		"etc/kubernetes/pki/sa.key":                    "service-account signing key",
		"etc/kubernetes/pki/etcd/ca.key":               "etcd CA key",
		"etc/kubernetes/manifests/etcd.yaml":           "kind: Pod\n",
		"etc/kubernetes/manifests/kube-apiserver.yaml": "kind: Pod\n",
		"etc/kubernetes/admin.conf":                    "kubeconfig",
		"etc/kubernetes/enc/encryption-config.yaml":    "kind: EncryptionConfiguration\n",
		"etc/shadow": "root:SECRET-OUTSIDE-THE-KIT:",
	}
	for name, body := range files {
		p := filepath.Join(host, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		mode := fs.FileMode(0o644)
		if strings.HasSuffix(name, ".key") {
			mode = 0o600
		}
		if err := os.WriteFile(p, []byte(body), mode); err != nil {
			t.Fatal(err)
		}
	}
	// A link to a file outside the kit's paths: recorded, never followed.
	if err := os.Symlink("/etc/shadow", filepath.Join(host, "etc/kubernetes/pki/leak")); err != nil {
		t.Fatal(err)
	}
	return host
}

func sealed(t *testing.T, host string, to ...age.Recipient) (*kit.Contents, *kit.Sealed) {
	t.Helper()
	c, err := kit.Collect(context.Background(), host, []string{"/etc/kubernetes"}, kit.Index{
		Backup: "cp-1", Node: "cp-1", Time: time.Date(2026, 12, 6, 2, 0, 0, 0, time.UTC),
		Versions: kit.Versions{Etcd: "3.6.5", Kubernetes: "v1.37.2"},
	})
	if err != nil {
		t.Fatal(err)
	}
	s, err := c.Seal(context.Background(), to)
	if err != nil {
		t.Fatal(err)
	}
	return c, s
}

func TestCollectSealOpen(t *testing.T) {
	host := kubeadmHost(t)
	key := agetest.NewKey(t)
	c, s := sealed(t, host, key.Identity.Recipient())

	if bytes.Contains(s.Data, []byte("the cluster CA's key")) || bytes.Contains(s.Data, []byte("service-account signing key")) {
		t.Fatal("the sealed kit holds a key in plaintext")
	}
	got, err := kit.Open(bytes.NewReader(s.Data), []age.Identity{key.Identity})
	if err != nil {
		t.Fatal(err)
	}
	if string(got.Data["/etc/kubernetes/pki/ca.key"]) != caKey {
		t.Errorf("ca.key opened as %q", got.Data["/etc/kubernetes/pki/ca.key"])
	}
	if got.Index.Versions != (kit.Versions{Etcd: "3.6.5", Kubernetes: "v1.37.2"}) || got.Index.Backup != "cp-1" {
		t.Errorf("index %+v", got.Index)
	}
	byPath := map[string]kit.File{}
	for _, f := range got.Index.Files {
		byPath[f.Path] = f
	}
	if f := byPath["/etc/kubernetes/pki/ca.key"]; f.Mode.Perm() != 0o600 || f.SHA256 == "" {
		t.Errorf("ca.key recorded as %+v", f)
	}
	if f := byPath["/etc/kubernetes/pki/leak"]; f.Link != "/etc/shadow" || f.Size != 0 {
		t.Errorf("the link was not recorded as a link: %+v", f)
	}
	for p, b := range got.Data {
		if strings.Contains(string(b), "SECRET-OUTSIDE-THE-KIT") {
			t.Errorf("%s holds a file from outside the kit's paths", p)
		}
	}
	if len(got.Index.Files) != len(c.Index.Files) || len(got.Data) != 8 {
		t.Errorf("opened %d entries and %d files, collected %d entries", len(got.Index.Files), len(got.Data), len(c.Index.Files))
	}
}

// The independent age CLI opens a sealed kit to a plain tar whose first
// entry is the index: the format is age's and tar's, nothing of ours.
func TestSealedKitOpensWithTheAgeCLI(t *testing.T) {
	bin := agetest.Binary(t, "age")
	key := agetest.NewKey(t)
	_, s := sealed(t, kubeadmHost(t), key.Identity.Recipient())
	cmd := exec.Command(bin, "--decrypt", "-i", key.File)
	cmd.Stdin = bytes.NewReader(s.Data)
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("age --decrypt: %v", err)
	}
	tr := tar.NewReader(bytes.NewReader(out))
	var names []string
	found := ""
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		names = append(names, h.Name)
		if h.Name == "etc/kubernetes/pki/ca.key" {
			b, _ := io.ReadAll(tr)
			found = string(b)
		}
	}
	if found != caKey || !strings.HasSuffix(names[0], ".json") {
		t.Fatalf("age opened a tar of %v; ca.key %q", names, found)
	}
}

func TestOpenRefuses(t *testing.T) {
	key, other := agetest.NewKey(t), agetest.NewKey(t)
	_, s := sealed(t, kubeadmHost(t), key.Identity.Recipient())

	if _, err := kit.Open(bytes.NewReader(s.Data), []age.Identity{other.Identity}); !errors.Is(err, crypt.ErrNoMatchingIdentity) {
		t.Errorf("another identity: %v, want ErrNoMatchingIdentity", err)
	}
	flipped := bytes.Clone(s.Data)
	flipped[len(flipped)-100] ^= 1
	if _, err := kit.Open(bytes.NewReader(flipped), []age.Identity{key.Identity}); !errors.Is(err, crypt.ErrTampered) {
		t.Errorf("a flipped byte: %v, want ErrTampered", err)
	}
	// Anyone can seal to a public key: a kit whose files differ from its
	// index is refused even though it decrypts.
	c, _ := sealed(t, kubeadmHost(t), key.Identity.Recipient())
	c.Data["/etc/kubernetes/pki/ca.key"] = []byte("planted")
	forged, err := c.Seal(context.Background(), []age.Recipient{key.Identity.Recipient()})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := kit.Open(bytes.NewReader(forged.Data), []age.Identity{key.Identity}); !errors.Is(err, kit.ErrDamaged) {
		t.Errorf("files unlike the index: %v, want ErrDamaged", err)
	}
}

func TestCheckPaths(t *testing.T) {
	for _, p := range []string{"etc/kubernetes", "/etc/../etc/kubernetes", "/", "/etc/kubernetes/"} {
		if err := kit.CheckPaths([]string{p}); err == nil {
			t.Errorf("path %q accepted", p)
		}
	}
	if err := kit.CheckPaths([]string{"/etc/kubernetes", "/etc/encryption"}); err != nil {
		t.Error(err)
	}
}

func TestInstallMovesAsideAndRefusesWhatLeavesItsPaths(t *testing.T) {
	key := agetest.NewKey(t)
	_, s := sealed(t, kubeadmHost(t), key.Identity.Recipient())
	c, err := kit.Open(bytes.NewReader(s.Data), []age.Identity{key.Identity})
	if err != nil {
		t.Fatal(err)
	}
	root := t.TempDir()
	old := filepath.Join(root, "etc/kubernetes/pki/ca.key")
	if err := os.MkdirAll(filepath.Dir(old), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(old, []byte("a newer CA nobody should lose"), 0o600); err != nil {
		t.Fatal(err)
	}
	steps, err := c.Plan(root, time.Date(2026, 12, 6, 3, 0, 0, 0, time.UTC))
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Install(steps); err != nil {
		t.Fatal(err)
	}
	if b, _ := os.ReadFile(old); string(b) != caKey {
		t.Errorf("ca.key holds %q after the install", b)
	}
	aside := filepath.Join(root, "etc/kubernetes/pki/.ca.key.before-rebuild-20261206T030000Z")
	if b, _ := os.ReadFile(aside); string(b) != "a newer CA nobody should lose" {
		t.Errorf("the file that was there is not at %s: %q", aside, b)
	}
	if fi, err := os.Stat(old); err != nil || fi.Mode().Perm() != 0o600 {
		t.Errorf("ca.key installed with %v, %v", fi.Mode(), err)
	}
	if l, err := os.Readlink(filepath.Join(root, "etc/kubernetes/pki/leak")); err != nil || l != "/etc/shadow" {
		t.Errorf("link installed as %q, %v", l, err)
	}

	// An entry outside the kit's own paths, as a forged index could hold.
	c.Index.Files = append(c.Index.Files, kit.File{Path: "/etc/cron.d/evil", Mode: 0o644})
	if _, err := c.Plan(t.TempDir(), time.Now()); !errors.Is(err, kit.ErrOutside) {
		t.Errorf("an entry outside the kit's paths: %v, want ErrOutside", err)
	}
	c.Index.Files = c.Index.Files[:len(c.Index.Files)-1]

	// A directory on the node that is a link: writing through it lands
	// elsewhere.
	linked := t.TempDir()
	if err := os.MkdirAll(filepath.Join(linked, "etc"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(t.TempDir(), filepath.Join(linked, "etc/kubernetes")); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Plan(linked, time.Now()); err == nil || !strings.Contains(err.Error(), "symbolic link") {
		t.Errorf("a path through a link: %v", err)
	}
}
