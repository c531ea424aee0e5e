package kube

import "sort"

// Contents is what a snapshot holds, counted from its keys alone:
// nothing is decoded or decrypted.
type Contents struct {
	// Revision is the snapshot's newest revision.
	Revision int64
	// Prefix is the prefix counted under, with its trailing slash.
	Prefix string
	// Count is every live key under the prefix.
	Count
	// OtherKeys are the live keys outside the prefix (kube-apiserver's
	// compact_rev_key, or another program's keys), OtherBytes their
	// values' size.
	OtherKeys  int
	OtherBytes int64
	// Resources are the resources with live keys, by name, with their
	// counts.
	Resources []ResourceContents
}

// Count is a number of objects and the size of their stored values.
type Count struct {
	Objects int
	// Bytes are the stored values' size, as etcd holds them (encoded,
	// and encrypted where the API server encrypts).
	Bytes int64
	// Encrypted are the objects the API server encrypted at rest;
	// EncryptedBy counts them by provider and key.
	Encrypted   int
	EncryptedBy map[Encryption]int
}

func (c *Count) add(k key) {
	c.Objects++
	c.Bytes += int64(k.size)
	if k.enc != nil {
		c.Encrypted++
		if c.EncryptedBy == nil {
			c.EncryptedBy = map[Encryption]int{}
		}
		c.EncryptedBy[*k.enc]++
	}
}

// ResourceContents counts one resource's objects, in all and per
// namespace.
type ResourceContents struct {
	Resource Resource
	Count
	// Namespaces count the objects of each namespace, by name; a
	// cluster-scoped resource has none.
	Namespaces []NamespaceContents
}

// NamespaceContents counts a resource's objects in one namespace.
type NamespaceContents struct {
	Namespace string
	Count
}

// Contents counts the live keys by resource and namespace. The catalog
// names the resources (Catalog).
func (s *Snapshot) Contents(cat *Catalog) *Contents {
	c := &Contents{Revision: s.revision, Prefix: s.prefix, OtherKeys: s.otherKeys, OtherBytes: s.otherBytes}
	byPath := map[string]*ResourceContents{}
	byNS := map[string]map[string]*NamespaceContents{}
	for _, k := range s.keys {
		c.add(k)
		rc := byPath[k.res]
		if rc == nil {
			rc = &ResourceContents{Resource: cat.ForPath(k.res)}
			byPath[k.res] = rc
			byNS[k.res] = map[string]*NamespaceContents{}
		}
		rc.add(k)
		if k.ns == "" {
			continue
		}
		nc := byNS[k.res][k.ns]
		if nc == nil {
			nc = &NamespaceContents{Namespace: k.ns}
			byNS[k.res][k.ns] = nc
		}
		nc.add(k)
	}
	for path, rc := range byPath {
		if len(byNS[path]) > 0 {
			// Keys in namespaces: whatever the catalog guessed of an
			// unknown path, its objects are namespaced.
			rc.Resource.Namespaced = true
		}
		for _, nc := range byNS[path] {
			rc.Namespaces = append(rc.Namespaces, *nc)
		}
		sort.Slice(rc.Namespaces, func(i, j int) bool { return rc.Namespaces[i].Namespace < rc.Namespaces[j].Namespace })
		c.Resources = append(c.Resources, *rc)
	}
	sort.Slice(c.Resources, func(i, j int) bool {
		a, b := c.Resources[i].Resource, c.Resources[j].Resource
		if a.Internal != b.Internal {
			return !a.Internal
		}
		return a.String() < b.String()
	})
	return c
}
