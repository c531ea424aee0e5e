package rpc

import (
	"cmp"
	"time"

	"google.golang.org/protobuf/types/known/timestamppb"

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

func backupFromManifest(loc string, m *storage.Manifest) *ebv1.Backup {
	b := &ebv1.Backup{
		Name:          m.Name,
		Location:      loc,
		Phase:         ebv1.BackupPhase_BACKUP_PHASE_COMPLETED,
		Size:          m.Size,
		Sha256:        m.SHA256,
		CreateTime:    timestamppb.New(m.CreateTime),
		Labels:        m.Labels,
		Compression:   m.Compression,
		RawSize:       m.RawSize,
		RawSha256:     m.RawSHA256,
		Encryption:    m.Encryption,
		AgeRecipients: m.AgeRecipients,
		Source: &ebv1.BackupSource{
			Kind:          m.Source.Kind,
			Description:   m.Source.Description,
			Target:        m.Source.Target,
			ClaimedTarget: m.Source.ClaimedTarget,
			Scheduled:     m.Source.Scheduled,
		},
	}
	if m.Source.Kind == ebv1.SourceUpload && m.Source.Target != "" {
		// Stored before uploads' targets were recorded as claims: the
		// uploader's word all the same.
		b.Source.Target, b.Source.ClaimedTarget = "", cmp.Or(m.Source.ClaimedTarget, m.Source.Target)
	}
	if !m.Source.ScheduledTime.IsZero() {
		b.Source.ScheduledTime = timestamppb.New(m.Source.ScheduledTime)
	}
	if !m.Source.StartTime.IsZero() {
		b.Source.StartTime = timestamppb.New(m.Source.StartTime)
	}
	if !m.Source.EndTime.IsZero() {
		b.Source.EndTime = timestamppb.New(m.Source.EndTime)
	}
	if e := m.Etcd; e != nil {
		b.Etcd = &ebv1.EtcdInfo{
			ClusterId:      e.ClusterID,
			MemberId:       e.MemberID,
			MemberName:     e.MemberName,
			Revision:       e.Revision,
			Version:        e.Version,
			DbSize:         e.DBSize,
			TotalKeys:      e.TotalKeys,
			Hash:           e.Hash,
			SnapshotStatus: e.SnapshotStatus,
		}
		if e.Keyspace {
			b.Etcd.KeyspaceKeys, b.Etcd.HashKv, b.Etcd.CompactRevision, b.Etcd.Keyspace = e.KeyspaceKeys, e.HashKV, e.CompactRevision, true
		}
		b.Etcd.AuthRevision = e.AuthRevision
	}
	if d := m.Delta; d != nil {
		b.Delta = deltaOf(d)
	}
	if v := m.Verification; v != nil {
		b.Verification = &ebv1.Verification{
			Time: timestamppb.New(v.Time), Result: verificationResult(v.Result),
			Revision: v.Revision, Keys: v.Keys, HashKv: v.HashKV,
			DurationSeconds: v.Duration.Seconds(), Message: v.Message, Job: v.Job,
		}
	}
	return b
}

func verificationResult(r string) ebv1.VerificationResult {
	switch r {
	case storage.VerificationSucceeded:
		return ebv1.VerificationResult_VERIFICATION_RESULT_SUCCEEDED
	case storage.VerificationFailed:
		return ebv1.VerificationResult_VERIFICATION_RESULT_FAILED
	case storage.VerificationError:
		return ebv1.VerificationResult_VERIFICATION_RESULT_ERROR
	}
	return ebv1.VerificationResult_VERIFICATION_RESULT_UNSPECIFIED
}
