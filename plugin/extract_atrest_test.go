package plugin

import (
	"context"
	"crypto/aes"
	"crypto/rand"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apiserver/pkg/storage/value"
	aestransformer "k8s.io/apiserver/pkg/storage/value/encrypt/aes"
	"k8s.io/apiserver/pkg/storage/value/encrypt/secretbox"

	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/snapshot/kube/kubetest"
)

// Secrets encrypted at rest by kube-apiserver's own transformers (aescbc,
// aesgcm bound to their etcd key, secretbox), in a real etcd: with the
// API server's EncryptionConfiguration, extract prints them with their
// data and inspect counts them by provider and key; a KMS one is named
// as not openable offline; a configuration with other keys of the same
// names opens nothing and says so; a file that is no configuration is a
// usage error naming the flag.
func TestExtractSecretsEncryptedAtRest(t *testing.T) {
	random := func(n int) []byte {
		b := make([]byte, n)
		if _, err := rand.Read(b); err != nil {
			t.Fatal(err)
		}
		return b
	}
	type provider struct {
		name, key string
		secret    []byte
		make      func(secret []byte) value.Transformer
	}
	providers := []provider{
		{"aescbc", "key1", random(32), func(s []byte) value.Transformer {
			b, _ := aes.NewCipher(s)
			return aestransformer.NewCBCTransformer(b)
		}},
		{"aesgcm", "gcm1", random(32), func(s []byte) value.Transformer {
			b, _ := aes.NewCipher(s)
			tr, err := aestransformer.NewGCMTransformer(b)
			if err != nil {
				t.Fatal(err)
			}
			return tr
		}},
		{"secretbox", "box1", random(32), func(s []byte) value.Transformer {
			var k [32]byte
			copy(k[:], s)
			return secretbox.NewSecretboxTransformer(k)
		}},
	}
	config := func(ps []provider) string {
		path := filepath.Join(t.TempDir(), "encryption-config.yaml")
		var b strings.Builder
		b.WriteString("apiVersion: apiserver.config.k8s.io/v1\nkind: EncryptionConfiguration\nresources:\n- resources: [secrets]\n  providers:\n")
		for _, p := range ps {
			fmt.Fprintf(&b, "  - %s:\n      keys:\n      - name: %s\n        secret: %s\n", p.name, p.key, base64.StdEncoding.EncodeToString(p.secret))
		}
		b.WriteString("  - identity: {}\n")
		if err := os.WriteFile(path, []byte(b.String()), 0o600); err != nil {
			t.Fatal(err)
		}
		return path
	}

	e := kubetest.Start(t)
	want := map[string]*corev1.Secret{}
	for _, p := range providers {
		s := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: "app", Name: "by-" + p.name, ResourceVersion: "1"},
			Type: corev1.SecretTypeOpaque, Data: map[string][]byte{"password": random(20)}}
		key := "/registry/secrets/app/" + s.Name
		prefix := "k8s:enc:" + p.name + ":v1:" + p.key + ":"
		tr := value.NewPrefixTransformers(nil, value.PrefixTransformer{Prefix: []byte(prefix), Transformer: p.make(p.secret)})
		sealed, err := tr.TransformToStorage(context.Background(), kubetest.Protobuf(t, s), value.DefaultContext(key))
		if err != nil {
			t.Fatal(err)
		}
		e.Put(key, sealed)
		want[s.Name] = s
	}
	e.Put("/registry/secrets/app/by-kms", kubetest.Encrypted("k8s:enc:kms:v2:vault:", 300))
	snap := e.Snapshot()

	r := run(t, "extract", "enc", "secrets", "--object-namespace", "app", "--from-file", snap, "--encryption-config", config(providers))
	objs := extractedItems(t, r.out)
	if got := namesOf(objs); !reflect.DeepEqual(got, []string{"Secret app/by-aescbc", "Secret app/by-aesgcm", "Secret app/by-secretbox"}) {
		t.Fatalf("extracted %v\n%s", got, r.errOut)
	}
	for _, o := range objs {
		pw, _, _ := unstructured.NestedString(o.Object, "data", "password")
		if w := base64.StdEncoding.EncodeToString(want[o.GetName()].Data["password"]); pw != w {
			t.Errorf("%s: password %q, want %q", o.GetName(), pw, w)
		}
	}
	if ExitCode(r.err) != ExitIncomplete || !strings.Contains(r.errOut, `secrets "app/by-kms" is encrypted at rest by the API server (kms v2, plugin "vault")`) ||
		!strings.Contains(r.errOut, "cannot be decrypted offline") {
		t.Errorf("the KMS secret: exit %d %v\n%s", ExitCode(r.err), r.err, r.errOut)
	}

	// Other keys under the same names: nothing opens, each says why.
	var wrong []provider
	for _, p := range providers {
		p.secret = random(32)
		wrong = append(wrong, p)
	}
	r = run(t, "extract", "enc", "secrets", "--object-namespace", "app", "--from-file", snap, "--encryption-config", config(wrong))
	if ExitCode(r.err) != ExitIncomplete || strings.Contains(r.out, "by-aesgcm") || strings.Contains(r.out, "by-secretbox") ||
		!strings.Contains(r.errOut, `secrets "app/by-secretbox" is encrypted at rest by the API server (secretbox v1, key "box1") and the encryption configuration given does not open it`) {
		t.Errorf("wrong keys: exit %d %v\nstdout: %s\nstderr: %s", ExitCode(r.err), r.err, r.out, r.errOut)
	}
	// A key the configuration does not have is named, with those it has.
	r = run(t, "extract", "enc", "secret", "by-aesgcm", "--object-namespace", "app", "--from-file", snap, "--encryption-config", config(providers[:1]))
	if ExitCode(r.err) != ExitIncomplete || !strings.Contains(r.errOut, "aesgcm:v1:gcm1: no such key in the encryption configuration (it has aescbc key1)") {
		t.Errorf("missing key: exit %d %v\n%s", ExitCode(r.err), r.err, r.errOut)
	}

	// inspect counts the encrypted objects by provider and key.
	r = mustRun(t, "inspect", "enc", "--from-file", snap, "-o", "json")
	var doc BackupContents
	if err := json.Unmarshal([]byte(r.out), &doc); err != nil {
		t.Fatal(err)
	}
	var by []EncryptionCount
	for _, rc := range doc.Status.Resources {
		if rc.Resource == "secrets" {
			by = rc.EncryptedBy
		}
	}
	wantBy := []EncryptionCount{
		{Provider: "aescbc", Version: "v1", Key: "key1", Objects: 1}, {Provider: "aesgcm", Version: "v1", Key: "gcm1", Objects: 1},
		{Provider: "kms", Version: "v2", Key: "vault", Objects: 1}, {Provider: "secretbox", Version: "v1", Key: "box1", Objects: 1},
	}
	if !reflect.DeepEqual(by, wantBy) || !strings.Contains(r.errOut, `1 secrets by secretbox v1, key "box1"`) {
		t.Errorf("inspect: %+v\n%s", by, r.errOut)
	}

	bad := filepath.Join(t.TempDir(), "not-a-config.yaml")
	if err := os.WriteFile(bad, []byte("apiVersion: v1\nkind: ConfigMap\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	mustFail(t, "--encryption-config", "extract", "enc", "secrets", "--object-namespace", "app", "--from-file", snap, "--encryption-config", bad)
}
