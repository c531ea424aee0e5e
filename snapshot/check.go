package snapshot

import (
	"fmt"

	bolt "go.etcd.io/bbolt"
	etcdutl "go.etcd.io/etcd/etcdutl/v3/snapshot"
	"go.etcd.io/etcd/server/v3/storage/mvcc"
	"go.etcd.io/etcd/server/v3/storage/schema"
	"go.uber.org/zap"

	ebv1 "github.com/kubectl-etcdbackup/kubectl-etcdbackup/api/etcdbackup/v1"
)

// Status is what etcd says about a snapshot.
type Status = etcdutl.Status

// Check verifies an etcd snapshot file: etcd's 32-byte SHA-256 trailer,
// then (through etcdutl) bolt's consistency check of every page, and
// returns the snapshot's status. bolt needs random access: the snapshot
// must be a file, not a stream.
func Check(path string) (Status, error) {
	if err := CheckTrailer(path); err != nil {
		return Status{}, err
	}
	return CheckDatabase(path)
}

// CheckDatabase is Check for a file whose trailer was already verified
// while it was written (WritePlain, WritePlainFile): bolt's consistency
// check and the status only, without hashing the whole file again.
//
// The status's Revision is the store's revision, the one a member started
// on the snapshot answers in every response header — not etcdutl's, the
// newest revision left in the key bucket, which is lower when a
// compaction removed the newest revisions' entries (a tombstone at the
// compact revision, removed by etcd up to 3.5.15): etcd's own MVCC store
// takes the larger of that and the compact revision, scheduled or
// finished, recorded in its meta bucket, and so does this.
func CheckDatabase(path string) (Status, error) {
	st, err := etcdutl.NewV3(zap.NewNop()).Status(path)
	if err != nil {
		return Status{}, fmt.Errorf("%w: etcd cannot read the database: %v", ErrCorrupt, err)
	}
	compacted, err := compactRevision(path)
	if err != nil {
		return Status{}, fmt.Errorf("%w: etcd cannot read the database's compact revision: %v", ErrCorrupt, err)
	}
	st.Revision = max(st.Revision, compacted)
	return st, nil
}

// compactRevision reads the compact revisions etcd's MVCC store records
// in its meta bucket (finished and scheduled) and returns the larger (0:
// never compacted), as the store reads them when it opens.
func compactRevision(path string) (int64, error) {
	db, err := bolt.Open(path, 0o400, &bolt.Options{ReadOnly: true})
	if err != nil {
		return 0, err
	}
	defer db.Close()
	var rev int64
	err = db.View(func(tx *bolt.Tx) error {
		meta := tx.Bucket(schema.Meta.Name())
		if meta == nil {
			return nil
		}
		for _, key := range [][]byte{schema.FinishedCompactKeyName, schema.ScheduledCompactKeyName} {
			v := meta.Get(key)
			if v == nil {
				continue
			}
			// A revision: 8 bytes main, '_', 8 bytes sub.
			if len(v) != 17 {
				return fmt.Errorf("meta %s is %d bytes, not a revision", key, len(v))
			}
			rev = max(rev, mvcc.BytesToRev(v).Main)
		}
		return nil
	})
	return rev, err
}

// Facts are a snapshot's status as a backup records it: revision, keys
// and hash, marked as read from the snapshot itself.
func Facts(st Status) *ebv1.EtcdInfo {
	return &ebv1.EtcdInfo{Revision: st.Revision, TotalKeys: int64(st.TotalKey), Hash: st.Hash, SnapshotStatus: true}
}
