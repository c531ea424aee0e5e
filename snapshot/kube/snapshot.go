package kube

import (
	"bytes"
	"errors"
	"fmt"
	"sort"
	"strings"
	"time"

	bolt "go.etcd.io/bbolt"
	"go.etcd.io/etcd/api/v3/mvccpb"
	"go.etcd.io/etcd/server/v3/storage/mvcc"
	"go.etcd.io/etcd/server/v3/storage/schema"
	"google.golang.org/protobuf/proto"
)

// DefaultPrefix is where kube-apiserver keeps its objects unless its
// --etcd-prefix says otherwise.
const DefaultPrefix = "/registry"

// Snapshot is an etcd snapshot opened read-only, with the index of its
// live keys: for every key, its latest revision, unless that revision
// deleted it.
type Snapshot struct {
	db     *bolt.DB
	prefix string // with its trailing slash

	revision int64
	// keys are the live keys under the prefix, in key order.
	keys []key
	// other counts the live keys outside the prefix, and their values'
	// bytes.
	otherKeys  int
	otherBytes int64
	// opener opens values the API server encrypted at rest (nil: they
	// are reported, not read).
	opener Opener
}

// Opener opens a value kube-apiserver encrypted at rest, stored at the
// etcd key key (atrest.Keys, read from its EncryptionConfiguration).
type Opener interface {
	Open(key string, value []byte) ([]byte, error)
}

// OpenEncryptedWith makes Objects and Catalog read the values the API
// server encrypted at rest with o; one it does not open is still
// reported as an *EncryptedError, saying why.
func (s *Snapshot) OpenEncryptedWith(o Opener) { s.opener = o }

// key is the latest revision of a live key under the prefix.
type key struct {
	path string
	// rev is where the value is in etcd's key bucket.
	rev mvcc.Revision
	// res, ns and name are the key's parts (resource path, namespace,
	// name) after the prefix.
	res, ns, name string
	size          int
	// enc is the value's encryption prefix (k8s:enc:…), if the API
	// server encrypted it at rest.
	enc *Encryption
}

// Open opens the etcd snapshot (or bolt database) at path read-only and
// indexes the keys under prefix ("" is DefaultPrefix, kube-apiserver's
// --etcd-prefix), reading etcd's key bucket once. Only the index is kept
// in memory: each live key's name, revision and size, not its value.
// The caller should have checked the file (snapshot.Check): Open reads
// the database as it is.
func Open(path, prefix string) (*Snapshot, error) {
	if prefix == "" {
		prefix = DefaultPrefix
	}
	if !strings.HasPrefix(prefix, "/") {
		return nil, fmt.Errorf("etcd prefix %q: kube-apiserver's prefixes start with /", prefix)
	}
	db, err := bolt.Open(path, 0o400, &bolt.Options{ReadOnly: true, Timeout: 10 * time.Second})
	if err != nil {
		return nil, fmt.Errorf("open %s as an etcd database: %w", path, err)
	}
	s := &Snapshot{db: db, prefix: strings.TrimSuffix(prefix, "/") + "/"}
	if err := db.View(s.index); err != nil {
		db.Close()
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return s, nil
}

// Close releases the database.
func (s *Snapshot) Close() error { return s.db.Close() }

// Prefix is the prefix the keys were read under, with its trailing slash.
func (s *Snapshot) Prefix() string { return s.prefix }

// Revision is the snapshot's newest revision, as etcdutl's status
// reports it.
func (s *Snapshot) Revision() int64 { return s.revision }

// ErrNotEtcd is a database without etcd's key bucket.
var ErrNotEtcd = errors.New("no etcd key bucket: not an etcd v3 snapshot")

// revision lengths in etcd's key bucket: main_sub, and a tombstone's
// trailing 't'.
const revLen, tombstoneRevLen = 17, 18

// index walks etcd's key bucket, which is in revision order: a key's
// later revisions come after its earlier ones, so the last one seen is
// its state; a tombstone (a deletion) removes it until it is written
// again. Compaction may have left earlier revisions or not: either way
// the last is the one that counts.
func (s *Snapshot) index(tx *bolt.Tx) error {
	b := tx.Bucket(schema.Key.Name())
	if b == nil {
		return ErrNotEtcd
	}
	live := map[string]*key{}
	other := map[string]int{}
	prefix := []byte(s.prefix)
	var kv mvccpb.KeyValue
	c := b.Cursor()
	for k, v := c.First(); k != nil; k, v = c.Next() {
		if (len(k) != revLen && len(k) != tombstoneRevLen) || k[8] != '_' {
			return fmt.Errorf("etcd's key bucket holds %x, which is no revision: the database is damaged", k)
		}
		bk := mvcc.BytesToBucketKey(k)
		s.revision = max(s.revision, bk.Main)
		if err := proto.Unmarshal(v, &kv); err != nil {
			return fmt.Errorf("revision %d_%d: %w", bk.Main, bk.Sub, err)
		}
		if !bytes.HasPrefix(kv.Key, prefix) {
			if mvcc.IsTombstone(k) {
				delete(other, string(kv.Key))
			} else {
				other[string(kv.Key)] = len(kv.Value)
			}
			continue
		}
		if mvcc.IsTombstone(k) {
			delete(live, string(kv.Key))
			continue
		}
		e := live[string(kv.Key)]
		if e == nil {
			e = &key{path: string(kv.Key)}
			live[e.path] = e
		}
		e.rev, e.size, e.enc = bk.Revision, len(kv.Value), encryptionOf(kv.Value)
	}
	s.keys = make([]key, 0, len(live))
	for _, e := range live {
		e.res, e.ns, e.name = splitKey(strings.TrimPrefix(e.path, s.prefix))
		s.keys = append(s.keys, *e)
	}
	sort.Slice(s.keys, func(i, j int) bool { return s.keys[i].path < s.keys[j].path })
	s.otherKeys = len(other)
	for _, n := range other {
		s.otherBytes += int64(n)
	}
	return nil
}

// splitKey splits a key after the prefix into the resource's path, the
// namespace and the name: kube-apiserver keeps an object at
// PATH/NAMESPACE/NAME, or PATH/NAME when it is cluster-scoped. PATH is
// one segment for built-ins ("configmaps"), two for "services/specs" and
// "services/endpoints", and GROUP/PLURAL for the API groups of extension
// servers and custom resources (the first segment has a dot).
func splitKey(rest string) (res, ns, name string) {
	parts := strings.Split(rest, "/")
	n := 1
	switch {
	case len(parts) > 2 && strings.Contains(parts[0], "."):
		n = 2
	case len(parts) > 2 && parts[0] == "services" && (parts[1] == "specs" || parts[1] == "endpoints"):
		n = 2
	}
	res = strings.Join(parts[:n], "/")
	switch tail := parts[n:]; len(tail) {
	case 0:
		return res, "", ""
	case 1:
		return res, "", tail[0]
	case 2:
		return res, tail[0], tail[1]
	default:
		// Deeper than any layout: kept under its first segments.
		return res, "", strings.Join(tail, "/")
	}
}

// value reads the stored value of k.
func (s *Snapshot) value(b *bolt.Bucket, k key) ([]byte, error) {
	v := b.Get(mvcc.RevToBytes(k.rev, mvcc.NewRevBytes()))
	if v == nil {
		return nil, fmt.Errorf("%s: revision %d_%d is missing from the database", k.path, k.rev.Main, k.rev.Sub)
	}
	var kv mvccpb.KeyValue
	if err := proto.Unmarshal(v, &kv); err != nil {
		return nil, fmt.Errorf("%s: %w", k.path, err)
	}
	return kv.Value, nil
}

// plain is k's value as the API server wrote it before any encryption:
// read, and opened with the snapshot's opener when the API server
// encrypted it at rest (without an opener it is not read). One that
// cannot be opened is an *EncryptedError of resource r.
func (s *Snapshot) plain(b *bolt.Bucket, r Resource, k key) ([]byte, error) {
	if k.enc != nil && s.opener == nil {
		return nil, &EncryptedError{Resource: r, Namespace: k.ns, Name: k.name, Encryption: *k.enc}
	}
	v, err := s.value(b, k)
	if err != nil || k.enc == nil {
		return v, err
	}
	plain, err := s.opener.Open(k.path, v)
	if err != nil {
		return nil, &EncryptedError{Resource: r, Namespace: k.ns, Name: k.name, Encryption: *k.enc, Err: err}
	}
	return plain, nil
}

// paths returns the distinct resource paths of the live keys.
func (s *Snapshot) paths() []string {
	seen := map[string]bool{}
	var out []string
	for _, k := range s.keys {
		if !seen[k.res] {
			seen[k.res] = true
			out = append(out, k.res)
		}
	}
	return out
}
