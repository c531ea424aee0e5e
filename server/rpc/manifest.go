package rpc

import (
	"time"

	ebv1 "github.com/kubectl-etcdbackup/kubectl-etcdbackup/api/etcdbackup/v1"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/storage"
)

func manifestFromHeader(h *ebv1.UploadHeader, kind string, size int64, digest string, now time.Time) *storage.Manifest {
	m := &storage.Manifest{
		Name:        h.GetName(),
		Size:        size,
		SHA256:      digest,
		CreateTime:  now,
		Labels:      h.GetLabels(),
		Compression: h.GetCompression(),
		RawSize:     h.GetRawSize(),
		RawSHA256:   h.GetRawSha256(),
		Encryption:  h.GetEncryption(),
		Source: storage.Source{
			Kind:        kind,
			Description: h.GetSource().GetDescription(),
			// The header's target is the uploader's word; an agent's
			// comes from its signed Job (commitUpload).
			ClaimedTarget: h.GetSource().GetTarget(),
		},
	}
	if m.Encryption != "" {
		m.AgeRecipients = h.GetAgeRecipients()
	}
	if m.Compression == "" && m.Encryption == "" {
		m.RawSize, m.RawSHA256 = size, digest
	}
	if t := h.GetSource().GetStartTime(); t != nil {
		m.Source.StartTime = t.AsTime()
	}
	if t := h.GetSource().GetEndTime(); t != nil {
		m.Source.EndTime = t.AsTime()
	}
	if e := h.GetEtcd(); e != nil {
		m.Etcd = &storage.EtcdInfo{
			ClusterID:      e.GetClusterId(),
			MemberID:       e.GetMemberId(),
			MemberName:     e.GetMemberName(),
			Revision:       e.GetRevision(),
			Version:        e.GetVersion(),
			DBSize:         e.GetDbSize(),
			TotalKeys:      e.GetTotalKeys(),
			Hash:           e.GetHash(),
			SnapshotStatus: e.GetSnapshotStatus(),
		}
		setKeyspace(m.Etcd, e)
	}
	return m
}

// setKeyspace records e's keyspace fingerprint in m, if it has one.
func setKeyspace(m *storage.EtcdInfo, e *ebv1.EtcdInfo) {
	if e.GetKeyspace() {
		m.KeyspaceKeys, m.HashKV, m.CompactRevision, m.Keyspace = e.GetKeyspaceKeys(), e.GetHashKv(), e.GetCompactRevision(), true
	}
	m.AuthRevision = e.GetAuthRevision()
}

// withSnapshotStatus records in m what the sender read from the plain
// snapshot once it had all of it (the trailer's etcd facts), over the
// header's.
func withSnapshotStatus(m *storage.Manifest, e *ebv1.EtcdInfo) {
	if !e.GetSnapshotStatus() {
		return
	}
	if m.Etcd == nil {
		m.Etcd = &storage.EtcdInfo{}
	}
	m.Etcd.Revision, m.Etcd.TotalKeys, m.Etcd.Hash, m.Etcd.SnapshotStatus = e.GetRevision(), e.GetTotalKeys(), e.GetHash(), true
	setKeyspace(m.Etcd, e)
}
