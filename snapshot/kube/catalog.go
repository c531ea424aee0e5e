package kube

import (
	"errors"
	"fmt"
	"strings"

	bolt "go.etcd.io/bbolt"
	"go.etcd.io/etcd/server/v3/storage/schema"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apiextensionsv1beta1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1beta1"
)

// crdPath is where kube-apiserver keeps CustomResourceDefinitions.
const crdPath = "apiextensions.k8s.io/customresourcedefinitions"

// Catalog returns every resource the snapshot's keys can belong to: the
// built-in ones, those the snapshot's CustomResourceDefinitions define,
// and the paths it holds that neither explains. A definition that cannot
// be read (encrypted at rest, or not decodable) is returned as an error
// beside the catalog; the objects of its resource are still found under
// PLURAL.GROUP.
func (s *Snapshot) Catalog() (*Catalog, []error) {
	var custom []Resource
	var errs []error
	crds := Resource{Group: "apiextensions.k8s.io", Resource: "customresourcedefinitions", Path: crdPath}
	err := s.db.View(func(tx *bolt.Tx) error {
		b := tx.Bucket(schema.Key.Name())
		for _, k := range s.keys {
			if k.res != crdPath {
				continue
			}
			v, err := s.plain(b, crds, k)
			if enc := (*EncryptedError)(nil); errors.As(err, &enc) {
				errs = append(errs, enc)
				continue
			}
			if err == nil {
				var r Resource
				if r, err = crdResource(v); err == nil {
					custom = append(custom, r)
					continue
				}
			}
			errs = append(errs, &DecodeError{Resource: crds, Name: k.name, Err: err})
		}
		return nil
	})
	if err != nil {
		errs = append(errs, err)
	}
	return newCatalog(custom, s.paths()), errs
}

// crdResource reads the resource a stored CustomResourceDefinition
// defines (v1, or v1beta1 as clusters older than 1.16 stored them).
func crdResource(value []byte) (Resource, error) {
	obj, err := decodeTyped(value)
	if err != nil {
		return Resource{}, err
	}
	r := Resource{Custom: true, statusData: map[string]bool{}}
	switch crd := obj.(type) {
	case *apiextensionsv1.CustomResourceDefinition:
		s := crd.Spec
		r.Group, r.Resource, r.Kind, r.Singular, r.ShortNames = s.Group, s.Names.Plural, s.Names.Kind, s.Names.Singular, s.Names.ShortNames
		r.Namespaced = s.Scope == apiextensionsv1.NamespaceScoped
		for _, v := range s.Versions {
			if v.Subresources == nil || v.Subresources.Status == nil {
				r.statusData[v.Name] = true
			}
		}
	case *apiextensionsv1beta1.CustomResourceDefinition:
		s := crd.Spec
		r.Group, r.Resource, r.Kind, r.Singular, r.ShortNames = s.Group, s.Names.Plural, s.Names.Kind, s.Names.Singular, s.Names.ShortNames
		r.Namespaced = s.Scope == apiextensionsv1beta1.NamespaceScoped
		top := s.Subresources != nil && s.Subresources.Status != nil
		if len(s.Versions) == 0 && !top {
			r.statusData[s.Version] = true
		}
		for _, v := range s.Versions {
			has := top
			if v.Subresources != nil {
				has = v.Subresources.Status != nil
			}
			if !has {
				r.statusData[v.Name] = true
			}
		}
	default:
		return Resource{}, fmt.Errorf("stored as %T, not a CustomResourceDefinition", obj)
	}
	if r.Group == "" || r.Resource == "" {
		return Resource{}, fmt.Errorf("the definition names no group or plural")
	}
	if r.Singular == "" {
		r.Singular = strings.ToLower(r.Kind)
	}
	r.Path = r.Group + "/" + r.Resource
	return r, nil
}
