// Package kubetest writes Kubernetes objects into a real etcd exactly as
// kube-apiserver stores them — typed objects through apimachinery's own
// protobuf serializer behind its "k8s\x00" envelope, custom resources as
// JSON or CBOR, values encrypted at rest behind their provider's prefix —
// and snapshots it with etcd's client: test support for package kube and
// the plugin's inspect and extract.
package kubetest

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/json"
	"path/filepath"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/snapshot"
	"go.uber.org/zap"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	"k8s.io/apimachinery/pkg/runtime/serializer/cbor"
	"k8s.io/apimachinery/pkg/runtime/serializer/protobuf"

	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/internal/etcdtest"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/snapshot/kube"
)

// Etcd is a real etcd member the test writes into.
type Etcd struct {
	t      testing.TB
	member *etcdtest.Etcd
	Client *clientv3.Client
}

// Start runs an etcd member until the end of the test.
func Start(t testing.TB) *Etcd {
	t.Helper()
	m := etcdtest.Start(t, false)
	return &Etcd{t: t, member: m, Client: m.Client(t)}
}

// Put writes value under key.
func (e *Etcd) Put(key string, value []byte) {
	e.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := e.Client.Put(ctx, key, string(value)); err != nil {
		e.t.Fatal(err)
	}
}

// Delete deletes key, leaving a tombstone in etcd's history.
func (e *Etcd) Delete(key string) {
	e.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := e.Client.Delete(ctx, key); err != nil {
		e.t.Fatal(err)
	}
}

// Snapshot saves a snapshot of the member with etcd's own client into a
// new file and returns its path.
func (e *Etcd) Snapshot() string {
	e.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	path := filepath.Join(e.t.TempDir(), "snapshot.db")
	if _, err := snapshot.SaveWithVersion(ctx, zap.NewNop(), e.member.Config(e.t), path); err != nil {
		e.t.Fatal(err)
	}
	return path
}

var codecs = serializer.NewCodecFactory(kube.Scheme())

// Protobuf encodes a typed object as kube-apiserver's storage does: a
// versioning encoder (which sets apiVersion and kind) around
// apimachinery's protobuf serializer, which writes the "k8s\x00" magic
// and the runtime.Unknown envelope.
func Protobuf(t testing.TB, obj runtime.Object) []byte {
	t.Helper()
	gvks, _, err := kube.Scheme().ObjectKinds(obj)
	if err != nil {
		t.Fatal(err)
	}
	enc := codecs.EncoderForVersion(protobuf.NewSerializer(kube.Scheme(), kube.Scheme()), gvks[0].GroupVersion())
	b, err := runtime.Encode(enc, obj)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// JSON encodes an object as kube-apiserver stores custom resources.
func JSON(t testing.TB, obj *unstructured.Unstructured) []byte {
	t.Helper()
	b, err := json.Marshal(obj.Object)
	if err != nil {
		t.Fatal(err)
	}
	return append(b, '\n')
}

// CBOR encodes an object as kube-apiserver stores custom resources with
// its CBORServingAndStorage feature.
func CBOR(t testing.TB, obj *unstructured.Unstructured) []byte {
	t.Helper()
	var buf bytes.Buffer
	if err := cbor.NewSerializer(kube.Scheme(), kube.Scheme()).Encode(obj, &buf); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

// Encrypted is a value as kube-apiserver's encryption at rest stores it:
// the provider's prefix ("k8s:enc:aescbc:v1:key1:") and n bytes of
// ciphertext (random: nothing reads them).
func Encrypted(prefix string, n int) []byte {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return append([]byte(prefix), b...)
}
