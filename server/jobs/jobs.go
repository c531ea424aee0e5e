// Package jobs launches the agents as Kubernetes Jobs — one kind of Job
// per row of agentjob.Kinds: backups, restores, drills, delta capture,
// folds — and reads the state of those Jobs back from informers, so the
// request layer and the controller can show a run as Running or Failed
// before (or instead of) its result being stored, and read the verdicts
// agents report. A Job runs under the agents' own ServiceAccount, which
// has no API permissions, and mounts only what its kind needs (a target's
// TLS Secret, an age identity Secret, scratch space): no storage
// credential and no secret value ever appears in its spec.
//
// launch.go creates and signs Jobs from the shape they share; backup.go,
// restore.go, drill.go, delta.go and fold.go are one kind each;
// readback.go reads any Job's phase and report; cache.go holds the
// informers; sign.go the Job signature.
package jobs

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/api/agentjob"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/server/config"
)

// Labels and annotations on the Jobs this package creates.
const (
	LabelComponent = agentjob.LabelComponent
	LabelManagedBy = agentjob.LabelManagedBy
	// labelRun is the run's ID (a hash of what it works on), on every
	// agent Job and its pod.
	labelRun           = "etcdbackup.io/run"
	AnnotationBackup   = "etcdbackup.io/backup"
	AnnotationLocation = "etcdbackup.io/location"
	AnnotationTarget   = "etcdbackup.io/target"
	// AnnotationSHA256 pins a restore or drill Job to the content it
	// reads (agentjob.Spec.PinsBackup).
	AnnotationSHA256 = "etcdbackup.io/sha256"
	// LabelScheduled marks the Job of a scheduled backup or drill
	// ("true").
	LabelScheduled = "etcdbackup.io/scheduled"
	// AnnotationCounted marks a finished Job whose outcome the server has
	// counted in its metrics, so a restarted server does not count it
	// again.
	AnnotationCounted = "etcdbackup.io/counted"
	// AnnotationForgotten marks the Job of a backup removed from storage
	// while its agent still ran (ForgetBackup): once it finishes, List
	// leaves it out.
	AnnotationForgotten = "etcdbackup.io/forgotten"

	// ManagedBy is LabelManagedBy's value on every agent Job the server
	// creates: the agent guard admits only pods of such Jobs.
	ManagedBy = agentjob.ManagedBy

	managedBy = ManagedBy
	// tlsMountPath is where the target's TLS Secret appears in the agent.
	tlsMountPath = "/etc/etcdbackup/etcd-tls"
)

// Each kind's LabelComponent value (agentjob.Kinds' rows), by name for
// callers.
var (
	ComponentBackup  = agentjob.Of(agentjob.Backup).Component
	ComponentRestore = agentjob.Of(agentjob.Restore).Component
	ComponentDrill   = agentjob.Of(agentjob.Drill).Component
	ComponentDelta   = agentjob.Of(agentjob.Delta).Component
	ComponentFold    = agentjob.Of(agentjob.Fold).Component
)

// The agent's credential towards the server: a projected ServiceAccount
// token for the server alone (its audience), bound to the agent's pod,
// short-lived and rotated by the kubelet. It is the pod's only token
// (AutomountServiceAccountToken is off).
const (
	// TokenAudience is the audience of agent tokens; the server's
	// TokenReview asks for exactly it, so a token for the API server or
	// anyone else is refused.
	TokenAudience = "etcdbackup"
	// TokenExpirationSeconds is the token's lifetime; the kubelet renews
	// it at 80%.
	TokenExpirationSeconds = 600
	// TokenDir is where the token volume is mounted in the agent.
	TokenDir = "/var/run/secrets/etcdbackup.io/agent"
	// TokenPath is the token file the agent reads before every call.
	TokenPath = TokenDir + "/token"
)

// Launcher creates agent Jobs, and reads them, their pods and their
// events from informers' caches (Start; see cache.go).
type Launcher struct {
	client kubernetes.Interface
	// namespace is the server's own, where every kind of agent Job but
	// restores runs (agentjob.Spec.InRestoreNamespace).
	namespace string
	agents    config.Agents
	startMu   sync.Mutex
	caches    atomic.Pointer[caches]
	// publishCA is SetServerCAPublisher's.
	publishCA func(ctx context.Context, namespace string) error
	// kubeVersions is what kit Jobs record of the API server.
	kubeVersions kubeVersions
	// signer signs the Jobs this Launcher creates and tells its own
	// from forged ones (sign.go).
	signer atomic.Pointer[Signer]
	// serverPod names the server's pod (SetServerPod).
	serverPod atomic.Pointer[string]
	// leases are the delta Leases' client and last writes (deltalease.go).
	leases deltaLeases
}

// New returns a Launcher that creates Jobs in namespace (the server's own)
// as agents says, with its defaults filled in.
func New(client kubernetes.Interface, namespace string, agents config.Agents) (*Launcher, error) {
	switch {
	case namespace == "":
		return nil, errors.New("agent jobs: the server's namespace is unknown (set POD_NAMESPACE from the downward API)")
	case agents.Image == "":
		return nil, errors.New("agent jobs: no agent image configured")
	}
	l := &Launcher{client: client, namespace: namespace, agents: agents.WithDefaults(namespace)}
	// Until LoadSigningKey, a key of this process's own: its Jobs are
	// signed, but another process does not recognise them.
	l.signer.Store(newRandomSigner())
	return l, nil
}

// ErrRunning is returned, wrapped with the Job's kind and name, when
// the agent of the same run (of any kind: the same backup, drill,
// chain, fold or member's restore) is still running.
var ErrRunning = errors.New("still running")

// CheckTarget verifies that what the target's Job would mount exists.
func (l *Launcher) CheckTarget(ctx context.Context, t config.Target) error {
	if t.TLSSecret == "" {
		return nil
	}
	_, err := l.client.CoreV1().Secrets(l.namespace).Get(ctx, t.TLSSecret, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return fmt.Errorf("target %q: its TLS Secret %s/%s does not exist; create it with keys ca.crt, tls.crt and tls.key (the etcd client certificate)",
			t.Name, l.namespace, t.TLSSecret)
	}
	if err != nil {
		return fmt.Errorf("target %q: check TLS Secret %s/%s: %w", t.Name, l.namespace, t.TLSSecret, err)
	}
	return nil
}

// SetServerPod names the server's own pod, which the server's Events
// (ServerEvent) are about; without it they are not recorded.
func (l *Launcher) SetServerPod(name string) { l.serverPod.Store(&name) }

// ServerEvent records a Warning Event about the server's pod, for what
// went wrong in the server's own work (a scheduled run that could not
// start): `kubectl describe pod` and `kubectl get events` show it. A
// failure is returned for the caller to log; nothing waits on it.
func (l *Launcher) ServerEvent(ctx context.Context, reason, message string) error {
	p := l.serverPod.Load()
	if p == nil || *p == "" {
		return errors.New("the server's pod is unknown (POD_NAME), so no Event is recorded")
	}
	now := metav1.Now()
	_, err := l.client.CoreV1().Events(l.namespace).Create(ctx, &corev1.Event{
		ObjectMeta:     metav1.ObjectMeta{GenerateName: *p + ".", Namespace: l.namespace},
		InvolvedObject: corev1.ObjectReference{Kind: "Pod", APIVersion: "v1", Namespace: l.namespace, Name: *p},
		Type:           corev1.EventTypeWarning, Reason: reason, Message: message,
		Source:         corev1.EventSource{Component: managedBy},
		FirstTimestamp: now, LastTimestamp: now, Count: 1,
	}, metav1.CreateOptions{})
	if err != nil {
		return fmt.Errorf("record event %s: %w", reason, err)
	}
	return nil
}
