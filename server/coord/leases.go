package coord

import (
	"cmp"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/selection"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
	coordclient "k8s.io/client-go/kubernetes/typed/coordination/v1"

	"google.golang.org/grpc/codes"

	ebv1 "github.com/kubectl-etcdbackup/kubectl-etcdbackup/api/etcdbackup/v1"
)

// The Leases' labels and annotations. The labels find them (every
// coordination Lease; the sends of one backup); the annotations name the
// backup for a person reading them.
const (
	LabelCoordination = "etcdbackup.io/coordination"
	LabelBackupKey    = "etcdbackup.io/backup-key"
	AnnotationLoc     = "etcdbackup.io/location"
	AnnotationBackup  = "etcdbackup.io/backup"
)

// What a Lease marks (LabelCoordination).
const (
	kindUpload  = "upload"
	kindSend    = "send"
	kindRemoval = "removal"
)

const (
	// DefaultDuration is how long a Lease lasts unrenewed: a replica that
	// dies mid-transfer blocks its backup's name, or its removal, that
	// long.
	DefaultDuration = 30 * time.Second
	// clockSkew is added to a Lease's duration before another replica
	// counts it as lapsed: RenewTime is the holder's clock, not the
	// reader's.
	clockSkew = 5 * time.Second
	// apiTimeout bounds each call to the API server a release or a sweep
	// makes after its request has ended.
	apiTimeout = 10 * time.Second
)

// LeasesConfig configures NewLeases.
type LeasesConfig struct {
	// Client writes the Leases: create, get, list, update and delete of
	// Leases in Namespace.
	Client kubernetes.Interface
	// Namespace is the server's.
	Namespace string
	// Identity is this replica's (its pod's name): the Leases' holder.
	Identity string
	// Duration is how long a Lease lasts unrenewed; 0 is DefaultDuration.
	Duration time.Duration
	Logger   *slog.Logger
	// Now is the clock; nil is time.Now.
	Now func() time.Time
}

// Leases is a Registry for several replicas. Each claim is kept in this
// replica's memory (Local) and as a Lease in the server's namespace,
// renewed while it is held, so that every replica sees it; one whose
// replica died lapses after its duration.
//
// When the API server cannot be asked, uploads and sends go on as on one
// replica (the storage's commit still refuses a second backup of one
// name: it is conditional), and removals do not happen: a backup is never
// removed on a guess.
type Leases struct {
	leases   coordclient.LeaseInterface
	identity string
	duration time.Duration
	// sweep is how often Run looks for lapsed Leases: duration.
	sweep time.Duration
	local *Local
	log   *slog.Logger
	now   func() time.Time
}

var _ Registry = (*Leases)(nil)

// NewLeases returns a Leases registry.
func NewLeases(cfg LeasesConfig) (*Leases, error) {
	switch {
	case cfg.Client == nil:
		return nil, errors.New("coordination: no Kubernetes client")
	case cfg.Namespace == "":
		return nil, errors.New("coordination: the server's namespace is unknown")
	case cfg.Identity == "":
		return nil, errors.New("coordination: this replica has no identity (its pod name)")
	}
	l := &Leases{
		leases:   cfg.Client.CoordinationV1().Leases(cfg.Namespace),
		identity: cfg.Identity,
		duration: cmp.Or(cfg.Duration, DefaultDuration),
		local:    NewLocal(),
		log:      cmp.Or(cfg.Logger, slog.New(slog.DiscardHandler)),
		now:      cfg.Now,
	}
	if l.now == nil {
		l.now = time.Now
	}
	l.sweep = l.duration
	return l, nil
}

// backupKey names loc/name in Lease names and labels, which allow fewer
// characters and less length than a location and a backup name.
func backupKey(loc, name string) string {
	sum := sha256.Sum256([]byte(loc + "\x00" + name))
	return hex.EncodeToString(sum[:16])
}

func leaseName(kind, loc, name string) string {
	return "etcdbackup-" + kind + "-" + backupKey(loc, name)
}

// ClaimUpload implements Registry.
func (l *Leases) ClaimUpload(ctx context.Context, loc, name string) (func(), error) {
	release, err := l.local.ClaimUpload(ctx, loc, name)
	if err != nil {
		return nil, err
	}
	h, holder, err := l.acquire(ctx, kindUpload, loc, name)
	switch {
	case err != nil:
		l.log.Warn("cannot claim the upload's name across the server's replicas; going on, the storage's commit refuses a second backup of one name",
			"location", loc, "backup", name, "error", err)
		return release, nil
	case h == nil:
		release()
		return nil, uploadInProgress(loc, name, holder)
	}
	return func() { h.release(); release() }, nil
}

// Send implements Registry.
func (l *Leases) Send(ctx context.Context, loc, name string) (func(), error) {
	done, err := l.local.Send(ctx, loc, name)
	if err != nil {
		return nil, err
	}
	// Each send is a Lease of its own: several replicas may send one
	// backup at once.
	suffix := make([]byte, 4)
	_, _ = rand.Read(suffix)
	created, err := l.leases.Create(ctx, l.newLease(leaseName(kindSend, loc, name)+"-"+hex.EncodeToString(suffix), kindSend, loc, name), metav1.CreateOptions{})
	if err != nil {
		l.log.Warn("cannot mark the download for the server's other replicas; going on, their retention may remove the backup meanwhile",
			"location", loc, "backup", name, "error", err)
		return done, nil
	}
	h := l.hold(created)
	// Marked first, looked for second, as Remove does the other way
	// round: of a send and a removal that overlap, at least one sees the
	// other.
	if r, err := l.leases.Get(ctx, leaseName(kindRemoval, loc, name), metav1.GetOptions{}); err == nil && l.fresh(r) {
		h.release()
		done()
		return nil, beingRemoved(loc, name)
	}
	return func() { h.release(); done() }, nil
}

// Remove implements Registry.
func (l *Leases) Remove(ctx context.Context, loc, name string) (func(), bool, error) {
	done, ok, err := l.local.Remove(ctx, loc, name)
	if err != nil || !ok {
		return nil, ok, err
	}
	h, _, err := l.acquire(ctx, kindRemoval, loc, name)
	if err != nil || h == nil {
		done()
		return nil, false, l.unavailable(err, loc, name)
	}
	sel := labels.SelectorFromSet(labels.Set{LabelCoordination: kindSend, LabelBackupKey: backupKey(loc, name)})
	sends, err := l.leases.List(ctx, metav1.ListOptions{LabelSelector: sel.String()})
	if err != nil {
		h.release()
		done()
		return nil, false, l.unavailable(err, loc, name)
	}
	busy := false
	for i := range sends.Items {
		if s := &sends.Items[i]; l.fresh(s) {
			busy = true
		} else {
			l.deleteLapsed(ctx, s)
		}
	}
	if busy {
		h.release()
		done()
		return nil, false, nil
	}
	return func() { h.release(); done() }, true, nil
}

func (l *Leases) unavailable(err error, loc, name string) error {
	if err == nil {
		return nil
	}
	return ebv1.ServerErrorf(codes.Unavailable,
		"cannot tell whether another server replica is sending backup %q in location %q, so it is kept: %v", name, loc, err)
}

// Run deletes, every Duration until ctx ends, the Leases whose replicas
// stopped renewing them (a replica that died holding them), so that they
// do not pile up in the namespace.
func (l *Leases) Run(ctx context.Context) {
	wait.UntilWithContext(ctx, l.sweepLapsed, l.sweep)
}

func (l *Leases) sweepLapsed(ctx context.Context) {
	req, _ := labels.NewRequirement(LabelCoordination, selection.Exists, nil)
	all, err := l.leases.List(ctx, metav1.ListOptions{LabelSelector: labels.NewSelector().Add(*req).String()})
	if err != nil {
		l.log.Debug("cannot list coordination Leases to remove lapsed ones", "error", err)
		return
	}
	for i := range all.Items {
		if le := &all.Items[i]; !l.fresh(le) {
			l.deleteLapsed(ctx, le)
		}
	}
}

func (l *Leases) newLease(leaseName, kind, loc, name string) *coordinationv1.Lease {
	lease := &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{
		Name:        leaseName,
		Labels:      map[string]string{LabelCoordination: kind, LabelBackupKey: backupKey(loc, name)},
		Annotations: map[string]string{AnnotationLoc: loc, AnnotationBackup: name},
	}}
	l.stamp(lease, true)
	return lease
}

// stamp makes this replica the holder of lease, renewed now.
func (l *Leases) stamp(lease *coordinationv1.Lease, acquired bool) {
	now := metav1.NewMicroTime(l.now())
	secs := int32((l.duration + time.Second - 1) / time.Second)
	lease.Spec.HolderIdentity = &l.identity
	lease.Spec.LeaseDurationSeconds = &secs
	lease.Spec.RenewTime = &now
	if acquired {
		lease.Spec.AcquireTime = &now
	}
}

// fresh: lease's holder renewed it recently enough that it may still be
// working.
func (l *Leases) fresh(lease *coordinationv1.Lease) bool {
	s := lease.Spec
	if s.RenewTime == nil || s.LeaseDurationSeconds == nil {
		return false
	}
	lapses := s.RenewTime.Add(time.Duration(*s.LeaseDurationSeconds)*time.Second + clockSkew)
	return l.now().Before(lapses)
}

func holderOf(lease *coordinationv1.Lease) string {
	if lease.Spec.HolderIdentity == nil {
		return ""
	}
	return *lease.Spec.HolderIdentity
}

// acquire takes the Lease of kind for loc/name: creates it, or takes it
// over when its holder stopped renewing it. A Lease another replica holds
// returns a nil held and that replica's name.
func (l *Leases) acquire(ctx context.Context, kind, loc, name string) (*held, string, error) {
	want := l.newLease(leaseName(kind, loc, name), kind, loc, name)
	for range 3 {
		created, err := l.leases.Create(ctx, want, metav1.CreateOptions{})
		if err == nil {
			return l.hold(created), "", nil
		}
		if !apierrors.IsAlreadyExists(err) {
			return nil, "", fmt.Errorf("create Lease %s: %w", want.Name, err)
		}
		cur, err := l.leases.Get(ctx, want.Name, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			continue // released meanwhile
		}
		if err != nil {
			return nil, "", fmt.Errorf("get Lease %s: %w", want.Name, err)
		}
		if l.fresh(cur) {
			return nil, holderOf(cur), nil
		}
		// Its replica stopped renewing it: take it over. The update
		// carries cur's resourceVersion, so of two replicas taking it over
		// at once one wins.
		next := cur.DeepCopy()
		next.Labels, next.Annotations = want.Labels, want.Annotations
		l.stamp(next, true)
		updated, err := l.leases.Update(ctx, next, metav1.UpdateOptions{})
		if err == nil {
			return l.hold(updated), "", nil
		}
		if !apierrors.IsConflict(err) {
			return nil, "", fmt.Errorf("take over lapsed Lease %s: %w", want.Name, err)
		}
	}
	return nil, "another replica", nil
}

// deleteLapsed deletes lease unless it changed since it was read.
func (l *Leases) deleteLapsed(ctx context.Context, lease *coordinationv1.Lease) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), apiTimeout)
	defer cancel()
	err := l.leases.Delete(ctx, lease.Name, metav1.DeleteOptions{Preconditions: &metav1.Preconditions{
		UID: &lease.UID, ResourceVersion: &lease.ResourceVersion}})
	if err != nil && !apierrors.IsNotFound(err) && !apierrors.IsConflict(err) {
		l.log.Debug("cannot delete a lapsed coordination Lease", "lease", lease.Name, "holder", holderOf(lease), "error", err)
	}
}

// held is a Lease this replica holds: renewed until release.
type held struct {
	l      *Leases
	lease  *coordinationv1.Lease
	cancel context.CancelFunc
	done   chan struct{}
}

func (l *Leases) hold(lease *coordinationv1.Lease) *held {
	ctx, cancel := context.WithCancel(context.Background())
	h := &held{l: l, lease: lease, cancel: cancel, done: make(chan struct{})}
	go h.renew(ctx)
	return h
}

// renew renews the Lease a third of its duration apart until ctx ends.
// Failures are logged and tried again: the Lease lapses only after a
// whole duration without one.
func (h *held) renew(ctx context.Context) {
	defer close(h.done)
	t := time.NewTicker(h.l.duration / 3)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		next := h.lease.DeepCopy()
		h.l.stamp(next, false)
		rctx, cancel := context.WithTimeout(ctx, apiTimeout)
		updated, err := h.l.leases.Update(rctx, next, metav1.UpdateOptions{})
		cancel()
		switch {
		case err == nil:
			h.lease = updated
		case apierrors.IsConflict(err) || apierrors.IsNotFound(err):
			// Taken over or deleted as lapsed: another replica went on
			// without this one.
			h.l.log.Warn("a coordination Lease this replica held was taken over after it lapsed",
				"lease", h.lease.Name, "backup", h.lease.Annotations[AnnotationBackup], "error", err)
			return
		default:
			h.l.log.Debug("cannot renew a coordination Lease; trying again", "lease", h.lease.Name, "error", err)
		}
	}
}

// release stops renewing the Lease and deletes it, unless another
// replica has taken it over meanwhile.
func (h *held) release() {
	h.cancel()
	<-h.done
	ctx, cancel := context.WithTimeout(context.Background(), apiTimeout)
	defer cancel()
	uid := h.lease.UID
	err := h.l.leases.Delete(ctx, h.lease.Name, metav1.DeleteOptions{Preconditions: &metav1.Preconditions{UID: &uid, ResourceVersion: &h.lease.ResourceVersion}})
	if err != nil && !apierrors.IsNotFound(err) && !apierrors.IsConflict(err) {
		h.l.log.Warn("cannot release a coordination Lease; it lapses by itself", "lease", h.lease.Name, "error", err)
	}
}
