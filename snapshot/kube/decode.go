package kube

import (
	"bytes"
	"fmt"
	"strings"
	"sync"

	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apiextensionsv1beta1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1beta1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/runtime/serializer/cbor"
	"k8s.io/apimachinery/pkg/runtime/serializer/protobuf"
	"k8s.io/apimachinery/pkg/util/json"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
)

// Scheme holds every type this package decodes from protobuf: client-go's
// (every built-in API group) and the CustomResourceDefinition's. It is
// made at its first use, not at the start of every process that links
// this package: the plugin's `list` has no use for it, and registering
// every API group costs it milliseconds of its start.
var Scheme = sync.OnceValue(func() *runtime.Scheme {
	s := runtime.NewScheme()
	utilruntime.Must(clientgoscheme.AddToScheme(s))
	utilruntime.Must(apiextensionsv1.AddToScheme(s))
	utilruntime.Must(apiextensionsv1beta1.AddToScheme(s))
	return s
})

var (
	protoSerializer = sync.OnceValue(func() *protobuf.Serializer { return protobuf.NewSerializer(Scheme(), Scheme()) })
	cborSerializer  = sync.OnceValue(func() cbor.Serializer { return cbor.NewSerializer(Scheme(), Scheme()) })

	// protobufMagic starts kube-apiserver's protobuf storage encoding,
	// a runtime.Unknown envelope naming the type.
	protobufMagic = []byte("k8s\x00")
	// cborMagic is CBOR's self-described tag, which starts the CBOR
	// encoding (custom resources, with the CBORServingAndStorage feature).
	cborMagic = []byte{0xd9, 0xd9, 0xf7}
	// encryptedMagic starts a value kube-apiserver encrypted at rest.
	encryptedMagic = []byte("k8s:enc:")
)

// Encryption is how kube-apiserver encrypted a value at rest, read from
// the prefix its EncryptionConfiguration's provider writes before the
// ciphertext: "k8s:enc:aescbc:v1:KEYNAME:", "k8s:enc:kms:v2:PLUGIN:".
type Encryption struct {
	// Provider is aescbc, aesgcm, secretbox or kms.
	Provider string
	// Version is the provider's format (v1, v2).
	Version string
	// Key is the key's name in the EncryptionConfiguration (the KMS
	// plugin's name for kms).
	Key string
}

func (e Encryption) String() string {
	s := e.Provider
	if e.Version != "" {
		s += " " + e.Version
	}
	switch {
	case e.Key == "":
	case e.Provider == "kms":
		s += fmt.Sprintf(", plugin %q", e.Key)
	default:
		s += fmt.Sprintf(", key %q", e.Key)
	}
	return s
}

// encryptionOf returns how value was encrypted at rest, or nil.
func encryptionOf(value []byte) *Encryption {
	if !bytes.HasPrefix(value, encryptedMagic) {
		return nil
	}
	rest := value[len(encryptedMagic):]
	// PROVIDER:VERSION:NAME: then the ciphertext; only the fields that
	// are printable text are taken.
	fields := strings.SplitN(string(rest[:min(len(rest), 256)]), ":", 4)
	e := &Encryption{Provider: printable(fields[0])}
	if len(fields) > 1 {
		e.Version = printable(fields[1])
	}
	if len(fields) > 3 {
		e.Key = printable(fields[2])
	}
	return e
}

func printable(s string) string {
	for _, r := range s {
		if r < 0x20 || r > 0x7e {
			return "?"
		}
	}
	return s
}

// EncryptedError is an object kube-apiserver encrypted at rest that
// could not be opened: its name, from its key, is all that can be read
// of it without the EncryptionConfiguration's keys.
type EncryptedError struct {
	Resource        Resource
	Namespace, Name string
	Encryption      Encryption
	// Err is why the keys given did not open it (nil: none were given).
	Err error
}

func (e *EncryptedError) Error() string {
	if e.Err != nil {
		return fmt.Sprintf("%s %s is encrypted at rest by the API server (%s) and the encryption configuration given does not open it: %v",
			e.Resource.String(), objectName(e.Namespace, e.Name), e.Encryption, e.Err)
	}
	return fmt.Sprintf("%s %s is encrypted at rest by the API server (%s): its content cannot be read without that key (--encryption-config: the API server's EncryptionConfiguration)",
		e.Resource.String(), objectName(e.Namespace, e.Name), e.Encryption)
}

func (e *EncryptedError) Unwrap() error { return e.Err }

// DecodeError is an object whose stored bytes could not be decoded.
type DecodeError struct {
	Resource        Resource
	Namespace, Name string
	Err             error
}

func (e *DecodeError) Error() string {
	return fmt.Sprintf("%s %s: %v", e.Resource.String(), objectName(e.Namespace, e.Name), e.Err)
}

func (e *DecodeError) Unwrap() error { return e.Err }

// UnknownTypeError is a protobuf-encoded object of a type this build's
// scheme does not have (a type newer than its client-go, or of an
// extension API server).
type UnknownTypeError struct{ APIVersion, Kind string }

func (e *UnknownTypeError) Error() string {
	return fmt.Sprintf("stored as protobuf of %s %s, a type this build of the plugin does not know", e.APIVersion, e.Kind)
}

func objectName(ns, name string) string {
	if ns == "" {
		return fmt.Sprintf("%q", name)
	}
	return fmt.Sprintf("%q", ns+"/"+name)
}

// Decode turns a value as kube-apiserver stores it into the object:
// protobuf behind the "k8s\x00" magic (a runtime.Unknown envelope naming
// the type, decoded with Scheme), JSON, or CBOR. It does not decrypt: an
// encrypted value is an error (encryptionOf tells them apart first).
func Decode(value []byte) (*unstructured.Unstructured, error) {
	switch {
	case bytes.HasPrefix(value, encryptedMagic):
		return nil, fmt.Errorf("encrypted at rest (%s)", encryptionOf(value))
	case bytes.HasPrefix(value, protobufMagic):
		obj, gvk, err := protoSerializer().Decode(value, nil, nil)
		if err != nil {
			if runtime.IsNotRegisteredError(err) && gvk != nil {
				return nil, &UnknownTypeError{APIVersion: gvk.GroupVersion().String(), Kind: gvk.Kind}
			}
			return nil, fmt.Errorf("decode protobuf: %w", err)
		}
		return typedToUnstructured(obj, *gvk)
	case bytes.HasPrefix(value, cborMagic):
		u := &unstructured.Unstructured{}
		if _, _, err := cborSerializer().Decode(value, nil, u); err != nil {
			return nil, fmt.Errorf("decode CBOR: %w", err)
		}
		return u, nil
	case bytes.HasPrefix(bytes.TrimLeft(value, " \t\r\n"), []byte("{")):
		m := map[string]any{}
		if err := json.Unmarshal(value, &m); err != nil {
			return nil, fmt.Errorf("decode JSON: %w", err)
		}
		u := &unstructured.Unstructured{Object: m}
		if u.GetKind() == "" || u.GetAPIVersion() == "" {
			return nil, fmt.Errorf("stored JSON has no apiVersion and kind")
		}
		return u, nil
	}
	return nil, fmt.Errorf("not a storage encoding of the API server's (protobuf, JSON or CBOR): it starts %q", value[:min(len(value), 8)])
}

func typedToUnstructured(obj runtime.Object, gvk schema.GroupVersionKind) (*unstructured.Unstructured, error) {
	m, err := runtime.DefaultUnstructuredConverter.ToUnstructured(obj)
	if err != nil {
		return nil, fmt.Errorf("convert %s: %w", gvk.Kind, err)
	}
	u := &unstructured.Unstructured{Object: m}
	u.SetAPIVersion(gvk.GroupVersion().String())
	u.SetKind(gvk.Kind)
	return u, nil
}

// decodeTyped decodes value into a typed object of Scheme.
func decodeTyped(value []byte) (runtime.Object, error) {
	switch {
	case bytes.HasPrefix(value, protobufMagic):
		obj, _, err := protoSerializer().Decode(value, nil, nil)
		return obj, err
	case bytes.HasPrefix(value, cborMagic):
		obj, _, err := cborSerializer().Decode(value, nil, nil)
		return obj, err
	}
	u, err := Decode(value)
	if err != nil {
		return nil, err
	}
	obj, err := Scheme().New(u.GroupVersionKind())
	if err != nil {
		return nil, err
	}
	if err := runtime.DefaultUnstructuredConverter.FromUnstructured(u.Object, obj); err != nil {
		return nil, err
	}
	return obj, nil
}
