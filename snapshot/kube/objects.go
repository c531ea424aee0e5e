package kube

import (
	"errors"
	"sort"
	"strings"

	bolt "go.etcd.io/bbolt"
	"go.etcd.io/etcd/server/v3/storage/schema"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/labels"
)

// Selection says which objects of a snapshot Objects gives.
type Selection struct {
	Resource Resource
	// Namespace limits a namespaced resource to one namespace; "" is
	// every namespace. A cluster-scoped resource ignores it.
	Namespace string
	// Names, when given, are the only objects wanted.
	Names []string
	// Labels, when not nil, must match an object's labels.
	Labels labels.Selector
}

// Object is one object of a snapshot.
type Object struct {
	Namespace, Name string
	// Revision is the etcd revision that last wrote it: its
	// resourceVersion when the snapshot was taken.
	Revision int64
	// Object is the object as stored (Manifest makes it one to apply).
	Object *unstructured.Unstructured
}

// Objects calls fn with each live object of sel, in key order (by
// namespace, then name). An object that cannot be read is passed with a
// nil Object and why: *EncryptedError for one the API server encrypted
// at rest, *DecodeError for one whose bytes do not decode. Their labels
// are unknown, so a label selector does not leave them out. Values are
// read one at a time; an error from fn stops the walk and is returned.
func (s *Snapshot) Objects(sel Selection, fn func(Object, error) error) error {
	want := map[string]bool{}
	for _, n := range sel.Names {
		want[n] = true
	}
	start := s.prefix + sel.Resource.Path + "/"
	if sel.Namespace != "" && sel.Resource.Namespaced {
		start += sel.Namespace + "/"
	}
	return s.db.View(func(tx *bolt.Tx) error {
		b := tx.Bucket(schema.Key.Name())
		i := sort.Search(len(s.keys), func(i int) bool { return s.keys[i].path >= start })
		for ; i < len(s.keys) && strings.HasPrefix(s.keys[i].path, start); i++ {
			k := s.keys[i]
			if k.res != sel.Resource.Path || (sel.Namespace != "" && k.ns != "" && k.ns != sel.Namespace) || (len(want) > 0 && !want[k.name]) {
				continue
			}
			o := Object{Namespace: k.ns, Name: k.name, Revision: k.rev.Main}
			v, err := s.plain(b, sel.Resource, k)
			if enc := (*EncryptedError)(nil); errors.As(err, &enc) {
				if err := fn(o, enc); err != nil {
					return err
				}
				continue
			}
			if err == nil {
				o.Object, err = Decode(v)
			}
			if err != nil {
				if err := fn(Object{Namespace: k.ns, Name: k.name, Revision: k.rev.Main}, &DecodeError{Resource: sel.Resource, Namespace: k.ns, Name: k.name, Err: err}); err != nil {
					return err
				}
				continue
			}
			if sel.Labels != nil && !sel.Labels.Matches(labels.Set(o.Object.GetLabels())) {
				continue
			}
			if err := fn(o, nil); err != nil {
				return err
			}
		}
		return nil
	})
}
