package snapshot

import (
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"

	"go.etcd.io/etcd/pkg/v3/traceutil"
	"go.etcd.io/etcd/server/v3/lease"
	"go.etcd.io/etcd/server/v3/storage/backend"
	"go.etcd.io/etcd/server/v3/storage/mvcc"
	"go.uber.org/zap"
)

// Keyspace is the keyspace fingerprint of a snapshot: what a live member
// answers for HashKV and a count of its keys at the snapshot's revision,
// so that a restored member can be compared with the cluster the backup
// was taken from.
type Keyspace struct {
	// Revision is the keyspace's newest revision; CompactRevision the
	// one it was compacted at (0: never).
	Revision, CompactRevision int64
	// Keys is the number of keys that exist at Revision.
	Keys int64
	// HashKV is etcd's HashKV of the keyspace at Revision: a CRC-32C of
	// every key-value revision up to it, as `etcdctl endpoint hashkv
	// --rev` prints it.
	HashKV uint32
}

// ReadKeyspace computes the keyspace fingerprint of the plain snapshot at
// path with etcd's own storage code (its backend and MVCC store, the code
// a member runs). Opening a database for that writes to it, so a private
// copy is made in scratch ("" is the system's temporary directory) and
// removed; with copied false, path itself is used (and its trailer cut
// off) — only for a file no one else needs, such as the agent's scratch
// copy.
func ReadKeyspace(path, scratch string, copied bool) (ks Keyspace, err error) {
	// etcd's storage code panics on a database it cannot open or read
	// (it is a member's own file there); here that is a corrupt snapshot.
	defer func() {
		if p := recover(); p != nil {
			ks, err = Keyspace{}, fmt.Errorf("%w: etcd cannot open the database: %v", ErrCorrupt, p)
		}
	}()
	db := path
	if copied {
		dir, err := os.MkdirTemp(scratch, "keyspace-")
		if err != nil {
			return Keyspace{}, fmt.Errorf("scratch space to read the keyspace: %w", err)
		}
		defer os.RemoveAll(dir)
		db = filepath.Join(dir, "db")
		if err := copyFile(path, db); err != nil {
			return Keyspace{}, fmt.Errorf("copy the snapshot to read its keyspace: %w", err)
		}
	}
	// etcd's SHA-256 trailer is no part of the database: etcd's own
	// restore strips it too.
	if fi, err := os.Stat(db); err == nil && fi.Size()%512 == 32 {
		if err := os.Truncate(db, fi.Size()-32); err != nil {
			return Keyspace{}, fmt.Errorf("strip etcd's trailer from the copy: %w", err)
		}
	}
	lg := zap.NewNop()
	be := backend.NewDefaultBackend(lg, db)
	defer be.Close()
	s := mvcc.NewStore(lg, be, &lease.FakeLessor{}, mvcc.StoreConfig{})
	defer s.Close()
	h, rev, err := s.HashStorage().HashByRev(0)
	if err != nil {
		return Keyspace{}, fmt.Errorf("%w: etcd cannot hash its keyspace: %v", ErrCorrupt, err)
	}
	txn := s.Read(mvcc.ConcurrentReadTxMode, traceutil.TODO())
	r, err := txn.Range(context.Background(), []byte{0}, []byte{}, mvcc.RangeOptions{Rev: rev, CountOnly: true})
	txn.End()
	if err != nil {
		return Keyspace{}, fmt.Errorf("%w: etcd cannot count its keys: %v", ErrCorrupt, err)
	}
	// etcd says -1 for a keyspace never compacted.
	return Keyspace{Revision: rev, CompactRevision: max(0, h.CompactRevision), Keys: int64(r.Count), HashKV: h.Hash}, nil
}

func copyFile(from, to string) error {
	src, err := os.Open(from)
	if err != nil {
		return err
	}
	defer src.Close()
	dst, err := os.OpenFile(to, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return err
	}
	if _, err := io.Copy(dst, src); err != nil {
		dst.Close()
		return err
	}
	return dst.Close()
}
