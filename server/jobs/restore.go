package jobs

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"path"
	"slices"
	"strconv"
	"strings"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/api/agentjob"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/server/config"
)

// Labels and annotations of restore Jobs, beside the backup ones.
const (
	AnnotationMember = "etcdbackup.io/member"
	// AnnotationBumpRevision is what the Job's agent adds to etcd's
	// revision (its --bump-revision), read back by ListRestores.
	AnnotationBumpRevision = "etcdbackup.io/bump-revision"

	// restoreMountPath is where the member's volume appears in the agent.
	restoreMountPath = "/var/lib/etcd-restore"
	// workMountPath is an agent's scratch space: the download of a
	// restore, the snapshot copy of a backup.
	workMountPath = "/var/lib/etcdbackup-work"
	// identityMountPath is where the age identity Secret appears: the
	// agent reads every file in it.
	identityMountPath = "/etc/etcdbackup/age-identity"

	// AnnotationToRevision and AnnotationToTime are the point a restore
	// Job replays its backup's delta chain to (one of them, or neither
	// for a restore of the backup as it is).
	AnnotationToRevision = "etcdbackup.io/to-revision"
	AnnotationToTime     = "etcdbackup.io/to-time"
	// AnnotationToMinRevision goes with AnnotationToTime when the plan
	// knows a revision committed by the time that replay must reach
	// whatever the segments' stamps say (delta.Point.MinRevision).
	AnnotationToMinRevision = "etcdbackup.io/to-min-revision"
	// AnnotationDeltaSegments holds the delta segments a restore to a
	// point replays, in order, each pinned to its SHA-256: JSON of
	// [{"name","sha256"}] (EncodeSegments). A long chain does not fit in
	// args, so the pod reads it as a file (segmentsMountPath) through the
	// downward API, and the agent port lets the Job download exactly these.
	AnnotationDeltaSegments = "etcdbackup.io/delta-segments"
	// maxSegmentsBytes bounds AnnotationDeltaSegments: all of an object's
	// annotations together may take 256 KiB, and the Job carries others.
	maxSegmentsBytes = 200 << 10

	// segmentsMountPath is where the downward API shows the segment list.
	segmentsMountPath = "/etc/etcdbackup/delta-segments"
	segmentsFile      = "segments.json"
)

// SegmentPin is one delta segment a restore to a point replays: the
// agent downloads only this content under this name. A JSON list of
// them is what etcdbackup-agent restore --segments-file reads.
type SegmentPin = agentjob.Ref

// ErrTooManySegments is EncodeSegments' refusal of a list that does not
// fit in an annotation.
var ErrTooManySegments = errors.New("the delta segment list does not fit in a Job annotation")

// EncodeSegments is segs as AnnotationDeltaSegments holds them.
func EncodeSegments(segs []SegmentPin) (string, error) {
	if segs == nil {
		segs = []SegmentPin{}
	}
	b, err := json.Marshal(segs)
	if err != nil {
		return "", err
	}
	if len(b) > maxSegmentsBytes {
		return "", fmt.Errorf("%w: %d segments take %d bytes, at most %d fit", ErrTooManySegments, len(segs), len(b), maxSegmentsBytes)
	}
	return string(b), nil
}

// DecodeSegments reads AnnotationDeltaSegments; "" is no segments.
func DecodeSegments(s string) ([]SegmentPin, error) {
	if s == "" {
		return nil, nil
	}
	var out []SegmentPin
	if err := json.Unmarshal([]byte(s), &out); err != nil {
		return nil, fmt.Errorf("annotation %s: %w", AnnotationDeltaSegments, err)
	}
	for _, p := range out {
		if p.Name == "" || p.SHA256 == "" {
			return nil, fmt.Errorf("annotation %s: a segment without a name or SHA-256", AnnotationDeltaSegments)
		}
	}
	return out, nil
}

// segmentsDigest is the SHA-256 (hex) of an AnnotationDeltaSegments
// value: what the agent checks the file it reads against, from args that
// no one can change in a running pod (annotations they can).
func segmentsDigest(annotation string) string {
	sum := sha256.Sum256([]byte(annotation))
	return hex.EncodeToString(sum[:])
}

// DescribeVolume says where m's data lives, for people.
func DescribeVolume(m config.Member) string {
	if c := m.Volume.PersistentVolumeClaim; c != nil {
		return "pvc/" + c.ClaimName
	}
	if h := m.Volume.HostPath; h != nil {
		return "hostPath " + m.NodeName + ":" + h.Path
	}
	return ""
}

// dataDirIn is m's --data-dir as the restore agent sees it.
func dataDirIn(m config.Member) string {
	return path.Join(restoreMountPath, m.DataDir)
}

// hostPathTarget says whether t's members keep their data on their nodes
// (config validation keeps a target's members all one kind).
func hostPathTarget(t config.Target) bool {
	return len(t.Members) > 0 && t.Members[0].Volume.HostPath != nil
}

// RestoreNamespace is where the restore Jobs of t run: beside its
// members' claims, or for hostPath members in agents.restoreNamespace,
// whose Pod Security level admits hostPath volumes (the server's
// namespace enforces "restricted", which forbids them). A target with a
// recovery kit is a control plane's (config refuses one with claims):
// its kit agents read the node there too.
func (l *Launcher) RestoreNamespace(t config.Target) string {
	switch {
	case hostPathTarget(t) || t.Kit != nil:
		return l.agents.RestoreNamespace
	case t.Namespace != "":
		return t.Namespace
	}
	return l.namespace
}

// MemberNamespace is where pods that use t's member volumes are
// looked for: the claims' namespace, or for hostPath members the
// target's namespace, by default kube-system (kubeadm's static etcd pods).
func (l *Launcher) MemberNamespace(t config.Target) string {
	switch {
	case !hostPathTarget(t):
		return l.RestoreNamespace(t)
	case t.Namespace != "":
		return t.Namespace
	}
	return metav1.NamespaceSystem
}

// MemberPods returns, for each member of t, the pods ("NAMESPACE/NAME")
// that the API shows using its volume and that have not terminated: a pod
// that mounts the member's claim, or for a hostPath member a pod on its
// node with a hostPath volume at, above or below the member's data
// directory. The server's own restore agents do not count. A pod being
// deleted still counts: its etcd may still be writing.
func (l *Launcher) MemberPods(ctx context.Context, t config.Target) (map[string][]string, error) {
	ns := l.MemberNamespace(t)
	list, err := l.client.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, fmt.Errorf("list pods in namespace %s: %w", ns, err)
	}
	out := map[string][]string{}
	for i := range list.Items {
		p := &list.Items[i]
		if p.Status.Phase == corev1.PodSucceeded || p.Status.Phase == corev1.PodFailed ||
			(p.Labels[LabelManagedBy] == managedBy && p.Labels[LabelComponent] == ComponentRestore) {
			continue
		}
		for _, m := range t.Members {
			if usesVolume(p, m) {
				out[m.Name] = append(out[m.Name], p.Namespace+"/"+p.Name)
			}
		}
	}
	return out, nil
}

// usesVolume says whether pod p mounts m's data.
func usesVolume(p *corev1.Pod, m config.Member) bool {
	for _, v := range p.Spec.Volumes {
		switch {
		case m.Volume.PersistentVolumeClaim != nil:
			if v.PersistentVolumeClaim != nil && v.PersistentVolumeClaim.ClaimName == m.Volume.PersistentVolumeClaim.ClaimName {
				return true
			}
		case m.Volume.HostPath != nil:
			if v.HostPath != nil && p.Spec.NodeName == m.NodeName &&
				pathsOverlap(v.HostPath.Path, path.Join(m.Volume.HostPath.Path, m.DataDir)) {
				return true
			}
		}
	}
	return false
}

// pathsOverlap says whether one of two absolute paths is the other or
// lies below it.
func pathsOverlap(a, b string) bool {
	a, b = path.Clean(a), path.Clean(b)
	within := func(x, dir string) bool { return x == dir || dir == "/" || strings.HasPrefix(x, dir+"/") }
	return within(a, b) || within(b, a)
}

// RestoreNamespaces are the namespaces the restore Jobs of targets run
// in, each once: where agent tokens of restore agents come from.
func (l *Launcher) RestoreNamespaces(targets []config.Target) []string {
	var out []string
	for _, t := range targets {
		if ns := l.RestoreNamespace(t); !slices.Contains(out, ns) {
			out = append(out, ns)
		}
	}
	return out
}

// TargetNamespaces maps the name of each of targets to the namespace its
// restore Jobs run in (RestoreNamespace).
func (l *Launcher) TargetNamespaces(targets []config.Target) map[string]string {
	out := make(map[string]string, len(targets))
	for _, t := range targets {
		out[t.Name] = l.RestoreNamespace(t)
	}
	return out
}

// InitialCluster is NAME=PEER-URL,... of every member of t.
func InitialCluster(t config.Target) string {
	parts := make([]string, 0, len(t.Members))
	for _, m := range t.Members {
		parts = append(parts, m.Name+"="+m.PeerURL)
	}
	return strings.Join(parts, ",")
}

// RestoreSpec is one restore of a target from a backup.
type RestoreSpec struct {
	Name, Location string
	Target         config.Target
	MoveAside      bool
	// IdentitySecret names a Secret in the members' namespace holding age
	// identity files, for an encrypted backup. Only its name and mount
	// path appear in the Job: the keys reach the agent as files.
	IdentitySecret string
	// SHA256 is the stored backup's SHA-256 when the restore starts: the
	// agent restores only a download with exactly this hash, so a backup
	// replaced under the same name meanwhile is refused.
	SHA256 string
	// BumpRevision is what each member's agent adds to etcd's revision,
	// marking the result compacted when above 0; the same for every
	// member, so their revisions agree. The caller resolves the default:
	// the Job always carries the value, so the agent's default never
	// decides.
	BumpRevision int64
	// ToRevision or ToTime, when set, restore to a point: the agent
	// replays Segments (the backup's delta chain, in order) onto the
	// backup and stops there. AllowLeaseLoss restores keys whose lease's
	// TTL was never read instead of refusing.
	ToRevision int64
	ToTime     time.Time
	// ToMinRevision goes with ToTime: see delta.Point.MinRevision.
	ToMinRevision  int64
	Segments       []SegmentPin
	AllowLeaseLoss bool
	// SnapshotBytes is the size of the plain snapshot restored (with a
	// point, the full's and the segments' together), which sizes the
	// agents' memory limit (sizeMemoryFor); 0 if unknown.
	SnapshotBytes int64
}

// ToPoint says whether spec restores to a point.
func (spec RestoreSpec) ToPoint() bool { return spec.ToRevision > 0 || !spec.ToTime.IsZero() }

// RestoreJobName is the Job that restores member of target from backup
// (location, name): one per member and backup.
func RestoreJobName(location, name, target, member string) string {
	return agentjob.Restore.JobName(member, runID(location, name, target, member))
}

// StartRestore creates one restore agent Job per member of spec.Target.
// Finished Jobs of an earlier attempt are replaced; if any is still
// running, nothing is created and ErrRunning is returned. Whether one
// runs is asked of the API, not the cache: it decides deletes.
func (l *Launcher) StartRestore(ctx context.Context, spec RestoreSpec) ([]*batchv1.Job, error) {
	ns := l.namespaceOf(agentjob.Restore, spec.Target)
	jobs := l.client.BatchV1().Jobs(ns)
	var want []*batchv1.Job
	for _, m := range spec.Target.Members {
		j, err := l.restoreJob(spec, m)
		if err != nil {
			return nil, err
		}
		want = append(want, j)
	}
	old := map[string]*batchv1.Job{}
	for _, j := range want {
		o, err := jobs.Get(ctx, j.Name, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("get existing job %s: %w", j.Name, err)
		}
		if phase, _ := l.phase(o); phase == PhaseRunning && o.DeletionTimestamp == nil {
			return nil, runningErr(o)
		}
		old[j.Name] = o
	}
	if err := l.ensureServerCA(ctx, ns); err != nil {
		return nil, err
	}
	var out []*batchv1.Job
	for _, j := range want {
		if o := old[j.Name]; o != nil {
			if err := l.replace(ctx, o); err != nil {
				return nil, err
			}
		}
		made, err := l.createWhenGone(ctx, j)
		if err != nil {
			return nil, fmt.Errorf("create restore job for member %q: %w", j.Annotations[AnnotationMember], err)
		}
		if made, err = l.sign(ctx, made); err != nil {
			return nil, err
		}
		l.await(ctx, made.Namespace, made.Name, signedVersion(made))
		out = append(out, made)
	}
	return out, nil
}

func (l *Launcher) restoreJob(spec RestoreSpec, m config.Member) (*batchv1.Job, error) {
	t := spec.Target
	pod := restorePod(spec, m, l.conn())
	if spec.IdentitySecret != "" {
		pod.addIdentity(spec.IdentitySecret)
	}
	ann := map[string]string{
		AnnotationBackup: spec.Name, AnnotationLocation: spec.Location, AnnotationTarget: t.Name, AnnotationMember: m.Name,
		AnnotationSHA256: spec.SHA256, AnnotationBumpRevision: strconv.FormatInt(spec.BumpRevision, 10),
	}
	if spec.ToPoint() {
		point, err := pod.addPoint(spec)
		if err != nil {
			return nil, err
		}
		maps.Copy(ann, point)
	}
	job := l.agentJob(jobMeta{
		name: RestoreJobName(spec.Location, spec.Name, t.Name, m.Name), namespace: l.namespaceOf(agentjob.Restore, t),
		run: runID(spec.Location, spec.Name, t.Name, m.Name), annotations: ann,
	}, restoreSecurityContext(t), pod.flags, pod.volumes, pod.mounts)
	job.Spec.Template.Spec.NodeName = m.NodeName
	l.sizeMemoryFor(job, spec.SnapshotBytes)
	return job, nil
}

// restoreAgentPod is what a restore agent's container is given: its
// flags, and the volumes with where they are mounted.
type restoreAgentPod struct {
	flags   agentjob.RestoreFlags
	volumes []corev1.Volume
	mounts  []corev1.VolumeMount
}

// restorePod is member m's restore agent for spec, reaching the server by
// conn: the flags of a plain restore, the member's data volume and a
// scratch volume.
func restorePod(spec RestoreSpec, m config.Member, conn agentjob.Conn) *restoreAgentPod {
	t := spec.Target
	flags := agentjob.RestoreFlags{
		Conn: conn, Name: spec.Name, Location: spec.Location,
		DataDir: dataDirIn(m), WorkDir: workMountPath + "/download",
		MemberName: m.Name, InitialCluster: InitialCluster(t), InitialAdvertisePeerURLs: []string{m.PeerURL},
		SHA256: spec.SHA256, BumpRevision: spec.BumpRevision,
		InitialClusterToken: t.InitialClusterToken, MoveAside: spec.MoveAside,
	}
	data := corev1.Volume{Name: "data"}
	if c := m.Volume.PersistentVolumeClaim; c != nil {
		data.PersistentVolumeClaim = &corev1.PersistentVolumeClaimVolumeSource{ClaimName: c.ClaimName}
	} else if h := m.Volume.HostPath; h != nil {
		data.HostPath = &corev1.HostPathVolumeSource{Path: h.Path, Type: ptr.To(corev1.HostPathDirectoryOrCreate)}
	}
	return &restoreAgentPod{
		flags:   flags,
		volumes: []corev1.Volume{data, {Name: "work", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}}},
		mounts:  []corev1.VolumeMount{{Name: "data", MountPath: restoreMountPath}, {Name: "work", MountPath: workMountPath}},
	}
}

// restoreSecurityContext is the agent's, run as the target's restore user
// and group when it names them.
func restoreSecurityContext(t config.Target) *corev1.PodSecurityContext {
	sc := agentSecurityContext()
	if t.RestoreRunAsUser != nil {
		sc.RunAsUser = t.RestoreRunAsUser
		sc.RunAsNonRoot = ptr.To(*t.RestoreRunAsUser != 0)
	}
	if t.RestoreRunAsGroup != nil {
		sc.RunAsGroup, sc.FSGroup = t.RestoreRunAsGroup, t.RestoreRunAsGroup
	}
	return sc
}

// addIdentity mounts the age identities of Secret secret for decryption.
// The volume is optional: the server may not read Secrets in the members'
// namespace to check it, and a missing one would hold the pod in
// ContainerCreating until the Job's deadline; so the pod starts with an
// empty directory and the agent fails at once, before it touches the
// member's data, saying that the restore's --identity-secret is missing
// and how to create it.
func (p *restoreAgentPod) addIdentity(secret string) {
	p.flags.IdentityDir = identityMountPath
	p.volumes = append(p.volumes, corev1.Volume{Name: "age-identity", VolumeSource: corev1.VolumeSource{
		// Readable by the agent's group (fsGroup) only.
		Secret: &corev1.SecretVolumeSource{SecretName: secret, DefaultMode: ptr.To[int32](0o440), Optional: ptr.To(true)},
	}})
	p.mounts = append(p.mounts, corev1.VolumeMount{Name: "age-identity", MountPath: identityMountPath, ReadOnly: true})
}

// addPoint makes the restore one to spec's point: the point and the delta
// segments that reach it as flags and a mounted file. It returns the
// annotations that record them on the Job and its pod.
func (p *restoreAgentPod) addPoint(spec RestoreSpec) (map[string]string, error) {
	segs, err := EncodeSegments(spec.Segments)
	if err != nil {
		return nil, err
	}
	point := map[string]string{AnnotationDeltaSegments: segs}
	if spec.ToRevision > 0 {
		point[AnnotationToRevision] = strconv.FormatInt(spec.ToRevision, 10)
		p.flags.ToRevision = spec.ToRevision
	} else {
		point[AnnotationToTime] = spec.ToTime.UTC().Format(time.RFC3339Nano)
		p.flags.ToTime = point[AnnotationToTime]
		if spec.ToMinRevision > 0 {
			point[AnnotationToMinRevision] = strconv.FormatInt(spec.ToMinRevision, 10)
			p.flags.ToMinRevision = spec.ToMinRevision
		}
	}
	// The list reaches the agent as a file of the pod's annotation;
	// its digest in args, which no one can edit in a running pod,
	// makes the agent refuse an edited one.
	p.flags.SegmentsFile, p.flags.SegmentsSHA256 = path.Join(segmentsMountPath, segmentsFile), segmentsDigest(segs)
	p.flags.AllowLeaseLoss = spec.AllowLeaseLoss
	p.volumes = append(p.volumes, corev1.Volume{Name: "delta-segments", VolumeSource: corev1.VolumeSource{DownwardAPI: &corev1.DownwardAPIVolumeSource{
		Items: []corev1.DownwardAPIVolumeFile{{
			Path:     segmentsFile,
			FieldRef: &corev1.ObjectFieldSelector{FieldPath: "metadata.annotations['" + AnnotationDeltaSegments + "']"},
		}},
	}}})
	p.mounts = append(p.mounts, corev1.VolumeMount{Name: "delta-segments", MountPath: segmentsMountPath, ReadOnly: true})
	return point, nil
}

// MemberRun is what the cluster says about one member's restore agent.
type MemberRun struct {
	Member  string
	JobName string
	Phase   Phase
	Message string
	// BumpRevision is what the agent adds to etcd's revision, from the
	// Job's annotation; 0 for a Job without it (made before restores
	// bumped, whose agent did not).
	BumpRevision int64
}

// restoreJobs returns the restore agent Jobs of namespace ns, from the
// cache.
func (l *Launcher) restoreJobs(ns string) ([]*batchv1.Job, error) {
	nc, err := l.watched(ns)
	if err != nil {
		return nil, err
	}
	list, err := nc.jobList(selectorOf(agentjob.Restore))
	if err != nil {
		return nil, fmt.Errorf("list restore jobs in namespace %s: %w", ns, err)
	}
	return list, nil
}

// ListRestores returns the restore agent runs of backup (location, name)
// into target, keyed by member name.
func (l *Launcher) ListRestores(ctx context.Context, location, name string, target config.Target) (map[string]MemberRun, error) {
	list, err := l.restoreJobs(l.RestoreNamespace(target))
	if err != nil {
		return nil, err
	}
	out := map[string]MemberRun{}
	for _, j := range list {
		a := j.Annotations
		if !l.Signed(j) {
			continue // not the server's: someone else's Job with its labels
		}
		if j.DeletionTimestamp != nil || a[AnnotationBackup] != name || a[AnnotationLocation] != location || a[AnnotationTarget] != target.Name {
			continue
		}
		phase, msg := l.phase(j)
		bump, _ := strconv.ParseInt(a[AnnotationBumpRevision], 10, 64)
		out[a[AnnotationMember]] = MemberRun{Member: a[AnnotationMember], JobName: j.Name, Phase: phase, Message: msg, BumpRevision: bump}
	}
	return out, nil
}

// RunningRestores returns "NAMESPACE/NAME" of every restore Job, in the
// restore namespace of any of targets, that reads backup (location, name)
// and has not finished: while one runs, the backup must stay.
func (l *Launcher) RunningRestores(ctx context.Context, location, name string, targets []config.Target) ([]string, error) {
	var out []string
	for _, ns := range l.RestoreNamespaces(targets) {
		list, err := l.restoreJobs(ns)
		if err != nil {
			return nil, err
		}
		for _, j := range list {
			// Only the server's own Jobs hold a backup: a forged one
			// (labels copied, no valid signature) must not block delete.
			if j.Annotations[AnnotationBackup] == name && j.Annotations[AnnotationLocation] == location &&
				JobPhase(j) == PhaseRunning && l.refusal(j) == "" && l.Signed(j) {
				out = append(out, j.Namespace+"/"+j.Name)
			}
		}
	}
	return out, nil
}
