package kube

import (
	"bytes"
	"encoding/json"
	"testing"

	corev1 "k8s.io/api/core/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/serializer"
)

// storedAs encodes obj as kube-apiserver's storage does: protobuf
// behind the "k8s\x00" envelope for a typed object.
func storedAs(f *testing.F, obj runtime.Object) []byte {
	f.Helper()
	gvks, _, err := Scheme().ObjectKinds(obj)
	if err != nil {
		f.Fatal(err)
	}
	enc := serializer.NewCodecFactory(Scheme()).EncoderForVersion(protoSerializer(), gvks[0].GroupVersion())
	b, err := runtime.Encode(enc, obj)
	if err != nil {
		f.Fatal(err)
	}
	return b
}

// FuzzDecode feeds arbitrary bytes, as an etcd value under /registry, to
// what inspect and extract run on a downloaded backup — whoever could
// write to etcd, or upload a backup, chose them: telling encryption at
// rest (encryptionOf), Decode, decodeTyped (the CRD catalog) and
// Manifest never panic; a value behind the encryption prefix is never
// decoded; an object Decode accepts has an apiVersion and kind (extract
// files it under them) and is written as JSON, or refused, by what
// extract prints with.
func FuzzDecode(f *testing.F) {
	cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "cfg", Namespace: "shop", Labels: map[string]string{"app": "shop"}, ResourceVersion: "12",
		OwnerReferences: []metav1.OwnerReference{{APIVersion: "apps/v1", Kind: "Deployment", Name: "web", UID: "u1"}}}, Data: map[string]string{"k": "v"}}
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "p", Namespace: "shop"}, Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Image: "busybox"}}},
		Status: corev1.PodStatus{Phase: corev1.PodRunning}}
	crd := &apiextensionsv1.CustomResourceDefinition{ObjectMeta: metav1.ObjectMeta{Name: "widgets.example.com"},
		Spec: apiextensionsv1.CustomResourceDefinitionSpec{Group: "example.com", Names: apiextensionsv1.CustomResourceDefinitionNames{Plural: "widgets", Kind: "Widget"},
			Scope: apiextensionsv1.NamespaceScoped, Versions: []apiextensionsv1.CustomResourceDefinitionVersion{{Name: "v1", Served: true, Storage: true,
				Subresources: &apiextensionsv1.CustomResourceSubresources{Status: &apiextensionsv1.CustomResourceSubresourceStatus{}}}}}}
	for _, obj := range []runtime.Object{cm, pod, crd} {
		f.Add(storedAs(f, obj))
	}
	widget := &unstructured.Unstructured{Object: map[string]any{"apiVersion": "example.com/v1", "kind": "Widget",
		"metadata": map[string]any{"name": "w", "namespace": "shop", "uid": "x"}, "spec": map[string]any{"size": int64(3), "tags": []any{"a", 1.5, true, nil}}, "status": map[string]any{}}}
	js, err := json.Marshal(widget.Object)
	if err != nil {
		f.Fatal(err)
	}
	f.Add(append(js, '\n'))
	var cb bytes.Buffer
	if err := cborSerializer().Encode(widget, &cb); err != nil {
		f.Fatal(err)
	}
	f.Add(cb.Bytes())
	for _, s := range []string{"k8s:enc:aescbc:v1:key1:\x00\x01ciphertext", "k8s:enc:kms:v2:plugin:", "k8s\x00", "k8s\x00\x0a\x00",
		"\xd9\xd9\xf7", "\xd9\xd9\xf7\xa1\x61a\x01", ` {"kind":"X"}`, `{"apiVersion":"v1","kind":"Secret","metadata":{"ownerReferences":[{"kind":1}]}}`, "", "\x00"} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, value []byte) {
		e := encryptionOf(value)
		u, err := Decode(value)
		if e != nil {
			if err == nil {
				t.Fatalf("a value encrypted at rest (%s) decoded", e)
			}
			return
		}
		_, _ = decodeTyped(value)
		if err != nil {
			return
		}
		if u.GetAPIVersion() == "" || u.GetKind() == "" {
			t.Fatalf("decoded an object without apiVersion or kind: %v", u.Object)
		}
		// What extract writes, if it can be written: Manifest changes the
		// object in place, with and without ownerReferences.
		_, _ = json.Marshal(u.Object)
		Manifest(u.DeepCopy(), Resource{}, ManifestOptions{KeepOwnerReferences: true})
		Manifest(u, Resource{}, ManifestOptions{})
		_, _ = json.Marshal(u.Object)
	})
}
