package auth

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"

	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/api/agentjob"
	ebv1 "github.com/kubectl-etcdbackup/kubectl-etcdbackup/api/etcdbackup/v1"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/server/jobs"
)

// AgentAudience is the audience the agent listener accepts tokens for:
// the one the agent pods' projected token is minted with.
const AgentAudience = jobs.TokenAudience

// The methods the agent listener serves, and for whom.
const (
	MethodUploadBackup   = ebv1.BackupService_UploadBackup_FullMethodName
	MethodDownloadBackup = ebv1.BackupService_DownloadBackup_FullMethodName
	MethodGetServerInfo  = ebv1.InfoService_GetServerInfo_FullMethodName
	// MethodGetBackup: a delta agent asks where its chain stands, a kit
	// agent whether its backup is stored.
	MethodGetBackup = ebv1.BackupService_GetBackup_FullMethodName
	// MethodGetDeltaLease and MethodPutDeltaLease: a delta agent holds
	// its own target's delta Lease through the server.
	MethodGetDeltaLease = ebv1.AgentService_GetDeltaLease_FullMethodName
	MethodPutDeltaLease = ebv1.AgentService_PutDeltaLease_FullMethodName
)

// spec is a's kind's row.
func (a *Agent) spec() agentjob.Spec { return agentjob.Of(a.Kind) }

// Downloads says whether a's kind reads a backup (agentjob.Spec.Downloads):
// restore and drill agents, each only the one its Job pins, and fold
// agents, only the chain theirs pins.
func (a *Agent) Downloads() bool { return a.spec().Downloads }

// Uploads says whether a's kind stores backups (agentjob.Spec.Uploads):
// backup and fold agents, each only the one its Job names, and delta
// agents, only their chain's segments.
func (a *Agent) Uploads() bool { return a.spec().Uploads }

// The kinds that may upload, download and hold a delta Lease, named for
// messages.
var (
	uploaders    = kindsThat(func(k agentjob.Spec) bool { return k.Uploads })
	downloaders  = kindsThat(func(k agentjob.Spec) bool { return k.Downloads })
	deltaWriters = kindsThat(func(k agentjob.Spec) bool { return k.DeltaWriter })
	readers      = kindsThat(func(k agentjob.Spec) bool { return k.ReadsRecord })
)

// kindsThat names the kinds of agent whose row has can, for messages:
// "backup, delta and fold".
func kindsThat(can func(agentjob.Spec) bool) string { return kindList("and", "", can) }

// kindList names the kinds of agent whose row has can, each followed by
// suffix, the last two joined by conj.
func kindList(conj, suffix string, can func(agentjob.Spec) bool) string {
	var names []string
	for _, k := range agentjob.Kinds {
		if can(k) {
			names = append(names, string(k.Kind)+suffix)
		}
	}
	if len(names) < 2 {
		return strings.Join(names, "")
	}
	return strings.Join(names[:len(names)-1], ", ") + " " + conj + " " + names[len(names)-1]
}

// Agent is the caller on the agent listener, as the guard established it
// from the API server: the Job its pod belongs to and what that Job was
// created for. Handlers hold the call to exactly this.
type Agent struct {
	// Kind is the kind of its Job, one of agentjob.Kinds.
	Kind agentjob.Kind
	// JobNamespace and JobName name the agent's Job.
	JobNamespace, JobName string
	// Backup and Location are the backup the Job works on (the location
	// by its resolved name), Target the etcd target's name.
	Backup, Location, Target string
	// SHA256 is the stored backup a restore or drill Job was started
	// for; empty for the kinds that pin none.
	SHA256 string
	// Scheduled is a backup Job the server's schedule started: its
	// upload is stored as a scheduled backup of Target.
	Scheduled bool
	// Pod is the calling pod's name: a delta agent's Lease holder
	// identity starts with it. Node is the node it runs on: a kit
	// agent's must be its kit's.
	Pod, Node string
	// Segments are the delta segments a restore to a point replays, by
	// name, each with the SHA-256 it must have: from its Job's signed
	// annotation, the only other things it may download.
	Segments map[string]string
	// Inputs are what a fold agent may download (its Job's signed
	// jobs.AnnotationFoldInputs): backup or segment name to the stored
	// SHA-256 it must have.
	Inputs map[string]string
}

// MayDownload says what a downloading agent may read under name in
// location: the SHA-256 the content must have, or a PermissionDenied
// error. That is its Job's backup, or one of the delta segments its Job
// lists.
func (a *Agent) MayDownload(name, location string) (string, error) {
	if !a.Downloads() {
		return "", status.Errorf(codes.PermissionDenied, "%s may not download: only %s may", a,
			kindList("and", " agents", func(k agentjob.Spec) bool { return k.Downloads }))
	}
	if location != a.Location {
		return "", status.Errorf(codes.PermissionDenied, "%s may download only from location %q, not %q", a, a.Location, location)
	}
	if a.Kind == agentjob.Fold {
		if sha, ok := a.Inputs[name]; ok && sha != "" {
			return sha, nil
		}
		return "", status.Errorf(codes.PermissionDenied, "%s may download only the chain it folds (%d backups and segments), not %q", a, len(a.Inputs), name)
	}
	if name == a.Backup {
		return a.SHA256, nil
	}
	if sha, ok := a.Segments[name]; ok {
		return sha, nil
	}
	if len(a.Segments) > 0 {
		return "", status.Errorf(codes.PermissionDenied, "%s may download only backup %q and the %d delta segments its Job lists, not %q", a, a.Backup, len(a.Segments), name)
	}
	return "", status.Errorf(codes.PermissionDenied, "%s may download only backup %q in location %q, not %q in location %q", a, a.Backup, a.Location, name, location)
}

type agentKey struct{}

// WithAgent returns ctx carrying a.
func WithAgent(ctx context.Context, a *Agent) context.Context {
	return context.WithValue(ctx, agentKey{}, a)
}

// AgentFrom returns the agent the guard admitted, if the call came
// through the agent listener.
func AgentFrom(ctx context.Context) (*Agent, bool) {
	a, ok := ctx.Value(agentKey{}).(*Agent)
	return a, ok && a != nil
}

// AgentGuardConfig is what NewAgentGuard needs.
type AgentGuardConfig struct {
	// Client makes TokenReviews (unless Reviews.Client is set) and reads
	// the Pods and Jobs the caches (Pods, Jobs) cannot tell about, or all
	// of them without caches (unless Lookups.Client is set).
	Client kubernetes.Interface
	// Namespace is the server's own, where the Jobs of every kind but
	// restores run.
	Namespace string
	// RestoreNamespaces are where restore Jobs run (the targets' restore
	// namespaces); the server's namespace is always one.
	RestoreNamespaces []string
	// ServiceAccount is the agents' (config.Agents.ServiceAccount).
	ServiceAccount string
	// Reviews bounds the TokenReviews (agentreview.go).
	Reviews AgentReviews
	// Pods and Jobs, when set, are caches of the agent pods and Jobs
	// (the Launcher's informers, InformerListers): a call is then
	// checked against them at no cost to the API server, and a token
	// that names a pod the cache does not have is refused before any
	// review. Nil reads each from the API server, within Lookups.
	Pods PodLister
	Jobs JobLister
	// Lookups bounds the reads of pods and Jobs from the API server
	// (objects.go).
	Lookups AgentLookups
	// Signer checks that a Job is one the server created
	// (jobs.Launcher.Signer): its signature fits what it says it is.
	Signer JobVerifier
	// TargetNamespaces maps each target's name to the namespace its
	// restore Jobs run in (jobs.Launcher.RestoreNamespace): a restore
	// Job elsewhere is refused.
	TargetNamespaces map[string]string
}

// JobVerifier checks that a Job carries the server's signature of what
// it says it is: a jobs.Signer, or the jobs.Launcher, whose key follows
// its Secret (rotated, or removed by a restore of the cluster).
type JobVerifier interface {
	Verify(j *batchv1.Job) error
}

// AgentGuard admits a call on the agent listener only from a pod of an
// agent Job the server created and that has not finished, and only for
// the method that Job's kind needs. See NewAgentGuard.
type AgentGuard struct {
	cfg      AgentGuardConfig
	reviewer *agentReviewer
	objects  *agentObjects
}

var _ Guard = (*AgentGuard)(nil)

// NewAgentGuard returns the agent listener's Guard. Every call must carry
// a pod-bound ServiceAccount token for AgentAudience, of cfg's
// ServiceAccount in the server's namespace or a restore namespace, whose
// pod still exists and is controlled by a Job the server created (its
// signature, cfg.Signer, fits the Job's namespace, name, UID and what
// it is for), in the namespace its kind and target run in, not finished.
// What a kind may call is its row of agentjob.Kinds: UploadBackup
// (Uploads), DownloadBackup (Downloads), GetBackup (ReadsRecord), the
// delta Lease (DeltaWriter); every kind GetServerInfo. The handlers then hold each
// call to the Job's own backup (AgentFrom).
func NewAgentGuard(cfg AgentGuardConfig) (*AgentGuard, error) {
	switch {
	case cfg.Client == nil:
		return nil, errors.New("agent guard: no Kubernetes client")
	case cfg.Namespace == "":
		return nil, errors.New("agent guard: the server's namespace is unknown")
	case cfg.ServiceAccount == "":
		return nil, errors.New("agent guard: the agents' ServiceAccount is not set")
	case cfg.Signer == nil:
		return nil, errors.New("agent guard: no Job signer, so no Job could be told from a forged one")
	}
	if !slices.Contains(cfg.RestoreNamespaces, cfg.Namespace) {
		cfg.RestoreNamespaces = append(slices.Clone(cfg.RestoreNamespaces), cfg.Namespace)
	}
	r := newAgentReviewer(cfg)
	return &AgentGuard{cfg: cfg, reviewer: r, objects: newAgentObjects(cfg, r.now)}, nil
}

// Admit implements Guard.
func (g *AgentGuard) Admit(ctx context.Context, fullMethod string) (context.Context, error) {
	switch fullMethod {
	case MethodUploadBackup, MethodDownloadBackup, MethodGetServerInfo, MethodGetBackup, MethodGetDeltaLease, MethodPutDeltaLease:
	default:
		return nil, status.Errorf(codes.PermissionDenied,
			"%s: the agent port serves only UploadBackup (%s agents), DownloadBackup (%s agents), GetBackup (%s agents), GetDeltaLease and PutDeltaLease (%s agents) and GetServerInfo; users reach the server through `kubectl etcdbackup` (port-forward)",
			fullMethod, uploaders, downloaders, readers, deltaWriters)
	}
	token, err := BearerToken(ctx)
	if err != nil {
		return nil, err
	}
	claims, err := g.reviewer.precheck(token, []string{AgentAudience}, g.reviewer.now())
	if err != nil {
		return nil, err
	}
	// Anyone can write a token that names a pod; the pod cache says at
	// no cost whether the server started such a pod. A token of any
	// other pod would be refused after its review, so it gets none, and
	// forged tokens cannot take the reviews real agents need.
	pod, known := g.objects.cachedPod(claims.namespace, claims.pod)
	if known && (pod == nil || string(pod.UID) != claims.podUID) {
		return nil, status.Errorf(codes.Unauthenticated,
			"the bearer token names pod %q (uid %q), which is unknown to the server: no pod of an agent Job it started has that name and uid; agents send their own pod's projected ServiceAccount token",
			claims.namespace+"/"+claims.pod, claims.podUID)
	}
	user, err := g.reviewer.authenticate(ctx, token, claims, known)
	if err != nil {
		return nil, err
	}
	a, err := g.agent(ctx, user.Username, user.Extra[ExtraPodName], user.Extra[ExtraPodUID])
	if err != nil {
		return nil, err
	}
	kind := a.spec()
	switch {
	case fullMethod == MethodUploadBackup && !kind.Uploads:
		return nil, status.Errorf(codes.PermissionDenied, "job %s/%s is a %s agent; only %s agents may upload", a.JobNamespace, a.JobName, a.Kind, uploaders)
	case fullMethod == MethodGetBackup && !kind.ReadsRecord:
		return nil, status.Errorf(codes.PermissionDenied, "job %s/%s is a %s agent; only %s agents may read a backup's record", a.JobNamespace, a.JobName, a.Kind, readers)
	case (fullMethod == MethodGetDeltaLease || fullMethod == MethodPutDeltaLease) && !kind.DeltaWriter:
		return nil, status.Errorf(codes.PermissionDenied, "job %s/%s is a %s agent; only %s agents hold a delta Lease", a.JobNamespace, a.JobName, a.Kind, deltaWriters)
	case fullMethod == MethodDownloadBackup && !kind.Downloads:
		return nil, status.Errorf(codes.PermissionDenied, "job %s/%s is a %s agent; only %s agents may download", a.JobNamespace, a.JobName, a.Kind, downloaders)
	}
	return WithAgent(ctx, a), nil
}

// agent finds the agent Job behind an authenticated token's user.
func (g *AgentGuard) agent(ctx context.Context, username string, podName, podUID []string) (*Agent, error) {
	ns, sa, ok := strings.Cut(strings.TrimPrefix(username, "system:serviceaccount:"), ":")
	if !ok || !strings.HasPrefix(username, "system:serviceaccount:") {
		return nil, status.Errorf(codes.PermissionDenied, "%q is not a ServiceAccount; only agent pods (ServiceAccount %s) may call the agent port", username, g.cfg.ServiceAccount)
	}
	if sa != g.cfg.ServiceAccount || !slices.Contains(g.cfg.RestoreNamespaces, ns) {
		return nil, status.Errorf(codes.PermissionDenied,
			"ServiceAccount %s/%s is not the agents' (ServiceAccount %q in namespace %s, or a restore namespace %v)",
			ns, sa, g.cfg.ServiceAccount, g.cfg.Namespace, g.cfg.RestoreNamespaces)
	}
	if len(podName) != 1 || len(podUID) != 1 || podName[0] == "" || podUID[0] == "" {
		return nil, status.Errorf(codes.PermissionDenied,
			"the token of %s is not a pod-bound token (no pod name and uid in it): agents must send their projected ServiceAccount token", username)
	}
	pod, err := g.pod(ctx, ns, podName[0])
	if apierrors.IsNotFound(err) {
		return nil, status.Errorf(codes.PermissionDenied, "the token's pod %s/%s does not exist", ns, podName[0])
	}
	if err != nil {
		return nil, unavailable(err, "cannot check the caller's pod %s/%s", ns, podName[0])
	}
	switch {
	case string(pod.UID) != podUID[0]:
		return nil, status.Errorf(codes.PermissionDenied, "the token is bound to pod %s/%s uid %s, which is gone (that name now has uid %s)", ns, pod.Name, podUID[0], pod.UID)
	case pod.DeletionTimestamp != nil:
		return nil, status.Errorf(codes.PermissionDenied, "pod %s/%s is being deleted", ns, pod.Name)
	case pod.Spec.ServiceAccountName != sa:
		return nil, status.Errorf(codes.PermissionDenied, "pod %s/%s runs as ServiceAccount %q, not the token's %q", ns, pod.Name, pod.Spec.ServiceAccountName, sa)
	}
	ref := metav1.GetControllerOf(pod)
	if ref == nil || ref.Kind != "Job" || !strings.HasPrefix(ref.APIVersion, batchv1.GroupName+"/") {
		return nil, status.Errorf(codes.PermissionDenied, "pod %s/%s is not controlled by a Job, so it is not an agent the server started", ns, pod.Name)
	}
	if job, ok := g.objects.cachedJob(ns, ref.Name); ok && job != nil {
		a, err := g.agentOfPod(pod, ref, job)
		// A Job is created, then signed: a cached copy may be the one
		// before. Only a refusal a newer copy could turn round is worth
		// a read from the API server.
		if err == nil || (job.UID == ref.UID && g.cfg.Signer.Verify(job) == nil) {
			return a, err
		}
	}
	job, err := g.objects.getJob(ctx, ns, ref.Name)
	if apierrors.IsNotFound(err) {
		return nil, status.Errorf(codes.PermissionDenied, "pod %s/%s belongs to Job %s, which does not exist", ns, pod.Name, ref.Name)
	}
	if err != nil {
		return nil, unavailable(err, "cannot check the caller's Job %s/%s", ns, ref.Name)
	}
	return g.agentOfPod(pod, ref, job)
}

// pod returns the calling pod: from the cache, or the API server when
// the cache cannot tell or there is none.
func (g *AgentGuard) pod(ctx context.Context, ns, name string) (*corev1.Pod, error) {
	if p, ok := g.objects.cachedPod(ns, name); ok {
		if p == nil {
			return nil, apierrors.NewNotFound(corev1.Resource("pods"), name)
		}
		return p, nil
	}
	return g.objects.getPod(ctx, ns, name)
}

// agentOfPod admits pod, whose controller reference is ref, as the agent
// of job.
func (g *AgentGuard) agentOfPod(pod *corev1.Pod, ref *metav1.OwnerReference, job *batchv1.Job) (*Agent, error) {
	// A pod made by hand under a real signed Job runs what its maker
	// wants: admit only what the Job's template would run (podspec.go).
	if job.UID == ref.UID {
		if err := podFromTemplate(pod, job); err != nil {
			return nil, status.Errorf(codes.PermissionDenied, "pod %s/%s is not the pod Job %s/%s would run: %v; agents are started only by the server", pod.Namespace, pod.Name, job.Namespace, job.Name, err)
		}
	}
	a, err := g.agentOfJob(pod.Name, ref.UID, job)
	if a != nil {
		a.Node = pod.Spec.NodeName
	}
	return a, err
}

// unavailable is the refusal of a call whose caller could not be
// checked: err as is if it is already a gRPC status (the lookups'
// bounds), else wrapped as the server's Unavailable.
func unavailable(err error, format string, a ...any) error {
	if _, ok := status.FromError(err); ok {
		return err
	}
	return ebv1.ServerErrorf(codes.Unavailable, format+": %v", append(a, err)...)
}

func (g *AgentGuard) agentOfJob(pod string, uid types.UID, job *batchv1.Job) (*Agent, error) {
	name := job.Namespace + "/" + job.Name
	if job.UID != uid {
		return nil, status.Errorf(codes.PermissionDenied, "pod %s belongs to an earlier Job %s (uid %s), not the one that exists now", pod, name, uid)
	}
	if job.Labels[jobs.LabelManagedBy] != jobs.ManagedBy {
		return nil, status.Errorf(codes.PermissionDenied, "Job %s is not managed by the server (label %s=%s missing)", name, jobs.LabelManagedBy, jobs.ManagedBy)
	}
	// Labels and annotations anyone who may create Jobs here can copy;
	// the signature only the server can make, and it fits one Job (UID).
	if err := g.cfg.Signer.Verify(job); err != nil {
		return nil, status.Errorf(codes.PermissionDenied, "Job %s is not one the server created: %v", name, err)
	}
	if job.DeletionTimestamp != nil || jobs.JobPhase(job) != jobs.PhaseRunning {
		return nil, status.Errorf(codes.PermissionDenied, "Job %s has finished; its pods may call the server no more", name)
	}
	if err := jobRunsOnePod(job); err != nil {
		return nil, status.Errorf(codes.PermissionDenied, "Job %s is no longer as the server created it: %v; delete it and start the %s again", name, err, jobs.ClaimsOf(job).Kind)
	}
	c := jobs.ClaimsOf(job)
	a := &Agent{
		JobNamespace: job.Namespace, JobName: job.Name, Pod: pod,
		Backup: c.Backup, Location: c.Location, Target: c.Target, SHA256: c.SHA256, Scheduled: c.Scheduled,
	}
	restoreNS, known := g.cfg.TargetNamespaces[c.Target]
	// A drill needs no target: an uploaded backup is drilled too.
	if !known && !agentjob.Of(c.Kind).AnyBackup {
		return nil, status.Errorf(codes.PermissionDenied, "Job %s is for target %q, which the server does not have", name, c.Target)
	}
	if err := g.checkKind(name, job, c, a, restoreNS); err != nil {
		return nil, err
	}
	if a.Backup == "" || a.Location == "" {
		return nil, status.Errorf(codes.PermissionDenied, "Job %s does not say which backup it is for (annotations %s, %s)", name, jobs.AnnotationBackup, jobs.AnnotationLocation)
	}
	return a, nil
}

// checkKind checks what Job job (named name) may do as the kind of agent
// its claims c say, where restores of its target run in restoreNS, and
// completes a with that kind's part: where it runs and what it pins are
// its row of agentjob.Kinds; what a restore or a fold may read besides
// is its Job's own (signed) list.
func (g *AgentGuard) checkKind(name string, job *batchv1.Job, c jobs.JobClaims, a *Agent, restoreNS string) error {
	kind, ok := agentjob.OfComponent(job.Labels[jobs.LabelComponent])
	if !ok || kind.Kind != c.Kind {
		return status.Errorf(codes.PermissionDenied, "Job %s is not a %s agent (label %s=%q)", name,
			kindList("or", "", func(agentjob.Spec) bool { return true }), jobs.LabelComponent, job.Labels[jobs.LabelComponent])
	}
	a.Kind = kind.Kind
	switch {
	case kind.InRestoreNamespace && job.Namespace != restoreNS:
		return status.Errorf(codes.PermissionDenied, "%s Job %s is not in namespace %s, where restores of target %q run", kind.Kind, name, restoreNS, c.Target)
	case !kind.InRestoreNamespace && job.Namespace != g.cfg.Namespace:
		return status.Errorf(codes.PermissionDenied, "%s Job %s is not in the server's namespace %s", kind.Kind, name, g.cfg.Namespace)
	case kind.PinsBackup && a.SHA256 == "":
		return status.Errorf(codes.PermissionDenied, "%s Job %s carries no %s annotation; start the %s again", kind.Kind, name, jobs.AnnotationSHA256, kind.Kind)
	}
	switch kind.Kind {
	case agentjob.Restore:
		// Signed with the rest (JobClaims.Segments).
		segs, err := jobs.DecodeSegments(job.Annotations[jobs.AnnotationDeltaSegments])
		if err != nil {
			return status.Errorf(codes.PermissionDenied, "restore Job %s: %v; start the restore again", name, err)
		}
		if len(segs) > 0 {
			a.Segments = make(map[string]string, len(segs))
			for _, s := range segs {
				a.Segments[s.Name] = s.SHA256
			}
		}
	case agentjob.Fold:
		in, err := jobs.ParseFoldInputs(c.FoldInputs)
		if err != nil {
			return status.Errorf(codes.PermissionDenied, "fold Job %s does not say which chain it folds: %v", name, err)
		}
		a.Inputs = in.Pins()
		if _, self := a.Inputs[a.Backup]; self {
			return status.Errorf(codes.PermissionDenied, "fold Job %s would store %q, which it also reads", name, a.Backup)
		}
	}
	return nil
}

// String names the agent for logs and errors.
func (a *Agent) String() string {
	return fmt.Sprintf("%s agent of job %s/%s", a.Kind, a.JobNamespace, a.JobName)
}
