package plugin

import (
	"fmt"
	"io/fs"
	"time"

	"google.golang.org/protobuf/types/known/timestamppb"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"

	ebv1 "github.com/kubectl-etcdbackup/kubectl-etcdbackup/api/etcdbackup/v1"
)

// The objects -o json|yaml|name|jsonpath|custom-columns print. They are
// Kubernetes-style documents (apiVersion, kind, metadata, spec, status) so
// that jq and jsonpath expressions written for kubectl carry over, and so
// that the phase and sizes read as the table shows them, not as the wire
// format spells them (BACKUP_PHASE_COMPLETED, sizes as strings). They are
// the plugin's view only: nothing is stored in this form.

// GroupVersion is the apiVersion of every printed object.
var GroupVersion = schema.GroupVersion{Group: "etcdbackup.io", Version: "v1"}

// Backup is one backup as the plugin prints it.
type Backup struct {
	metav1.TypeMeta `json:",inline"`
	Metadata        ObjectMeta   `json:"metadata"`
	Spec            BackupSpec   `json:"spec"`
	Status          BackupStatus `json:"status"`
}

// ObjectMeta is the part of Kubernetes' ObjectMeta a backup has.
type ObjectMeta struct {
	Name              string            `json:"name"`
	Labels            map[string]string `json:"labels,omitempty"`
	CreationTimestamp *metav1.Time      `json:"creationTimestamp,omitempty"`
}

// BackupSpec is what the backup is of and where it is kept.
type BackupSpec struct {
	Location    string        `json:"location"`
	Target      string        `json:"target,omitempty"`
	Source      *BackupSource `json:"source,omitempty"`
	Compression string        `json:"compression"`
	// Encryption is "none" or "age"; AgeRecipients the public keys an
	// age-encrypted backup is encrypted to.
	Encryption    string   `json:"encryption"`
	AgeRecipients []string `json:"ageRecipients,omitempty"`
}

// BackupSource says how the backup arrived.
type BackupSource struct {
	// Kind is one of the API's source kinds: "upload", "agent" (a backup
	// or fold agent's full) or "delta" (ebv1.SourceUpload, SourceAgent,
	// SourceDelta).
	Kind        string       `json:"kind"`
	Description string       `json:"description,omitempty"`
	StartTime   *metav1.Time `json:"startTime,omitempty"`
	EndTime     *metav1.Time `json:"endTime,omitempty"`
	// ClaimedTarget is the target an upload's header named: its
	// uploader's word, which no restore, drill or retention acts on.
	ClaimedTarget string `json:"claimedTarget,omitempty"`
}

// BackupStatus is what is known of the backup now.
type BackupStatus struct {
	// Phase is Running, Completed, Failed or Unknown, as the table shows it.
	Phase        string    `json:"phase"`
	Message      string    `json:"message,omitempty"`
	SizeBytes    int64     `json:"sizeBytes"`
	SHA256       string    `json:"sha256,omitempty"`
	RawSizeBytes int64     `json:"rawSizeBytes,omitempty"`
	RawSHA256    string    `json:"rawSha256,omitempty"`
	Etcd         *EtcdInfo `json:"etcd,omitempty"`
	// Verification is the newest restore drill's verdict.
	Verification *Verification `json:"verification,omitempty"`
	// Chain is a full backup's delta chain, as stored.
	Chain *DeltaChain `json:"chain,omitempty"`
	// Delta is what a delta segment (list --chain) holds.
	Delta *DeltaSegment `json:"delta,omitempty"`
	// Kit is the control plane's recovery kit stored with the backup.
	Kit *Kit `json:"kit,omitempty"`
	// LockedUntil is when the store's object lock retention of the
	// backup's objects ends.
	LockedUntil *metav1.Time `json:"lockedUntil,omitempty"`
	// CopyOf is set on a copy the server made (a backup listed in a
	// copy location): the location it was copied from, and when.
	CopyOf *BackupCopyOf `json:"copyOf,omitempty"`
	// Copies are the backup's copies, one per copy location of its
	// location, and whether each holds it yet.
	Copies []BackupCopy `json:"copies,omitempty"`
}

// BackupCopyOf says where a copy came from: its bytes are the
// original's (the same sha256).
type BackupCopyOf struct {
	Location string       `json:"location"`
	CopyTime *metav1.Time `json:"copyTime,omitempty"`
}

// BackupCopy is one copy of a backup. State is Copied (CopyTime and
// SHA256 are the copy's), Pending (not copied yet), Retrying (the last
// attempt failed: Message says why, NextAttempt when the server tries
// again, FailingSince since when it fails), Conflict (the copy location
// holds another backup of that name), Skipped (the copy was deleted
// there on purpose: not copied again) or Unknown (the copy location
// cannot be read now).
type BackupCopy struct {
	Location     string       `json:"location"`
	State        string       `json:"state"`
	CopyTime     *metav1.Time `json:"copyTime,omitempty"`
	SHA256       string       `json:"sha256,omitempty"`
	Message      string       `json:"message,omitempty"`
	NextAttempt  *metav1.Time `json:"nextAttempt,omitempty"`
	FailingSince *metav1.Time `json:"failingSince,omitempty"`
}

// Kit is a backup's recovery kit as stored: age-encrypted to
// AgeRecipients, read on Node from Paths. Files are listed by get and
// describe (not by list, which gives Entries only).
type Kit struct {
	Name          string       `json:"name"`
	SizeBytes     int64        `json:"sizeBytes"`
	SHA256        string       `json:"sha256"`
	Created       *metav1.Time `json:"created,omitempty"`
	Node          string       `json:"node,omitempty"`
	Paths         []string     `json:"paths,omitempty"`
	Entries       int32        `json:"entries"`
	Files         []KitFile    `json:"files,omitempty"`
	Versions      KitVersions  `json:"versions"`
	AgeRecipients []string     `json:"ageRecipients"`
}

// KitFile is one entry of a kit; Mode is as ls -l shows it.
type KitFile struct {
	Path      string `json:"path"`
	Mode      string `json:"mode"`
	SizeBytes int64  `json:"sizeBytes,omitempty"`
	Link      string `json:"link,omitempty"`
}

// KitVersions are the versions a kit was taken with.
type KitVersions struct {
	Etcd       string `json:"etcd,omitempty"`
	Kubernetes string `json:"kubernetes,omitempty"`
}

// DeltaSegment is one stored piece of a delta chain: the events of
// revisions FirstRevision to LastRevision.
type DeltaSegment struct {
	Chain         string `json:"chain"`
	Epoch         int64  `json:"epoch"`
	FirstRevision int64  `json:"firstRevision"`
	LastRevision  int64  `json:"lastRevision"`
	// FirstTime and LastTime are when the agent saw the first and last
	// revision, in RFC 3339 with nanoseconds: what --to-time takes.
	FirstTime string `json:"firstTime,omitempty"`
	LastTime  string `json:"lastTime,omitempty"`
	Events    int64  `json:"events"`
	EndReason string `json:"endReason,omitempty"`
}

// DeltaChain is what a full backup's delta chain holds: the revisions
// after the full up to LastRevision, in Segments delta segments.
type DeltaChain struct {
	Segments     int64        `json:"segments"`
	LastRevision int64        `json:"lastRevision"`
	LastTime     *metav1.Time `json:"lastTime,omitempty"`
	Bytes        int64        `json:"bytes"`
	Epoch        int64        `json:"epoch"`
	EndReason    string       `json:"endReason,omitempty"`
}

// Verification is what a restore drill found: Result is Succeeded (the
// backup restored, served by etcd, equal to what it recorded), Failed
// (it did not) or Error (the drill reached no verdict).
type Verification struct {
	Time            *metav1.Time `json:"time,omitempty"`
	Result          string       `json:"result"`
	Revision        int64        `json:"revision,omitempty"`
	Keys            int64        `json:"keys,omitempty"`
	HashKV          uint32       `json:"hashKV,omitempty"`
	DurationSeconds float64      `json:"durationSeconds,omitempty"`
	Message         string       `json:"message,omitempty"`
	Job             string       `json:"job,omitempty"`
}

// EtcdInfo are facts about the etcd a snapshot came from. IDs are in hex,
// as etcdctl prints them.
type EtcdInfo struct {
	ClusterID   string `json:"clusterID,omitempty"`
	MemberID    string `json:"memberID,omitempty"`
	MemberName  string `json:"memberName,omitempty"`
	Revision    int64  `json:"revision,omitempty"`
	Version     string `json:"version,omitempty"`
	DBSizeBytes int64  `json:"dbSizeBytes,omitempty"`
	// TotalKeys and Hash are etcdutl snapshot status's figures of the
	// snapshot (Hash as 8 hex digits, as the table shows it);
	// SnapshotStatus says they and Revision were read from the snapshot
	// itself (false: Revision is the member's just before it).
	TotalKeys      int64  `json:"totalKeys,omitempty"`
	Hash           string `json:"hash,omitempty"`
	SnapshotStatus bool   `json:"snapshotStatus,omitempty"`
	// Keyspace is the keyspace fingerprint at Revision, when recorded.
	Keyspace *Keyspace `json:"keyspace,omitempty"`
}

// Keyspace is what a restore of the backup must equal: the keys that
// exist at the revision and etcd's HashKV there (the number `etcdctl
// endpoint hashkv --rev` prints), with the revision the keyspace was
// compacted at.
type Keyspace struct {
	Keys            int64  `json:"keys"`
	HashKV          uint32 `json:"hashKV"`
	CompactRevision int64  `json:"compactRevision,omitempty"`
}

// BackupList is a list of backups, newest first.
type BackupList struct {
	metav1.TypeMeta `json:",inline"`
	Items           []Backup `json:"items"`
}

// Restore is an in-cluster restore of a backup into a target.
type Restore struct {
	metav1.TypeMeta `json:",inline"`
	Metadata        ObjectMeta    `json:"metadata"`
	Spec            RestoreSpec   `json:"spec"`
	Status          RestoreStatus `json:"status"`
}

// RestoreSpec names what is restored where.
type RestoreSpec struct {
	Backup    string `json:"backup"`
	Location  string `json:"location,omitempty"`
	Target    string `json:"target"`
	DryRun    bool   `json:"dryRun,omitempty"`
	MoveAside bool   `json:"moveAside,omitempty"`
	// BumpRevision is --bump-revision, asked of every member; 0 is shown.
	BumpRevision int64 `json:"bumpRevision"`
	// ToRevision and ToTime are a restore to a point's (--to-revision,
	// --to-time; ToRevision the revision planned for a time, when the
	// server could tell), Segments the delta segments replayed after
	// Backup, in order.
	ToRevision int64    `json:"toRevision,omitempty"`
	ToTime     string   `json:"toTime,omitempty"`
	Segments   []string `json:"segments,omitempty"`
}

// RestoreStatus is the state of each member's restore agent.
type RestoreStatus struct {
	// Phase sums up the members: Failed if one failed, Succeeded if all
	// did, Pending for a dry run, else Running.
	Phase   string          `json:"phase"`
	Members []MemberRestore `json:"members"`
}

// MemberRestore is the restore of one member's data directory.
type MemberRestore struct {
	Member              string `json:"member"`
	Job                 string `json:"job"`
	Volume              string `json:"volume"`
	DataDir             string `json:"dataDir"`
	InitialCluster      string `json:"initialCluster"`
	PeerURL             string `json:"peerURL"`
	InitialClusterToken string `json:"initialClusterToken"`
	Phase               string `json:"phase"`
	Message             string `json:"message,omitempty"`
	// What the member's restore adds to etcd's revision (0: nothing), and
	// whether it marks the result compacted.
	BumpRevision  int64 `json:"bumpRevision"`
	MarkCompacted bool  `json:"markCompacted"`
}

// Version is what `version` prints: the plugin's build and, unless
// --client, the server it reached.
type Version struct {
	metav1.TypeMeta `json:",inline"`
	ClientVersion   BuildInfo   `json:"clientVersion"`
	Server          *ServerInfo `json:"server,omitempty"`
}

// BuildInfo is a binary's version.
type BuildInfo struct {
	Version   string `json:"version"`
	GitCommit string `json:"gitCommit,omitempty"`
}

// ServerInfo describes the server: its build, locations and targets.
type ServerInfo struct {
	Version   string            `json:"version"`
	GitCommit string            `json:"gitCommit,omitempty"`
	Locations []StorageLocation `json:"locations"`
	Targets   []EtcdTarget      `json:"targets"`
}

// StorageLocation is one of the server's storage locations.
type StorageLocation struct {
	Name        string `json:"name"`
	Type        string `json:"type"`
	Default     bool   `json:"default"`
	Description string `json:"description,omitempty"`
	// Available is false while the server cannot use the location; Error
	// says why and since when. The server keeps retrying it.
	Available bool   `json:"available"`
	Error     string `json:"error,omitempty"`
}

// EtcdTarget is one of the etcd clusters the server backs up.
type EtcdTarget struct {
	Name      string   `json:"name"`
	Endpoints []string `json:"endpoints"`
	Default   bool     `json:"default"`
}

// VerifyResult is what `verify` prints: the backup and what etcd read
// from it.
type VerifyResult struct {
	metav1.TypeMeta `json:",inline"`
	Metadata        ObjectMeta         `json:"metadata"`
	Status          VerifyResultStatus `json:"status"`
}

// VerifyResultStatus are the figures etcd reports of a verified snapshot.
type VerifyResultStatus struct {
	// Intact is true when everything was checked: stored bytes, etcd's
	// trailer and the database. StoredOnly is an encrypted backup whose
	// stored bytes alone were checked (no --identity); Message says so.
	Intact         bool   `json:"intact"`
	StoredOnly     bool   `json:"storedOnly,omitempty"`
	Message        string `json:"message,omitempty"`
	Location       string `json:"location"`
	SHA256         string `json:"sha256"`
	Revision       int64  `json:"revision"`
	TotalKeys      int64  `json:"totalKeys"`
	TotalSizeBytes int64  `json:"totalSizeBytes"`
	Hash           uint32 `json:"hash"`
	StorageVersion string `json:"storageVersion,omitempty"`
	// Kit is the check of the backup's recovery kit, if it has one.
	Kit *KitVerification `json:"kit,omitempty"`
}

// KitVerification is what verify found of a recovery kit: its stored
// bytes (StoredOnly, without an identity), or every file opened here
// against the index sealed with it (Opened).
type KitVerification struct {
	Name       string `json:"name"`
	SHA256     string `json:"sha256"`
	Entries    int32  `json:"entries"`
	StoredOnly bool   `json:"storedOnly,omitempty"`
	Opened     bool   `json:"opened,omitempty"`
	Message    string `json:"message"`
}

func (b *Backup) DeepCopyObject() runtime.Object       { c := *b; return &c }
func (l *BackupList) DeepCopyObject() runtime.Object   { c := *l; return &c }
func (r *Restore) DeepCopyObject() runtime.Object      { c := *r; return &c }
func (v *Version) DeepCopyObject() runtime.Object      { c := *v; return &c }
func (v *VerifyResult) DeepCopyObject() runtime.Object { c := *v; return &c }

var (
	_ runtime.Object = &Backup{}
	_ runtime.Object = &BackupList{}
	_ runtime.Object = &Restore{}
	_ runtime.Object = &Version{}
	_ runtime.Object = &VerifyResult{}
)

func typeMeta(kind string) metav1.TypeMeta {
	return metav1.TypeMeta{APIVersion: GroupVersion.String(), Kind: kind}
}

func timeOf(t *timestamppb.Timestamp) *metav1.Time {
	if !knownTime(t) {
		return nil
	}
	m := metav1.NewTime(t.AsTime().UTC())
	return &m
}

// backupObject turns the API's Backup into the printed object.
func backupObject(b *ebv1.Backup) Backup {
	o := Backup{
		TypeMeta: typeMeta("Backup"),
		Metadata: ObjectMeta{
			Name:              b.GetName(),
			Labels:            b.GetLabels(),
			CreationTimestamp: timeOf(b.GetCreateTime()),
		},
		Spec: BackupSpec{
			Location:      b.GetLocation(),
			Target:        b.GetSource().GetTarget(),
			Compression:   b.GetCompression(),
			Encryption:    b.GetEncryption(),
			AgeRecipients: b.GetAgeRecipients(),
		},
		Status: BackupStatus{
			Phase:        phaseString(b.GetPhase()),
			Message:      b.GetMessage(),
			SizeBytes:    b.GetSize(),
			SHA256:       b.GetSha256(),
			RawSizeBytes: b.GetRawSize(),
			RawSHA256:    b.GetRawSha256(),
		},
	}
	if o.Spec.Compression == "" {
		o.Spec.Compression = "none"
	}
	if o.Spec.Encryption == "" {
		o.Spec.Encryption = "none"
	}
	if s := b.GetSource(); s != nil {
		o.Spec.Source = &BackupSource{
			Kind:          s.GetKind(),
			Description:   s.GetDescription(),
			StartTime:     timeOf(s.GetStartTime()),
			EndTime:       timeOf(s.GetEndTime()),
			ClaimedTarget: s.GetClaimedTarget(),
		}
	}
	if e := b.GetEtcd(); e != nil {
		o.Status.Etcd = &EtcdInfo{
			ClusterID:   hexID(e.GetClusterId()),
			MemberID:    hexID(e.GetMemberId()),
			MemberName:  e.GetMemberName(),
			Revision:    e.GetRevision(),
			Version:     e.GetVersion(),
			DBSizeBytes: e.GetDbSize(),
		}
		if e.GetSnapshotStatus() {
			o.Status.Etcd.TotalKeys, o.Status.Etcd.Hash, o.Status.Etcd.SnapshotStatus = e.GetTotalKeys(), hashString(b), true
		}
		if e.GetKeyspace() {
			o.Status.Etcd.Keyspace = &Keyspace{Keys: e.GetKeyspaceKeys(), HashKV: e.GetHashKv(), CompactRevision: e.GetCompactRevision()}
		}
	}
	o.Status.LockedUntil = timeOf(b.GetLockedUntil())
	if c := b.GetCopyOf(); c != nil {
		o.Status.CopyOf = &BackupCopyOf{Location: c.GetLocation(), CopyTime: timeOf(c.GetCopyTime())}
	}
	for _, c := range b.GetCopies() {
		o.Status.Copies = append(o.Status.Copies, BackupCopy{
			Location: c.GetLocation(), State: copyStateString(c.GetState()), CopyTime: timeOf(c.GetCopyTime()),
			SHA256: c.GetSha256(), Message: c.GetMessage(), NextAttempt: timeOf(c.GetNextAttempt()), FailingSince: timeOf(c.GetFailingSince()),
		})
	}
	if v := b.GetVerification(); v != nil {
		o.Status.Verification = &Verification{
			Time: timeOf(v.GetTime()), Result: verificationResultString(v.GetResult()),
			Revision: v.GetRevision(), Keys: v.GetKeys(), HashKV: v.GetHashKv(),
			DurationSeconds: v.GetDurationSeconds(), Message: v.GetMessage(), Job: v.GetJob(),
		}
	}
	if d := b.GetDelta(); d != nil {
		o.Status.Delta = &DeltaSegment{Chain: d.GetChain(), Epoch: d.GetEpoch(), FirstRevision: d.GetFirstRevision(), LastRevision: d.GetLastRevision(),
			FirstTime: nanoTime(d.GetFirstTime()), LastTime: nanoTime(d.GetLastTime()), Events: d.GetEvents(), EndReason: d.GetEndReason()}
	}
	if c := b.GetChain(); c != nil {
		o.Status.Chain = &DeltaChain{Segments: c.GetSegments(), LastRevision: c.GetLastRevision(), LastTime: timeOf(c.GetLastTime()),
			Bytes: c.GetBytes(), Epoch: c.GetEpoch(), EndReason: c.GetEndReason()}
	}
	if k := b.GetKit(); k != nil {
		o.Status.Kit = kitObject(k)
	}
	return o
}

func kitObject(k *ebv1.Kit) *Kit {
	o := &Kit{
		Name: k.GetName(), SizeBytes: k.GetSize(), SHA256: k.GetSha256(), Created: timeOf(k.GetCreateTime()),
		Node: k.GetNode(), Paths: k.GetPaths(), Entries: k.GetEntries(), AgeRecipients: k.GetAgeRecipients(),
		Versions: KitVersions{Etcd: k.GetVersions().GetEtcd(), Kubernetes: k.GetVersions().GetKubernetes()},
	}
	for _, f := range k.GetFiles() {
		o.Files = append(o.Files, KitFile{Path: f.GetPath(), Mode: fs.FileMode(f.GetMode()).String(), SizeBytes: f.GetSize(), Link: f.GetLink()})
	}
	return o
}

// nanoTime is ts in RFC 3339 with nanoseconds, "" when unset.
func nanoTime(ts *timestamppb.Timestamp) string {
	if ts == nil {
		return ""
	}
	return ts.AsTime().UTC().Format(time.RFC3339Nano)
}

// backupList turns backups into a BackupList; Items is never nil, so an
// empty list prints "items": [].
func backupList(bs []*ebv1.Backup) *BackupList {
	l := &BackupList{TypeMeta: typeMeta("BackupList"), Items: []Backup{}}
	for _, b := range bs {
		l.Items = append(l.Items, backupObject(b))
	}
	return l
}

func hexID(id uint64) string {
	if id == 0 {
		return ""
	}
	return fmt.Sprintf("%x", id)
}

func restorePhaseString(p ebv1.RestorePhase) string { return enumWord(p, "RESTORE_PHASE_") }

// restoreObject turns a restore's members into the printed object.
func restoreObject(spec RestoreSpec, members []*ebv1.MemberRestore) *Restore {
	r := &Restore{
		TypeMeta: typeMeta("Restore"),
		Metadata: ObjectMeta{Name: spec.Backup + "-" + spec.Target},
		Spec:     spec,
		Status:   RestoreStatus{Members: []MemberRestore{}},
	}
	failed, done := false, true
	for _, m := range members {
		r.Status.Members = append(r.Status.Members, MemberRestore{
			Member: m.GetMember(), Job: m.GetJobName(), Volume: m.GetVolume(), DataDir: m.GetDataDir(),
			InitialCluster: m.GetInitialCluster(), PeerURL: m.GetPeerUrl(), InitialClusterToken: tokenLabel(m.GetInitialClusterToken()),
			Phase: restorePhaseString(m.GetPhase()), Message: m.GetMessage(),
			BumpRevision: m.GetBumpRevision(), MarkCompacted: m.GetMarkCompacted(),
		})
		switch m.GetPhase() {
		case ebv1.RestorePhase_RESTORE_PHASE_FAILED:
			failed = true
		case ebv1.RestorePhase_RESTORE_PHASE_SUCCEEDED:
		default:
			done = false
		}
	}
	switch {
	case spec.DryRun:
		r.Status.Phase = "Pending"
	case failed:
		r.Status.Phase = "Failed"
	case done && len(members) > 0:
		r.Status.Phase = "Succeeded"
	default:
		r.Status.Phase = "Running"
	}
	return r
}

// serverInfo turns GetServerInfo's answer into the printed form.
func serverInfo(info *ebv1.GetServerInfoResponse) *ServerInfo {
	s := &ServerInfo{Version: info.GetVersion(), GitCommit: info.GetGitCommit(), Locations: []StorageLocation{}, Targets: []EtcdTarget{}}
	for _, l := range info.GetLocations() {
		s.Locations = append(s.Locations, StorageLocation{Name: l.GetName(), Type: l.GetType(), Default: l.GetDefault(), Description: l.GetDescription(),
			Available: !l.GetUnavailable(), Error: l.GetError()})
	}
	for _, t := range info.GetTargets() {
		s.Targets = append(s.Targets, EtcdTarget{Name: t.GetName(), Endpoints: t.GetEndpoints(), Default: t.GetDefault()})
	}
	return s
}
