package kube

import (
	"fmt"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

// ServerSetMetadata are the metadata fields Manifest removes: the API
// server sets them, and a manifest that carries them is refused or
// misapplied — a resourceVersion fails a create ("should not be set")
// and makes an apply a stale update, a uid from before fails an apply's
// precondition once the object was re-created, managedFields are
// refused by server-side apply; creationTimestamp, generation and
// selfLink are recomputed; deletionTimestamp and
// deletionGracePeriodSeconds belonged to a deletion in progress.
var ServerSetMetadata = []string{
	"resourceVersion", "uid", "creationTimestamp", "managedFields", "generation", "selfLink",
	"deletionTimestamp", "deletionGracePeriodSeconds",
}

// ManifestOptions say what Manifest keeps that it would otherwise drop.
type ManifestOptions struct {
	// KeepOwnerReferences keeps metadata.ownerReferences. They name their
	// owners by uid: an owner deleted or re-created since the snapshot
	// has another one (or none), and the garbage collector deletes a
	// dependent whose owners are all gone — the restored object would
	// vanish again. Keep them only when the owners still exist as they
	// were (the object alone was lost).
	KeepOwnerReferences bool
}

// Dropped is what Manifest removed that the person restoring may need
// to know.
type Dropped struct {
	// OwnerReferences are the owners the object referred to ("Kind/name"),
	// when they were dropped.
	OwnerReferences []string
	// Deleting is an object that was being deleted when the snapshot was
	// taken (it had a deletionTimestamp).
	Deleting bool
	// Status is whether status was removed.
	Status bool
}

// Manifest turns a stored object of resource r into a manifest for
// `kubectl apply -f -` or `kubectl create -f -`, in place: it removes the
// metadata the API server sets (ServerSetMetadata), ownerReferences
// unless o.KeepOwnerReferences, and status wherever the API server
// ignores it on create and apply (every built-in type and custom
// resources with a status subresource; a custom resource version without
// one keeps it, as it is the object's own data). It keeps everything
// else as stored: name, namespace, labels and annotations (the
// last-applied-configuration of `kubectl apply` too, so that a later
// apply of the same file merges as before), finalizers, spec and data.
func Manifest(u *unstructured.Unstructured, r Resource, o ManifestOptions) Dropped {
	var d Dropped
	meta, _ := u.Object["metadata"].(map[string]any)
	if meta != nil {
		_, d.Deleting = meta["deletionTimestamp"]
		for _, f := range ServerSetMetadata {
			delete(meta, f)
		}
		if !o.KeepOwnerReferences {
			for _, ref := range u.GetOwnerReferences() {
				d.OwnerReferences = append(d.OwnerReferences, fmt.Sprintf("%s/%s", ref.Kind, ref.Name))
			}
			delete(meta, "ownerReferences")
		}
	}
	if _, ok := u.Object["status"]; ok && !r.KeepsStatus(versionOf(u)) {
		delete(u.Object, "status")
		d.Status = true
	}
	return d
}

func versionOf(u *unstructured.Unstructured) string {
	gv, err := schema.ParseGroupVersion(u.GetAPIVersion())
	if err != nil {
		return ""
	}
	return gv.Version
}
