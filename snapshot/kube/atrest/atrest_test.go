package atrest_test

import (
	"context"
	"crypto/aes"
	"crypto/cipher"
	"crypto/rand"
	"encoding/base64"
	"errors"
	"fmt"
	"strings"
	"testing"

	"k8s.io/apiserver/pkg/storage/value"
	aestransformer "k8s.io/apiserver/pkg/storage/value/encrypt/aes"
	"k8s.io/apiserver/pkg/storage/value/encrypt/secretbox"

	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/snapshot/kube/atrest"
)

// keys are random keys of every provider, as a configuration names
// them, and kube-apiserver's own transformers for them (the code its
// --encryption-provider-config builds), which write what Open must read.
type keys struct {
	config       string
	transformers map[string]value.Transformer
}

func newKeys(t *testing.T) keys {
	t.Helper()
	secret := func(n int) []byte {
		b := make([]byte, n)
		if _, err := rand.Read(b); err != nil {
			t.Fatal(err)
		}
		return b
	}
	cbcKey, gcmKey, boxKey, oldKey := secret(32), secret(16), secret(32), secret(32)
	block := func(k []byte) cipher.Block {
		b, err := aes.NewCipher(k)
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	gcm, err := aestransformer.NewGCMTransformer(block(gcmKey))
	if err != nil {
		t.Fatal(err)
	}
	var box [32]byte
	copy(box[:], boxKey)
	b64 := base64.StdEncoding.EncodeToString
	return keys{
		config: fmt.Sprintf(`apiVersion: apiserver.config.k8s.io/v1
kind: EncryptionConfiguration
resources:
- resources: [secrets]
  providers:
  - aescbc:
      keys:
      - name: key2
        secret: %s
      - name: key1
        secret: %s
  - identity: {}
- resources: [configmaps]
  providers:
  - aesgcm:
      keys:
      - name: gcm1
        secret: %s
- resources: ["*.apps"]
  providers:
  - secretbox:
      keys:
      - name: box1
        secret: %s
  - kms:
      apiVersion: v2
      name: vault
      endpoint: unix:///var/run/kms.sock
`, b64(cbcKey), b64(oldKey), b64(gcmKey), b64(boxKey)),
		transformers: map[string]value.Transformer{
			"k8s:enc:aescbc:v1:key2:":    aestransformer.NewCBCTransformer(block(cbcKey)),
			"k8s:enc:aescbc:v1:key1:":    aestransformer.NewCBCTransformer(block(oldKey)),
			"k8s:enc:aesgcm:v1:gcm1:":    gcm,
			"k8s:enc:secretbox:v1:box1:": secretbox.NewSecretboxTransformer(box),
		},
	}
}

// seal writes plain as kube-apiserver stores it at key with the
// transformer of prefix.
func (k keys) seal(t *testing.T, prefix, key string, plain []byte) []byte {
	t.Helper()
	tr := value.NewPrefixTransformers(nil, value.PrefixTransformer{Prefix: []byte(prefix), Transformer: k.transformers[prefix]})
	out, err := tr.TransformToStorage(context.Background(), plain, value.DefaultContext(key))
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// Every provider whose keys are in the file opens what kube-apiserver's
// own transformers wrote, for values of every size around a block.
func TestOpenReadsWhatKubeAPIServerWrote(t *testing.T) {
	k := newKeys(t)
	keys, err := atrest.Parse([]byte(k.config))
	if err != nil {
		t.Fatal(err)
	}
	for prefix := range k.transformers {
		for _, n := range []int{0, 1, 15, 16, 17, 1000} {
			plain := []byte(strings.Repeat("s", n))
			key := "/registry/secrets/app/db"
			got, err := keys.Open(key, k.seal(t, prefix, key, plain))
			if err != nil || string(got) != string(plain) {
				t.Fatalf("%s, %d bytes: %q, %v", prefix, n, got, err)
			}
		}
	}
	if got := strings.Join(keys.Names(), ","); got != "aescbc key2,aescbc key1,aesgcm gcm1,secretbox box1" {
		t.Fatalf("names: %s", got)
	}
}

// What cannot be opened says why, by name: a key the file lacks (naming
// those it has), a KMS plugin, a value moved to another etcd key
// (aesgcm authenticates it), damaged bytes.
func TestOpenSaysWhyNot(t *testing.T) {
	k := newKeys(t)
	keys, err := atrest.Parse([]byte(k.config))
	if err != nil {
		t.Fatal(err)
	}
	const key = "/registry/configmaps/app/cfg"
	sealed := k.seal(t, "k8s:enc:aesgcm:v1:gcm1:", key, []byte("k8s\x00payload"))
	for _, c := range []struct {
		name, key string
		value     []byte
		want      error
		says      string
	}{
		{"missing key", key, []byte("k8s:enc:aescbc:v1:key9:0123456789abcdef0123456789abcdef"), atrest.ErrNoKey, "aescbc:v1:key9"},
		{"kms", key, []byte("k8s:enc:kms:v2:vault:\x0a\x0bciphertext"), atrest.ErrKMS, "KMS"},
		{"moved", "/registry/configmaps/app/other", sealed, atrest.ErrNotOpened, "aesgcm:v1:gcm1"},
		{"flipped", key, append(sealed[:len(sealed)-1:len(sealed)-1], sealed[len(sealed)-1]^1), atrest.ErrNotOpened, "gcm1"},
	} {
		_, err := keys.Open(c.key, c.value)
		if !errors.Is(err, c.want) || !strings.Contains(err.Error(), c.says) {
			t.Errorf("%s: %v; want %v naming %q", c.name, err, c.want, c.says)
		}
	}
	if _, err := keys.Open(key, []byte("k8s:enc:aescbc:v1:key9:x")); !strings.Contains(err.Error(), "it has aescbc key2, aescbc key1") {
		t.Errorf("a missing key's error names the keys the file has: %v", err)
	}
}

// A file that is not an EncryptionConfiguration, or whose keys are
// unusable, is refused saying which.
func TestParseRefuses(t *testing.T) {
	for name, c := range map[string]struct{ config, says string }{
		"kind":     {"apiVersion: v1\nkind: ConfigMap\n", "want an EncryptionConfiguration"},
		"base64":   {"apiVersion: apiserver.config.k8s.io/v1\nkind: EncryptionConfiguration\nresources:\n- resources: [secrets]\n  providers:\n  - aescbc:\n      keys:\n      - {name: k, secret: '!!'}\n", `aescbc key "k": its secret is not base64`},
		"size":     {"apiVersion: apiserver.config.k8s.io/v1\nkind: EncryptionConfiguration\nresources:\n- resources: [secrets]\n  providers:\n  - secretbox:\n      keys:\n      - {name: k, secret: c2hvcnQ=}\n", "secretbox keys are 32"},
		"kms only": {"apiVersion: apiserver.config.k8s.io/v1\nkind: EncryptionConfiguration\nresources:\n- resources: [secrets]\n  providers:\n  - kms: {name: vault, endpoint: 'unix:///k.sock'}\n", "no aescbc, aesgcm or secretbox key"},
	} {
		if _, err := atrest.Parse([]byte(c.config)); err == nil || !strings.Contains(err.Error(), c.says) {
			t.Errorf("%s: %v; want it to say %q", name, err, c.says)
		}
	}
}
