// Package kube reads the Kubernetes objects an etcd snapshot holds, as
// kube-apiserver stored them, without an API server: it opens the
// snapshot's bolt database read-only, walks etcd's key bucket once to find
// the latest revision of every key (a deletion's tombstone removes it),
// sorts the keys under kube-apiserver's prefix (/registry) into resources
// by the storage layout (resources.go), counts them (Contents), and
// decodes the chosen ones from etcd's storage encoding — protobuf behind
// the "k8s\x00" magic for built-in types (client-go's scheme and
// apimachinery's own serializer), JSON or CBOR for custom resources —
// into objects ready to apply again (Objects, Manifest). Custom resources
// are resolved with the CustomResourceDefinitions the snapshot holds.
// Values the API server encrypted at rest ("k8s:enc:…") are counted by
// provider and key, and opened only by an Opener given to the snapshot
// (atrest.Keys, from the API server's EncryptionConfiguration); else
// they are reported by name and provider, not decoded.
package kube
