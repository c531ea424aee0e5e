// Package config is the data server's configuration model: the types of its
// configuration file — storage locations, etcd targets and how agents are
// launched —, their defaults, and Load and Validate. It is a leaf of plain
// types that the server, its Job launcher and its storage wiring all use
// as is. Secrets are never in the file: it names files (a mounted Secret)
// or Secret objects that hold them.
//
//	replicas: 1                   # the server Deployment's; more than 1 needs s3 or sharedVolume
//	locations:
//	  - name: default
//	    filesystem: {path: /var/lib/etcdbackup}  # sharedVolume: true when on a ReadWriteMany volume
//	  - name: s3
//	    s3:
//	      bucket: etcd-backups
//	      prefix: prod
//	      endpoint: https://s3.example.internal:7070
//	      pathStyle: true
//	      caBundleFile: /etc/etcdbackup/s3-ca/ca.crt
//	      accessKeyIDFile: /etc/etcdbackup/s3-credentials/access-key-id
//	      secretAccessKeyFile: /etc/etcdbackup/s3-credentials/secret-access-key
//	targets:
//	  - name: control-plane
//	    endpoints: [https://10.0.0.10:2379, https://10.0.0.11:2379]
//	    tlsSecret: etcd-client      # keys ca.crt, tls.crt, tls.key
//	    location: s3
//	    compression: zstd
//	    encryption:                 # public keys only; see docs/encryption.md
//	      ageRecipients: [age1ql3z7hjy54pw3hyww5ayyfg7zqgvc7w3j2elw8zmrj2kg5sfn9aqmcac8p]
//	    schedule: "0 */6 * * *"     # cron; backups named control-plane-YYYYMMDD-HHMMSS
//	    timeZone: Europe/Berlin     # IANA zone of the schedule (default UTC)
//	    startingDeadline: 1h        # how late a missed run may start (default: one period)
//	    retention: {keepLast: 28, maxAge: 720h}
//	    kit:                        # a recovery kit with every backup (docs/disaster-recovery.md)
//	      nodeName: cp-1            # the control-plane node whose files it holds
//	      paths: [/etc/kubernetes]  # host directories, whole (this is the default)
//	      ageRecipients: [age1ql3z7hjy54pw3hyww5ayyfg7zqgvc7w3j2elw8zmrj2kg5sfn9aqmcac8p]  # required
//	  - name: app-etcd              # etcd in the cluster, restorable in place
//	    endpoints: [https://app-etcd-0.app-etcd.app.svc:2379]
//	    tlsSecret: app-etcd-client
//	    namespace: app              # where the members' PVCs are; restore Jobs run there
//	    initialClusterToken: app-etcd
//	    restoreRunAsUser: 1001      # the uid/gid etcd runs as (default 65532)
//	    restoreRunAsGroup: 1001
//	    members:
//	      - name: app-etcd-0
//	        peerURL: https://app-etcd-0.app-etcd.app.svc:2380
//	        clientURL: https://app-etcd-0.app-etcd.app.svc:2379
//	        dataDir: data           # etcd's --data-dir inside the volume
//	        volume: {persistentVolumeClaim: {claimName: data-app-etcd-0}}
//	      # control-plane etcd: volume: {hostPath: {path: /var/lib}}, dataDir: etcd,
//	      # nodeName: cp-1, and restoreRunAsUser: 0 on the target
//	agents:
//	  # optional: without it, the image of the server pod's init container
//	  # agent-image, which kustomize's images: rewrites (docs/install.md)
//	  image: ghcr.io/kubectl-etcdbackup/etcdbackup-agent:v0.1.0
//	  serviceAccount: etcdbackup-agent
//	  ttlAfterFinished: 24h
//	  deadline: 2h
//	  resources:                  # the agent container's; these are the defaults
//	    requests: {cpu: 100m, memory: 128Mi}
//	    limits: {memory: 512Mi}
//	  scratchSizeLimit: 20Gi      # sizeLimit of an agent's emptyDir scratch volumes
//	  restoreNamespace: etcdbackup-restore  # hostPath restores and kit agents run here
//	limits:                       # every key is optional; these are the defaults
//	  uploadsPerLocation: 4       # users' uploads in flight to one location
//	  agentUploadsPerLocation: 4  # backup agents' uploads in flight to one location (a pool of their own)
//	  uploadIdleTimeout: 2m       # an upload that sends nothing this long is aborted
//	  maxRawSize: 17179869184     # 16 GiB: the most a backup's plain snapshot may be
//	  minTransferRate: 65536      # bytes/s an upload or download must average ...
//	  minTransferRateWindow: 60s  # ... over each window of waiting on its client
//	  maxLabels: 64               # labels of one backup
//	  maxLabelBytes: 16384        # their keys and values together
//	  maxFieldBytes: 256          # one metadata field (source description, target, ...)
//	  maxConcurrentStreams: 64    # gRPC streams of one client connection
//	  verifyScratchBytes: 19327352832  # 18 GiB: what verifies in flight may unpack together
package config

import (
	"cmp"
	"fmt"
	"os"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/yaml"

	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/kit"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/storage"
)

// Defaults of the agents section.
const (
	DefaultServiceAccount   = "etcdbackup-agent"
	DefaultTTLAfterFinished = 24 * time.Hour
	DefaultDeadline         = 2 * time.Hour
	// DefaultRestoreNamespace is where restore Jobs of hostPath members
	// run (manifests/restore-namespace/).
	DefaultRestoreNamespace = "etcdbackup-restore"
	// DefaultAgentPort is the server's agent listener, the only port of
	// its Service.
	DefaultAgentPort = "50052"
)

// File is the configuration file.
type File struct {
	// Locations in order; the first is the default. Their schema is the
	// data layer's (package storage): the plugin's --storage-config reads
	// the same list.
	Locations []storage.LocationConfig `json:"locations"`
	// Targets in order; the first is the default.
	Targets []Target `json:"targets,omitempty"`
	Agents  Agents   `json:"agents,omitempty"`
	// Authorization says how calls on the user listener are authorized.
	Authorization Authorization `json:"authorization,omitempty"`
	// Limits bound what one client can make the server hold.
	Limits Limits `json:"limits,omitempty"`
	// Replicas is the server Deployment's replica count, which the
	// install writes here: the server cannot see its Deployment, and more
	// than one replica needs storage every replica can write (Validate).
	// 0 or unset is 1.
	Replicas int `json:"replicas,omitempty"`
}

// Defaults of the limits section.
const (
	DefaultUploadsPerLocation      = 4
	DefaultAgentUploadsPerLocation = 4
	DefaultUploadIdleTimeout       = 2 * time.Minute
	// DefaultMaxRawSize is 16 GiB: twice etcd's suggested maximum
	// database size (--quota-backend-bytes, 8 GiB), and below the 20 GiB
	// scratch volumes verify and restores unpack into, so that no backup
	// the server accepts can fill one (snapshot.DefaultMaxRawSize).
	DefaultMaxRawSize = 16 << 30
	// DefaultVerifyScratchBytes (18 GiB) is what the verifies in flight
	// may unpack into the server's scratch volume together: the shipped
	// manifest gives it an emptyDir of sizeLimit 20Gi, past which the
	// kubelet evicts the pod. It holds one backup of DefaultMaxRawSize
	// that records no raw size, or two of etcd's largest recommended
	// database (8 GiB), with 2 GiB of slack.
	DefaultVerifyScratchBytes = 18 << 30
	// DefaultMinTransferRate (64 KiB/s) over DefaultMinTransferRateWindow
	// is 3.75 MiB a minute: a transfer slower than that holds a slot and
	// its buffers for hours per GiB.
	DefaultMinTransferRate       = 64 << 10
	DefaultMinTransferRateWindow = time.Minute
	DefaultMaxLabels             = 64
	DefaultMaxLabelBytes         = 16 << 10
	DefaultMaxFieldBytes         = 256
	DefaultMaxConcurrentStreams  = 64
)

// Limits bound what requests can make the server hold: memory, storage
// temp space, streams. Zero fields take their defaults (WithDefaults);
// each refusal names its key (limits.uploadsPerLocation).
type Limits struct {
	// UploadsPerLocation is how many users' uploads to one location may
	// be in flight; the next is refused with RESOURCE_EXHAUSTED. Each
	// holds a temporary file or an S3 multipart upload and its buffers.
	// Default DefaultUploadsPerLocation.
	UploadsPerLocation int `json:"uploadsPerLocation,omitempty"`
	// AgentUploadsPerLocation is the same for the server's own backup
	// agents, a pool of their own: users' uploads, however slow, never
	// make a scheduled backup fail for want of a slot.
	// Default DefaultAgentUploadsPerLocation.
	AgentUploadsPerLocation int `json:"agentUploadsPerLocation,omitempty"`
	// MaxRawSize is the most bytes a backup's plain etcd snapshot may be:
	// a plain upload over it, or a compressed or encrypted one declaring
	// more, is refused; verify unpacks a backup that records no raw size
	// to at most this. Default DefaultMaxRawSize.
	MaxRawSize int64 `json:"maxRawSize,omitempty"`
	// MinTransferRate is the bytes per second an upload or a download
	// must average over each MinTransferRateWindow of the server waiting
	// on its client (time spent on storage does not count); a slower one
	// is ended. Default DefaultMinTransferRate.
	MinTransferRate int64 `json:"minTransferRate,omitempty"`
	// MinTransferRateWindow is the window MinTransferRate is averaged
	// over. Default DefaultMinTransferRateWindow.
	MinTransferRateWindow metav1.Duration `json:"minTransferRateWindow,omitempty"`
	// UploadIdleTimeout is how long an upload may send nothing before it
	// is aborted, its name released and its buffers freed.
	// Default DefaultUploadIdleTimeout.
	UploadIdleTimeout metav1.Duration `json:"uploadIdleTimeout,omitempty"`
	// MaxLabels is the number of labels one backup may have.
	// Default DefaultMaxLabels.
	MaxLabels int `json:"maxLabels,omitempty"`
	// MaxLabelBytes bounds the bytes of one backup's label keys and
	// values together. Default DefaultMaxLabelBytes.
	MaxLabelBytes int `json:"maxLabelBytes,omitempty"`
	// MaxFieldBytes bounds each free-form metadata field of an upload:
	// the source's description and target, the etcd member name and
	// version. Default DefaultMaxFieldBytes.
	MaxFieldBytes int `json:"maxFieldBytes,omitempty"`
	// MaxConcurrentStreams is how many calls one client connection may
	// have open at once (gRPC's MaxConcurrentStreams) on the user port;
	// the agent port allows at most 8 (server.AgentMaxConcurrentStreams).
	// Default DefaultMaxConcurrentStreams.
	MaxConcurrentStreams uint32 `json:"maxConcurrentStreams,omitempty"`
	// VerifyScratchBytes is what the verifies in flight may unpack into
	// the server's scratch directory together; one that does not fit is
	// refused (ResourceExhausted). Keep it below the scratch volume's
	// size. Default DefaultVerifyScratchBytes.
	VerifyScratchBytes int64 `json:"verifyScratchBytes,omitempty"`
}

// WithDefaults returns l with the defaults of its zero fields filled in.
func (l Limits) WithDefaults() Limits {
	l.UploadsPerLocation = cmp.Or(l.UploadsPerLocation, DefaultUploadsPerLocation)
	l.AgentUploadsPerLocation = cmp.Or(l.AgentUploadsPerLocation, DefaultAgentUploadsPerLocation)
	l.UploadIdleTimeout.Duration = cmp.Or(l.UploadIdleTimeout.Duration, DefaultUploadIdleTimeout)
	l.MaxRawSize = cmp.Or(l.MaxRawSize, DefaultMaxRawSize)
	l.MinTransferRate = cmp.Or(l.MinTransferRate, DefaultMinTransferRate)
	l.MinTransferRateWindow.Duration = cmp.Or(l.MinTransferRateWindow.Duration, DefaultMinTransferRateWindow)
	l.MaxLabels = cmp.Or(l.MaxLabels, DefaultMaxLabels)
	l.MaxLabelBytes = cmp.Or(l.MaxLabelBytes, DefaultMaxLabelBytes)
	l.MaxFieldBytes = cmp.Or(l.MaxFieldBytes, DefaultMaxFieldBytes)
	l.MaxConcurrentStreams = cmp.Or(l.MaxConcurrentStreams, DefaultMaxConcurrentStreams)
	l.VerifyScratchBytes = cmp.Or(l.VerifyScratchBytes, DefaultVerifyScratchBytes)
	return l
}

// Authorization modes of the user listener.
const (
	// AuthorizationPortForward admits every call that reached the
	// server's loopback listener: RBAC `create pods/portforward` on the
	// server pod is the only check, and it is all-or-nothing.
	AuthorizationPortForward = "PortForward"
	// AuthorizationSubjectAccessReview authenticates each call's bearer
	// token with TokenReview and authorizes its verb with a
	// SubjectAccessReview on the virtual resources backups.etcdbackup.io
	// and restores.etcdbackup.io in the server's namespace.
	AuthorizationSubjectAccessReview = "SubjectAccessReview"
)

// Authorization of user calls (the plugin's, through port-forward).
type Authorization struct {
	// Mode is AuthorizationPortForward (default) or
	// AuthorizationSubjectAccessReview.
	Mode string `json:"mode,omitempty"`
}

// Target is an etcd cluster to back up and, with Members, to restore.
type Target struct {
	// Name is what clients address it by: a DNS-1123 subdomain.
	Name      string   `json:"name"`
	Endpoints []string `json:"endpoints"`
	// TLSSecret is a Secret in the server's namespace with ca.crt, tls.crt
	// and tls.key: the client certificate for etcd.
	TLSSecret string `json:"tlsSecret,omitempty"`
	// InsecurePlaintext allows http:// endpoints (no TLS).
	InsecurePlaintext bool `json:"insecurePlaintext,omitempty"`
	// Location for its backups when a request names none ("" = default).
	Location string `json:"location,omitempty"`
	// Compression when a request names none: "none" (or "") or "zstd".
	Compression string `json:"compression,omitempty"`
	// Encryption, when set, makes every backup of the target encrypted by
	// the agent before it leaves it; a request cannot turn it off.
	Encryption *Encryption `json:"encryption,omitempty"`
	// InitialClusterToken, Namespace and Members describe the cluster for
	// an in-cluster restore (`restore --target`); a target without members
	// can only be backed up.
	InitialClusterToken string `json:"initialClusterToken,omitempty"`
	// Namespace holds the members' PersistentVolumeClaims: restore Jobs
	// run there ("" = the server's namespace), and a pod there that mounts
	// a member's claim means the member runs. For hostPath members it is
	// where their pods are looked for ("" = kube-system, where kubeadm's
	// static etcd pods appear); their restore Jobs run in
	// agents.restoreNamespace.
	Namespace string   `json:"namespace,omitempty"`
	Members   []Member `json:"members,omitempty"`
	// RestoreRunAsUser and RestoreRunAsGroup are the uid and gid restore
	// agents run as, so the files they write belong to the user etcd runs
	// as (nil: 65532, the agent's own).
	RestoreRunAsUser  *int64 `json:"restoreRunAsUser,omitempty"`
	RestoreRunAsGroup *int64 `json:"restoreRunAsGroup,omitempty"`
	// Schedule is a cron expression (minute hour day-of-month month
	// day-of-week, or @hourly, @daily, @every 6h, ...): the server takes a
	// backup of the target at those times, named TARGET-YYYYMMDD-HHMMSS
	// (the scheduled time in UTC), marked scheduled in its manifest's
	// source by the server (and labelled etcdbackup.io/scheduled=true and
	// etcdbackup.io/target=TARGET, for list -l). "" takes none.
	Schedule string `json:"schedule,omitempty"`
	// TimeZone is the IANA zone Schedule is read in ("" = UTC).
	TimeZone string `json:"timeZone,omitempty"`
	// StartingDeadline is how late a scheduled run may still start (the
	// server was down, or busy, at its time); a run later than that is
	// skipped and counted as missed. Default: the schedule's period.
	StartingDeadline *metav1.Duration `json:"startingDeadline,omitempty"`
	// Retention, applied after each successful scheduled backup and by
	// `kubectl etcdbackup prune`.
	Retention *Retention `json:"retention,omitempty"`
	// CopyRetention is the retention of the target's backups in each copy
	// location of its location (by the copy location's name), applied
	// after the server copies some there. A copy location not named here
	// keeps them as Retention says; without Retention, it keeps them all.
	CopyRetention map[string]Retention `json:"copyRetention,omitempty"`
	// Drill, when set, runs restore drills of the target's newest backup
	// on a schedule: each proves a backup restores and equals the cluster
	// at its revision (docs/disaster-recovery.md).
	Drill *Drill `json:"drill,omitempty"`
	// Deltas, when set, keeps a delta agent watching the target's etcd
	// between full backups: it stores every change as delta segments
	// after the newest full backup, so that a restore can reach any
	// revision or time up to seconds ago (`restore --to-revision`,
	// `--to-time`). docs/design.md "Delta capture".
	Deltas *Deltas `json:"deltas,omitempty"`
	// Kit, when set, stores a recovery kit with every backup of the
	// target: the files a control-plane node keeps outside etcd (its
	// PKI, encryption configuration, static-pod manifests, kubeconfigs),
	// read by the backup agent on that node and encrypted there, so that
	// `restore --local --rebuild` can bring back a lost node.
	// docs/disaster-recovery.md.
	Kit *Kit `json:"kit,omitempty"`
}

// Kit is what a target's recovery kit holds and who can open it.
type Kit struct {
	// NodeName is the control-plane node whose files the kit holds: the
	// backup agent runs there.
	NodeName string `json:"nodeName"`
	// Paths are the host directories collected, whole (default
	// /etc/kubernetes, kubeadm's). Each is mounted read-only into the
	// agent; a file elsewhere is named by its directory.
	Paths []string `json:"paths,omitempty"`
	// AgeRecipients are the age public keys the kit is encrypted to,
	// required: the kit holds the cluster's CA key.
	AgeRecipients []string `json:"ageRecipients"`
}

// KitPaths are the directories k collects: Paths, or kubeadm's.
func (k Kit) KitPaths() []string {
	if len(k.Paths) == 0 {
		return kit.DefaultPaths
	}
	return k.Paths
}

// Deltas is how often a target's delta agent stores what it saw.
type Deltas struct {
	// Period is the longest a change waits before it is stored
	// (default 20s; 1s to 10m): the recovery point objective.
	Period *metav1.Duration `json:"period,omitempty"`
	// MaxBytes cuts a segment early once its events reach this size
	// (default 8 MiB; 64 KiB to 64 MiB): it bounds the agent's memory.
	MaxBytes int64 `json:"maxBytes,omitempty"`
	// CompactAfterRevisions folds the newest chain into a new full backup
	// once it holds more than this many revisions (0, the default: never;
	// at least 1000 when set): a fold agent Job restores the chain's full,
	// replays its segments, checks the result like a drill and stores it
	// as a full backup of the target, from which the next chain starts.
	// A restore to a point then replays at most about this many
	// revisions.
	CompactAfterRevisions int64 `json:"compactAfterRevisions,omitempty"`
	// IdentitySecret names a Secret in the server's namespace holding an
	// age identity file, which fold Jobs mount to decrypt an encrypted
	// target's chain; required with CompactAfterRevisions when the
	// target encrypts.
	IdentitySecret string `json:"identitySecret,omitempty"`
}

// MinCompactAfterRevisions is the least CompactAfterRevisions accepted:
// a fold is a Job that downloads and rewrites a whole backup, not
// something to run every few seconds.
const MinCompactAfterRevisions = 1000

// Defaults of Deltas.
const (
	DefaultDeltaPeriod   = 20 * time.Second
	DefaultDeltaMaxBytes = 8 << 20
)

// PeriodOrDefault is Period, or DefaultDeltaPeriod.
func (d *Deltas) PeriodOrDefault() time.Duration {
	if d.Period == nil || d.Period.Duration == 0 {
		return DefaultDeltaPeriod
	}
	return d.Period.Duration
}

// MaxBytesOrDefault is MaxBytes, or DefaultDeltaMaxBytes.
func (d *Deltas) MaxBytesOrDefault() int64 {
	if d.MaxBytes == 0 {
		return DefaultDeltaMaxBytes
	}
	return d.MaxBytes
}

// Drill is when a target's newest backup is drilled, and what a drill
// needs.
type Drill struct {
	// Schedule is a cron expression, as the target's own.
	Schedule string `json:"schedule"`
	// TimeZone is the IANA zone Schedule is read in ("" = UTC).
	TimeZone string `json:"timeZone,omitempty"`
	// IdentitySecret names a Secret in the server's namespace holding
	// the age identity files that decrypt the target's backups: an
	// encrypted target's drills need it (the identities are used only in
	// the drill agent's pod). When the server's Role lets it get the
	// Secret, a drill checks before it starts that the Secret exists and
	// holds an age identity; a missing or wrong identity ends the drill
	// as an Error (no verdict on the backup), never as Failed.
	IdentitySecret string `json:"identitySecret,omitempty"`
	// VerifiedWithin is how old the target's newest verified backup may
	// get before the PrometheusRule's EtcdBackupNotVerified alert fires
	// (exported as etcdbackup_drill_verified_within_seconds). Default:
	// three periods of the drill schedule.
	VerifiedWithin *metav1.Duration `json:"verifiedWithin,omitempty"`
}

// Retention is which of a target's backups are kept: its scheduled
// backups and the fulls its delta capture takes (chain bases, folds).
// The count rules are restic's and borg's: KeepLast keeps the newest N;
// each calendar rule keeps the newest backup of each of the newest N
// hours, days, ISO weeks, months or years (in the target's timeZone) that
// have one. A backup any count rule keeps is kept; with no count rule,
// every backup is. MaxAge then removes whatever is older, kept or not.
// The newest backup of the target, its newest verified one and the full
// its delta chain grows from are never removed.
type Retention struct {
	// KeepLast keeps the newest N backups (0: no such rule).
	KeepLast int `json:"keepLast,omitempty"`
	// KeepHourly, KeepDaily, KeepWeekly, KeepMonthly and KeepYearly keep
	// the newest backup of each of the newest N hours, days, weeks,
	// months and years that have one (0: no such rule).
	KeepHourly  int `json:"keepHourly,omitempty"`
	KeepDaily   int `json:"keepDaily,omitempty"`
	KeepWeekly  int `json:"keepWeekly,omitempty"`
	KeepMonthly int `json:"keepMonthly,omitempty"`
	KeepYearly  int `json:"keepYearly,omitempty"`
	// MaxAge removes backups older than this (0: no age limit).
	MaxAge metav1.Duration `json:"maxAge,omitempty"`
}

// Calendar says whether r has a rule counting hours, days, weeks,
// months or years, which the target's timeZone places.
func (r Retention) Calendar() bool {
	return r.KeepHourly > 0 || r.KeepDaily > 0 || r.KeepWeekly > 0 || r.KeepMonthly > 0 || r.KeepYearly > 0
}

// Counts says whether r has any count rule (KeepLast or a calendar one).
func (r Retention) Counts() bool { return r.KeepLast > 0 || r.Calendar() }

// RetentionIn is the retention of t's backups in the copy location
// called copy: its CopyRetention there, else its Retention (nil: none).
func (t Target) RetentionIn(copy string) *Retention {
	if r, ok := t.CopyRetention[copy]; ok {
		return &r
	}
	return t.Retention
}

// Encryption is how a target's backups are encrypted: age, to public keys
// only. The identities (secret keys) that decrypt them never reach the
// server; see docs/encryption.md.
type Encryption struct {
	// AgeRecipients are age public keys ("age1..." or "age1pq1..."); any
	// one of their identities decrypts a backup. Several allow key
	// rotation and a break-glass key kept offline.
	AgeRecipients []string `json:"ageRecipients"`
}

// AgeRecipients returns the public keys t's backups are encrypted to, or
// nil.
func (t Target) AgeRecipients() []string {
	if t.Encryption == nil {
		return nil
	}
	return t.Encryption.AgeRecipients
}

// EncryptionName is the API's name of t's encryption: "" or "age".
func (t Target) EncryptionName() string {
	if len(t.AgeRecipients()) == 0 {
		return ""
	}
	return "age"
}

// Member is one etcd member of a target and where its data lives.
type Member struct {
	// Name is the member's etcd --name.
	Name string `json:"name"`
	// PeerURL is its --initial-advertise-peer-urls.
	PeerURL string `json:"peerURL"`
	// ClientURL is where it serves clients; a restore is refused while it
	// answers there.
	ClientURL string `json:"clientURL,omitempty"`
	// DataDir is the member's --data-dir relative to the volume's root
	// ("" = the root itself).
	DataDir string       `json:"dataDir,omitempty"`
	Volume  MemberVolume `json:"volume"`
	// NodeName is the node of a hostPath volume.
	NodeName string `json:"nodeName,omitempty"`
}

// MemberVolume is exactly one of a PersistentVolumeClaim (in the target's
// namespace) or a host path on the member's node.
type MemberVolume struct {
	PersistentVolumeClaim *ClaimRef    `json:"persistentVolumeClaim,omitempty"`
	HostPath              *HostPathRef `json:"hostPath,omitempty"`
}

// ClaimRef names a PersistentVolumeClaim.
type ClaimRef struct {
	ClaimName string `json:"claimName"`
}

// HostPathRef is a directory on a node.
type HostPathRef struct {
	Path string `json:"path"`
}

// Agents says how agent Jobs are launched.
type Agents struct {
	// Image of the agent. Empty, the server takes the image of its own
	// pod's init container "agent-image" (the shipped Deployment has one,
	// so an overlay's kustomize images: renames it); with neither, the
	// server launches no agents.
	Image           string            `json:"image,omitempty"`
	ImagePullPolicy corev1.PullPolicy `json:"imagePullPolicy,omitempty"`
	// ServiceAccount the agents run as; it needs no permissions.
	// Default DefaultServiceAccount.
	ServiceAccount string `json:"serviceAccount,omitempty"`
	// ServerAddress is how agents reach the server's agent listener;
	// default etcdbackup.NAMESPACE.svc:50052.
	ServerAddress string `json:"serverAddress,omitempty"`
	// TTLAfterFinished keeps finished Jobs (and their logs) this long;
	// default DefaultTTLAfterFinished.
	TTLAfterFinished metav1.Duration `json:"ttlAfterFinished,omitempty"`
	// Deadline bounds one agent run; default DefaultDeadline.
	Deadline metav1.Duration `json:"deadline,omitempty"`
	// Resources are the agent container's requests and limits; nil means
	// DefaultAgentResources, {} means none.
	Resources *corev1.ResourceRequirements `json:"resources,omitempty"`
	// ScratchSizeLimit is the sizeLimit of an agent's emptyDir scratch
	// volumes (a restore's downloaded and unpacked snapshot), so a
	// runaway agent is evicted instead of filling the node's disk;
	// default DefaultScratchSizeLimit.
	ScratchSizeLimit *resource.Quantity `json:"scratchSizeLimit,omitempty"`
	// RestoreNamespace is where restore Jobs of targets with hostPath
	// members (control-plane etcd) run: a namespace whose Pod Security
	// level admits hostPath volumes, which the server's own (restricted)
	// does not. Default DefaultRestoreNamespace.
	RestoreNamespace string `json:"restoreNamespace,omitempty"`
}

// DefaultScratchSizeLimit holds a compressed and an unpacked copy of the
// largest database etcd allows (8 GiB).
var DefaultScratchSizeLimit = resource.MustParse("20Gi")

// DefaultAgentResources are an agent's requests and limits: it streams, so
// its memory stays small whatever the snapshot's size.
func DefaultAgentResources() corev1.ResourceRequirements {
	return corev1.ResourceRequirements{
		Requests: corev1.ResourceList{
			corev1.ResourceCPU:    resource.MustParse("100m"),
			corev1.ResourceMemory: resource.MustParse("128Mi"),
		},
		Limits: corev1.ResourceList{
			corev1.ResourceMemory: resource.MustParse("512Mi"),
		},
	}
}

// WithDefaults returns a with the defaults of its zero fields filled in;
// namespace is the server's own.
func (a Agents) WithDefaults(namespace string) Agents {
	if a.ServiceAccount == "" {
		a.ServiceAccount = DefaultServiceAccount
	}
	if a.ServerAddress == "" {
		a.ServerAddress = "etcdbackup." + namespace + ".svc:" + DefaultAgentPort
	}
	if a.TTLAfterFinished.Duration == 0 {
		a.TTLAfterFinished.Duration = DefaultTTLAfterFinished
	}
	if a.Deadline.Duration == 0 {
		a.Deadline.Duration = DefaultDeadline
	}
	if a.Resources == nil {
		r := DefaultAgentResources()
		a.Resources = &r
	}
	if a.ScratchSizeLimit == nil {
		q := DefaultScratchSizeLimit.DeepCopy()
		a.ScratchSizeLimit = &q
	}
	if a.RestoreNamespace == "" {
		a.RestoreNamespace = DefaultRestoreNamespace
	}
	return a
}

// Load reads and validates a configuration file. Unknown fields are
// errors: a misspelled key must not silently change where backups go.
func Load(path string) (*File, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("read config: %w", err)
	}
	var f File
	if err := yaml.UnmarshalStrict(b, &f); err != nil {
		return nil, fmt.Errorf("config %s: %w", path, err)
	}
	if errs := Validate(&f); len(errs) > 0 {
		return nil, fmt.Errorf("config %s: %w", path, errs.ToAggregate())
	}
	return &f, nil
}
