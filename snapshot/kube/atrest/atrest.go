// Package atrest opens values kube-apiserver encrypted at rest, offline,
// with the keys of its EncryptionConfiguration (the file its
// --encryption-provider-config names): the aescbc, aesgcm and secretbox
// providers, whose keys are in that file. A value is the provider's
// prefix "k8s:enc:PROVIDER:v1:KEYNAME:" and the ciphertext, as
// k8s.io/apiserver/pkg/storage/value/encrypt writes it: aescbc a 16-byte
// IV and AES-CBC with PKCS#7 padding; aesgcm a 12-byte nonce and AES-GCM
// sealed with the value's etcd key as additional data; secretbox a
// 24-byte nonce and NaCl secretbox. KMS providers keep their keys in the
// KMS: their values cannot be opened offline, and Open says so by name.
package atrest

import (
	"bytes"
	"crypto/aes"
	"crypto/cipher"
	"encoding/base64"
	"errors"
	"fmt"
	"os"
	"strings"

	"golang.org/x/crypto/nacl/secretbox"
	"sigs.k8s.io/yaml"
)

// Errors of Open, each wrapped with what it is about.
var (
	// ErrNoKey: the configuration has no key of the name and provider
	// the value was encrypted with.
	ErrNoKey = errors.New("no such key in the encryption configuration")
	// ErrKMS: the value was encrypted by a KMS plugin.
	ErrKMS = errors.New("encrypted by a KMS plugin, whose keys stay in the KMS: it cannot be decrypted offline")
	// ErrNotOpened: the named key did not open the value (another key
	// of the same name, or damaged bytes).
	ErrNotOpened = errors.New("the key of that name does not open it")
)

// magic starts every value a provider encrypted.
const magic = "k8s:enc:"

// Keys are the keys of one EncryptionConfiguration, by the prefix each
// writes.
type Keys struct {
	byPrefix map[string][]opener
	// names are "PROVIDER KEYNAME" of every key, for messages.
	names []string
}

// opener opens one provider's ciphertext (after the prefix); key is
// the value's etcd key.
type opener func(key string, ciphertext []byte) ([]byte, error)

// Load reads the EncryptionConfiguration at path.
func Load(path string) (*Keys, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("read the encryption configuration: %w", err)
	}
	k, err := Parse(b)
	if err != nil {
		return nil, fmt.Errorf("encryption configuration %s: %w", path, err)
	}
	return k, nil
}

// The configuration's shape (apiserver.config.k8s.io/v1), only what
// opening values needs.
type configuration struct {
	Kind       string `json:"kind"`
	APIVersion string `json:"apiVersion"`
	Resources  []struct {
		Resources []string `json:"resources"`
		Providers []struct {
			AESCBC    *keyList  `json:"aescbc"`
			AESGCM    *keyList  `json:"aesgcm"`
			Secretbox *keyList  `json:"secretbox"`
			KMS       *struct{} `json:"kms"`
		} `json:"providers"`
	} `json:"resources"`
}

type keyList struct {
	Keys []struct {
		Name   string `json:"name"`
		Secret string `json:"secret"`
	} `json:"keys"`
}

// Parse reads an EncryptionConfiguration (YAML or JSON).
func Parse(data []byte) (*Keys, error) {
	var c configuration
	if err := yaml.Unmarshal(data, &c); err != nil {
		return nil, fmt.Errorf("not an EncryptionConfiguration: %w", err)
	}
	if c.Kind != "EncryptionConfiguration" || !strings.HasPrefix(c.APIVersion, "apiserver.config.k8s.io/") {
		return nil, fmt.Errorf("kind %q, apiVersion %q: want an EncryptionConfiguration of apiserver.config.k8s.io/v1, the file kube-apiserver's --encryption-provider-config names", c.Kind, c.APIVersion)
	}
	k := &Keys{byPrefix: map[string][]opener{}}
	for _, r := range c.Resources {
		for _, p := range r.Providers {
			for _, kl := range []struct {
				provider string
				list     *keyList
				open     func([]byte) (opener, error)
			}{{"aescbc", p.AESCBC, cbcOpener}, {"aesgcm", p.AESGCM, gcmOpener}, {"secretbox", p.Secretbox, secretboxOpener}} {
				if kl.list == nil {
					continue
				}
				for _, key := range kl.list.Keys {
					secret, err := base64.StdEncoding.DecodeString(key.Secret)
					if err != nil {
						return nil, fmt.Errorf("%s key %q: its secret is not base64: %w", kl.provider, key.Name, err)
					}
					o, err := kl.open(secret)
					if err != nil {
						return nil, fmt.Errorf("%s key %q: %w", kl.provider, key.Name, err)
					}
					prefix := magic + kl.provider + ":v1:" + key.Name + ":"
					if len(k.byPrefix[prefix]) == 0 {
						k.names = append(k.names, kl.provider+" "+key.Name)
					}
					k.byPrefix[prefix] = append(k.byPrefix[prefix], o)
				}
			}
		}
	}
	if len(k.byPrefix) == 0 {
		return nil, errors.New("it holds no aescbc, aesgcm or secretbox key: nothing it encrypts can be opened offline")
	}
	return k, nil
}

// Names are the configuration's keys, "PROVIDER KEYNAME" each.
func (k *Keys) Names() []string { return k.names }

// Encrypted says whether value is one kube-apiserver encrypted at rest.
func Encrypted(value []byte) bool { return bytes.HasPrefix(value, []byte(magic)) }

// Open returns the plaintext of value, stored at the etcd key key (which
// aesgcm authenticates: a value moved to another key does not open).
func (k *Keys) Open(key string, value []byte) ([]byte, error) {
	if !Encrypted(value) {
		return nil, errors.New("not encrypted at rest")
	}
	provider, _, _ := strings.Cut(string(value[len(magic):min(len(value), len(magic)+16)]), ":")
	if provider == "kms" {
		return nil, ErrKMS
	}
	// The prefix is PROVIDER:VERSION:NAME: after the magic; a name has
	// no colon.
	rest := value[len(magic):]
	end := 0
	for range 3 {
		i := bytes.IndexByte(rest[end:], ':')
		if i < 0 {
			return nil, errors.New("not a provider's prefix: the value is damaged")
		}
		end += i + 1
	}
	prefix := string(value[:len(magic)+end])
	// what is PROVIDER:VERSION:NAME, for errors.
	what := prefix[len(magic) : len(prefix)-1]
	openers := k.byPrefix[prefix]
	if len(openers) == 0 {
		return nil, fmt.Errorf("%s: %w (it has %s)", what, ErrNoKey, strings.Join(k.names, ", "))
	}
	ciphertext := value[len(prefix):]
	var last error
	for _, o := range openers {
		plain, err := o(key, ciphertext)
		if err == nil {
			return plain, nil
		}
		last = err
	}
	return nil, fmt.Errorf("%s: %w: %v", what, ErrNotOpened, last)
}

func cbcOpener(secret []byte) (opener, error) {
	if len(secret) != 32 {
		return nil, fmt.Errorf("%d bytes: aescbc keys are 32", len(secret))
	}
	block, err := aes.NewCipher(secret)
	if err != nil {
		return nil, err
	}
	return func(_ string, data []byte) ([]byte, error) {
		bs := block.BlockSize()
		if len(data) < 2*bs || len(data)%bs != 0 {
			return nil, errors.New("not whole AES blocks")
		}
		out := make([]byte, len(data)-bs)
		cipher.NewCBCDecrypter(block, data[:bs]).CryptBlocks(out, data[bs:])
		pad := int(out[len(out)-1])
		if pad == 0 || pad > bs {
			return nil, errors.New("bad padding")
		}
		for _, b := range out[len(out)-pad:] {
			if int(b) != pad {
				return nil, errors.New("bad padding")
			}
		}
		return out[:len(out)-pad], nil
	}, nil
}

func gcmOpener(secret []byte) (opener, error) {
	switch len(secret) {
	case 16, 24, 32:
	default:
		return nil, fmt.Errorf("%d bytes: aesgcm keys are 16, 24 or 32", len(secret))
	}
	block, err := aes.NewCipher(secret)
	if err != nil {
		return nil, err
	}
	aead, err := cipher.NewGCM(block)
	if err != nil {
		return nil, err
	}
	return func(key string, data []byte) ([]byte, error) {
		n := aead.NonceSize()
		if len(data) < n {
			return nil, errors.New("shorter than its nonce")
		}
		return aead.Open(nil, data[:n], data[n:], []byte(key))
	}, nil
}

func secretboxOpener(secret []byte) (opener, error) {
	if len(secret) != 32 {
		return nil, fmt.Errorf("%d bytes: secretbox keys are 32", len(secret))
	}
	var k [32]byte
	copy(k[:], secret)
	return func(_ string, data []byte) ([]byte, error) {
		const nonceSize = 24
		if len(data) < nonceSize+secretbox.Overhead {
			return nil, errors.New("shorter than its nonce")
		}
		var nonce [nonceSize]byte
		copy(nonce[:], data)
		out, ok := secretbox.Open(nil, data[nonceSize:], &nonce, &k)
		if !ok {
			return nil, errors.New("secretbox does not authenticate it")
		}
		return out, nil
	}, nil
}
