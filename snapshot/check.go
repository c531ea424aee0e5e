package snapshot

import (
	"fmt"

	etcdutl "go.etcd.io/etcd/etcdutl/v3/snapshot"
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
func CheckDatabase(path string) (Status, error) {
	st, err := etcdutl.NewV3(zap.NewNop()).Status(path)
	if err != nil {
		return Status{}, fmt.Errorf("%w: etcd cannot read the database: %v", ErrCorrupt, err)
	}
	return st, nil
}

// Facts are a snapshot's status as a backup records it: revision, keys
// and hash, marked as read from the snapshot itself.
func Facts(st Status) *ebv1.EtcdInfo {
	return &ebv1.EtcdInfo{Revision: st.Revision, TotalKeys: int64(st.TotalKey), Hash: st.Hash, SnapshotStatus: true}
}
