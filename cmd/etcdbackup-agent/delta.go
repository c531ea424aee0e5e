package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"time"

	"github.com/spf13/cobra"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/leaderelection"
	"k8s.io/client-go/tools/leaderelection/resourcelock"

	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/agents/backup"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/agents/delta"
)

// election says which Lease elects the one agent that writes a target's
// chain, and how fast leadership moves.
type election struct {
	namespace, name string
	identity        string
	leaseDuration   time.Duration
	renewDeadline   time.Duration
	retryPeriod     time.Duration
}

// deltaEnd is the termination message of a delta agent whose chain
// ended, which the server reads.
type deltaEnd struct {
	ChainEnded string `json:"chainEnded"`
}

func newDeltaCmd() *cobra.Command {
	var etcd backup.Etcd
	var srv serverFlags
	var o delta.Options
	var store delta.ServerStore
	el := election{leaseDuration: 15 * time.Second, renewDeadline: 10 * time.Second, retryPeriod: 2 * time.Second}
	var resultFile string
	cmd := &cobra.Command{
		Use:   "delta --endpoints URLS --server HOST:PORT --target T --chain FULL --lease-namespace NS --lease-name NAME",
		Short: "Watch etcd and store every revision as delta segments of a chain, while holding the target's delta Lease",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ctx := cmd.Context()
			log := newLogger()
			if store.Chain == "" || store.Target == "" || el.namespace == "" || el.name == "" {
				return errors.New("--chain, --target, --lease-namespace and --lease-name are required")
			}
			id, err := identity()
			if err != nil {
				return err
			}
			el.identity = id
			kcfg, err := rest.InClusterConfig()
			if err != nil {
				return fmt.Errorf("kube client for the delta Lease (the agent runs in a pod): %w", err)
			}
			kube, err := kubernetes.NewForConfig(kcfg)
			if err != nil {
				return fmt.Errorf("kube client for the delta Lease: %w", err)
			}
			etcdClient, endpoint, err := etcd.Connect(ctx)
			if err != nil {
				return err
			}
			defer etcdClient.Close()
			conn, c, err := dial(srv)
			if err != nil {
				return err
			}
			defer conn.Close()
			store.Client = c
			o.Etcd, o.Store, o.Chain, o.Log = etcdClient, &store, store.Chain, log
			log.Info("delta agent starting", "target", store.Target, "chain", store.Chain, "endpoint", endpoint, "lease", el.namespace+"/"+el.name,
				"identity", el.identity, "period", o.Period.String(), "maxBytes", o.MaxBytes, "compression", o.Compression, "encryptedTo", len(o.AgeRecipients))
			res, err := runElected(ctx, kube, el, log, func(ctx context.Context, epoch int64) (delta.Result, error) {
				o := o
				o.Epoch = func() int64 { return epoch }
				return delta.Run(ctx, o)
			})
			if err != nil {
				log.Error("delta capture failed", "chain", store.Chain, "error", err.Error())
				return err
			}
			if res.ChainEnded == "" {
				log.Info("delta agent stopped", "chain", store.Chain, "segments", res.Segments, "lastRevision", res.LastRevision)
				return nil
			}
			log.Warn("delta chain ended", "chain", store.Chain, "reason", res.ChainEnded, "segments", res.Segments, "lastRevision", res.LastRevision)
			return writeDeltaEnd(resultFile, res.ChainEnded)
		},
	}
	fl := cmd.Flags()
	addEtcdFlags(fl, &etcd, "the etcd member to watch, https://HOST:PORT",
		"the cluster's members; the agent watches a healthy follower, else the leader")
	fl.StringVar(&srv.addr, "server", "", "data server gRPC address, e.g. etcdbackup.etcdbackup-system.svc:50052")
	fl.StringVar(&store.Target, "target", "", "name of the etcd target, recorded with each segment")
	fl.StringVar(&store.Chain, "chain", "", "the full backup the chain starts from; segments are named CHAIN.delta-REVISION")
	fl.StringVar(&store.Location, "location", "", "storage location of the chain (default: the server's default)")
	fl.DurationVar(&o.Period, "period", delta.DefaultPeriod, "longest time a segment spans from its first revision: at most this much is lost if the agent dies")
	fl.Int64Var(&o.MaxBytes, "max-bytes", delta.DefaultMaxBytes, "a segment is cut once it holds this many bytes (before compression); the agent holds at most two")
	fl.StringVar(&o.Compression, "compression", "", "\"zstd\" to compress, empty for none")
	fl.StringArrayVar(&o.AgeRecipients, "encrypt-to", nil, "age public key (age1...) to encrypt every segment to, after compression; repeatable")
	fl.StringVar(&el.namespace, "lease-namespace", "", "namespace of the target's delta Lease")
	fl.StringVar(&el.name, "lease-name", "", "the target's delta Lease: only its holder writes the chain, and its leaseTransitions is the fencing epoch")
	fl.StringVar(&resultFile, "result-file", "/dev/termination-log", "where the chain's end is written as JSON (the pod's termination message, which the server reads)")
	addServerFlags(cmd, &srv)
	_ = cmd.MarkFlagRequired("server")
	return cmd
}

// identity names this agent in the Lease: its pod, and a random part so
// that a restarted container is a new holder (a new epoch).
func identity() (string, error) {
	pod := os.Getenv("POD_NAME")
	if pod == "" {
		var err error
		if pod, err = os.Hostname(); err != nil {
			return "", fmt.Errorf("agent identity: no $POD_NAME and no hostname: %w", err)
		}
	}
	b := make([]byte, 4)
	if _, err := rand.Read(b); err != nil {
		return "", fmt.Errorf("agent identity: %w", err)
	}
	return pod + "_" + hex.EncodeToString(b), nil
}

// captureFunc captures while ctx lasts, writing at epoch.
type captureFunc func(ctx context.Context, epoch int64) (delta.Result, error)

// runElected runs capture once this agent holds the Lease, and only while
// it does: losing it cancels capture at once (cause delta.ErrNotLeader,
// so nothing more is written). ctx done (SIGTERM) stops capture, which
// stores what it holds while the Lease is still held, then releases the
// Lease so that a successor need not wait for it to expire.
func runElected(ctx context.Context, kube kubernetes.Interface, el election, log *slog.Logger, capture captureFunc) (delta.Result, error) {
	lease := el.namespace + "/" + el.name
	// The elector outlives ctx: it keeps renewing while capture flushes.
	electCtx, stopElect := context.WithCancel(context.WithoutCancel(ctx))
	defer stopElect()
	leading := make(chan context.Context, 1)
	le, err := leaderelection.NewLeaderElector(leaderelection.LeaderElectionConfig{
		Lock: &resourcelock.LeaseLock{
			LeaseMeta:  metav1.ObjectMeta{Namespace: el.namespace, Name: el.name},
			Client:     kube.CoordinationV1(),
			LockConfig: resourcelock.ResourceLockConfig{Identity: el.identity},
		},
		LeaseDuration:   el.leaseDuration,
		RenewDeadline:   el.renewDeadline,
		RetryPeriod:     el.retryPeriod,
		ReleaseOnCancel: true,
		Name:            lease,
		Callbacks: leaderelection.LeaderCallbacks{
			// Called on a goroutine of the elector's: capture runs on
			// runElected's own, so that it is waited for.
			OnStartedLeading: func(lctx context.Context) { leading <- lctx },
			OnStoppedLeading: func() { log.Info("not leading", "lease", lease, "identity", el.identity) },
			OnNewLeader: func(id string) {
				if id != el.identity {
					log.Info("another agent holds the delta Lease; waiting", "lease", lease, "holder", id)
				}
			},
		},
	})
	if err != nil {
		return delta.Result{}, fmt.Errorf("leader election on Lease %s: %w", lease, err)
	}
	electDone := make(chan struct{})
	go func() {
		defer close(electDone)
		le.Run(electCtx)
	}()
	// Whatever happens, the elector is stopped (releasing the Lease) and
	// waited for.
	defer func() {
		stopElect()
		<-electDone
	}()

	var lctx context.Context
	select {
	case <-ctx.Done():
		log.Info("stopping before this agent led", "lease", lease)
		return delta.Result{}, nil
	case <-electDone:
		return delta.Result{}, fmt.Errorf("leader election on Lease %s ended before this agent led", lease)
	case lctx = <-leading:
	}
	epoch, err := leaseEpoch(lctx, kube, el)
	if err != nil {
		return delta.Result{}, err
	}
	log.Info("leading: delta capture starts", "lease", lease, "identity", el.identity, "epoch", epoch)
	capCtx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	stopLost := context.AfterFunc(lctx, func() { cancel(delta.ErrNotLeader) })
	defer stopLost()
	res, err := capture(capCtx, epoch)
	if errors.Is(err, delta.ErrNotLeader) {
		return res, fmt.Errorf("lost the delta Lease %s (not renewed within %s: another agent took it or the API server was unreachable); capture stopped, the agent restarts to try again: %w",
			lease, el.renewDeadline, err)
	}
	return res, err
}

// leaseEpoch reads the fencing epoch of the Lease this agent just
// acquired: its leaseTransitions, which the elector raised when it took
// the Lease from its previous holder.
func leaseEpoch(ctx context.Context, kube kubernetes.Interface, el election) (int64, error) {
	l, err := kube.CoordinationV1().Leases(el.namespace).Get(ctx, el.name, metav1.GetOptions{})
	if err != nil {
		return 0, fmt.Errorf("read the delta Lease %s/%s for its epoch: %w", el.namespace, el.name, err)
	}
	if h := l.Spec.HolderIdentity; h == nil || *h != el.identity {
		return 0, fmt.Errorf("delta Lease %s/%s: held by %v, not this agent (%s), right after acquiring it", el.namespace, el.name, l.Spec.HolderIdentity, el.identity)
	}
	if l.Spec.LeaseTransitions == nil {
		return 0, fmt.Errorf("delta Lease %s/%s has no leaseTransitions: no fencing epoch", el.namespace, el.name)
	}
	return int64(*l.Spec.LeaseTransitions), nil
}

// writeDeltaEnd writes why the chain ended where the server reads it; a
// pod's termination message holds 4096 bytes.
func writeDeltaEnd(path, reason string) error {
	const maxReason = 3000
	if len(reason) > maxReason {
		reason = reason[:maxReason] + "…"
	}
	b, err := json.Marshal(deltaEnd{ChainEnded: reason})
	if err != nil {
		return err
	}
	if err := os.WriteFile(path, b, 0o644); err != nil {
		return fmt.Errorf("--result-file: %w", err)
	}
	return nil
}
