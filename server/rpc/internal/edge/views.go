package edge

import (
	"cmp"
	"strings"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/timestamppb"
	"k8s.io/apimachinery/pkg/util/validation"

	ebv1 "github.com/kubectl-etcdbackup/kubectl-etcdbackup/api/etcdbackup/v1"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/storage"
)

// MaxNameLength keeps NAME.json within the 255-byte file-name limit of
// common file systems; S3 keys allow more, names must work everywhere.
const MaxNameLength = 200

// ValidateName checks a backup or location name: a DNS-1123 subdomain
// (lower case alphanumerics, '-' and '.', starting and ending
// alphanumeric) of at most MaxNameLength characters. That rules out empty
// names, path separators, "..", and absolute paths.
func ValidateName(what, name string) error {
	if name == "" {
		return status.Errorf(codes.InvalidArgument, "%s name is empty; give a name such as \"etcd-2026-01-31\"", what)
	}
	if len(name) > MaxNameLength {
		return status.Errorf(codes.InvalidArgument, "%s name is %d characters long; the limit is %d", what, len(name), MaxNameLength)
	}
	if errs := validation.IsDNS1123Subdomain(name); len(errs) > 0 {
		return status.Errorf(codes.InvalidArgument, "%s name %q is invalid: %s", what, name, strings.Join(errs, "; "))
	}
	return nil
}

// Backup is the API's view of a stored backup m in location loc.
func Backup(loc string, m *storage.Manifest) *ebv1.Backup {
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
	if !m.LockedUntil.IsZero() {
		b.LockedUntil = timestamppb.New(m.LockedUntil)
	}
	if c := m.Copy; c != nil {
		b.CopyOf = &ebv1.BackupCopyOf{Location: c.From, CopyTime: timestamppb.New(c.Time)}
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

// ChainSummary is what full's chain holds: its segments that follow each
// other from the full's revision on, with no gap and no overlap, from
// writers whose epochs never go back. Segments past a gap are not part
// of it (they cannot be replayed); nil when no segment follows full.
func ChainSummary(full *storage.Manifest, segs []*storage.Manifest) *ebv1.DeltaChain {
	if full.Etcd == nil || len(segs) == 0 {
		return nil
	}
	var c *ebv1.DeltaChain
	for _, m := range storage.ContiguousSegments(full.Etcd.Revision, segs) {
		if c == nil {
			c = &ebv1.DeltaChain{}
		}
		d := m.Delta
		c.Segments++
		c.Bytes += m.Size
		c.LastRevision = d.LastRevision
		if !d.LastTime.IsZero() {
			c.LastTime = timestamppb.New(d.LastTime)
		}
		c.Epoch, c.EndReason, c.HistoryBreak = d.Epoch, d.EndReason, d.HistoryBreak
		if d.LastEvent != nil {
			c.LastEvent = deltaEventOf(d.LastEvent)
		}
	}
	return c
}

func deltaEventOf(e *storage.DeltaEvent) *ebv1.DeltaEvent {
	return &ebv1.DeltaEvent{Key: e.Key, Deleted: e.Deleted, ValueSha256: e.ValueSHA256}
}

// WithChain adds full's chain, as stored, to b.
func WithChain(b *ebv1.Backup, full *storage.Manifest, segments map[string][]*storage.Manifest) {
	if c := ChainSummary(full, segments[full.Name]); c != nil {
		b.Chain = c
	}
}

// deltaOf is m's segment description for the API.
func deltaOf(d *storage.Delta) *ebv1.DeltaSegment {
	out := &ebv1.DeltaSegment{
		Chain: d.Chain, Epoch: d.Epoch, FirstRevision: d.FirstRevision, LastRevision: d.LastRevision,
		Events: d.Events, EndReason: d.EndReason, HistoryBreak: d.HistoryBreak, ClockOffsetSeconds: d.ClockOffset.Seconds(),
		AuthRevision: d.AuthRevision,
	}
	if d.LastEvent != nil {
		out.LastEvent = deltaEventOf(d.LastEvent)
	}
	if !d.FirstTime.IsZero() {
		out.FirstTime = timestamppb.New(d.FirstTime)
	}
	if !d.LastTime.IsZero() {
		out.LastTime = timestamppb.New(d.LastTime)
	}
	return out
}

// WithKit sets b's kit from its stored manifest m (nil: none). A listing
// leaves the kit's entries out (withFiles false): they are GetBackup's.
func WithKit(b *ebv1.Backup, m *storage.Manifest, withFiles bool) {
	if m == nil || m.Kit == nil {
		return
	}
	k := &ebv1.Kit{
		Name: m.Name, Size: m.Size, Sha256: m.SHA256, CreateTime: timestamppb.New(m.CreateTime),
		Node: m.Kit.Node, Paths: m.Kit.Paths, AgeRecipients: m.AgeRecipients, Entries: int32(len(m.Kit.Files)),
		Versions: &ebv1.KitVersions{Etcd: m.Kit.Versions.Etcd, Kubernetes: m.Kit.Versions.Kubernetes},
	}
	if withFiles {
		for _, f := range m.Kit.Files {
			k.Files = append(k.Files, &ebv1.KitFile{Path: f.Path, Mode: f.Mode, Size: f.Size, Link: f.Link})
		}
	}
	b.Kit = k
}
