package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"time"

	"github.com/spf13/cobra"
	"k8s.io/client-go/tools/leaderelection"
	"k8s.io/client-go/tools/leaderelection/resourcelock"

	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/agents/backup"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/agents/delta"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/api/agentjob"
)

// election says which Lease elects the one agent that writes a target's
// chain, and how fast leadership moves.
type election struct {
	// name names the Lease in messages (the server picks the Lease: the
	// calling agent's target's).
	name          string
	identity      string
	leaseDuration time.Duration
	renewDeadline time.Duration
	retryPeriod   time.Duration
}

func (c commands) delta() *cobra.Command {
	var f agentjob.DeltaFlags
	var etcd backup.Etcd
	el := election{leaseDuration: 15 * time.Second, renewDeadline: 10 * time.Second, retryPeriod: 2 * time.Second}
	var resultFile string
	cmd := &cobra.Command{
		Use:   "delta --endpoints URLS --server HOST:PORT --target T --chain FULL",
		Short: "Watch etcd and store every revision as delta segments of a chain, while holding the target's delta Lease",
		Args:  cobra.NoArgs,
	}
	srv := addServerFlags(cmd, &f.Conn, "data server gRPC address, e.g. etcdbackup.etcdbackup-system.svc:50052")
	cmd.RunE = c.runE(func() agentjob.Flags { return f }, func(cmd *cobra.Command) error {
		ctx := cmd.Context()
		log := newLogger()
		if err := required(agentjob.FlagChain, f.Chain, agentjob.FlagTarget, f.Target); err != nil {
			return err
		}
		id, err := identity()
		if err != nil {
			return err
		}
		el.identity, el.name = id, "of target "+f.Target
		etcdClient, endpoint, err := withJobEtcd(etcd, f.Etcd).Connect(ctx)
		if err != nil {
			return err
		}
		defer etcdClient.Close()
		conn, c, err := dial(srv)
		if err != nil {
			return err
		}
		defer conn.Close()
		store := delta.ServerStore{Client: c, Chain: f.Chain, Location: f.Location, Target: f.Target}
		o := delta.Options{
			Etcd: etcdClient, Store: &store, Chain: f.Chain, Log: log,
			Period: f.Period, MaxBytes: f.MaxBytes, Compression: f.Compression, AgeRecipients: f.EncryptTo,
		}
		log.Info("delta agent starting", "target", store.Target, "chain", store.Chain, "endpoint", endpoint,
			"identity", el.identity, "period", o.Period.String(), "maxBytes", o.MaxBytes, "compression", o.Compression, "encryptedTo", len(o.AgeRecipients))
		lock := delta.NewServerLock(c.Agents, el.name, el.identity)
		res, err := runElected(ctx, lock, el, log, func(ctx context.Context, epoch int64) (delta.Result, error) {
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
		return writeReport(resultFile, agentjob.DeltaEnd{ChainEnded: res.ChainEnded})
	})
	fl := cmd.Flags()
	addEtcdFlags(fl, &etcd, &f.Etcd, "the etcd member to watch, https://HOST:PORT",
		"the cluster's members; the agent watches a healthy follower, else the leader")
	fl.StringVar(&f.Target, agentjob.FlagTarget, "", "name of the etcd target, recorded with each segment")
	fl.StringVar(&f.Chain, agentjob.FlagChain, "", "the full backup the chain starts from; segments are named CHAIN.delta-REVISION")
	fl.StringVar(&f.Location, agentjob.FlagLocation, "", "storage location of the chain (default: the server's default)")
	fl.DurationVar(&f.Period, agentjob.FlagPeriod, delta.DefaultPeriod, "longest time a segment spans from its first revision: at most this much is lost if the agent dies")
	fl.Int64Var(&f.MaxBytes, agentjob.FlagMaxBytes, delta.DefaultMaxBytes, "a segment is cut once it holds this many bytes (before compression); the agent holds at most two")
	addEncodingFlags(fl, &f.Compression, &f.EncryptTo, "every segment")
	fl.StringVar(&resultFile, "result-file", "/dev/termination-log", "where the chain's end is written as JSON (the pod's termination message, which the server reads)")
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

// runElected runs capture once this agent holds the Lease lock (the
// target's delta Lease, held through the server: delta.ServerLock), and
// only while it does: losing it cancels capture at once (cause
// delta.ErrNotLeader, so nothing more is written). ctx done (SIGTERM)
// stops capture, which stores what it holds while the Lease is still
// held, then releases the Lease so that a successor need not wait for it
// to expire.
func runElected(ctx context.Context, lock resourcelock.Interface, el election, log *slog.Logger, capture captureFunc) (delta.Result, error) {
	lease := el.name
	// The elector outlives ctx: it keeps renewing while capture flushes.
	electCtx, stopElect := context.WithCancel(context.WithoutCancel(ctx))
	defer stopElect()
	leading := make(chan context.Context, 1)
	le, err := leaderelection.NewLeaderElector(leaderelection.LeaderElectionConfig{
		Lock:            lock,
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
	epoch, err := leaseEpoch(lctx, lock, el)
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
func leaseEpoch(ctx context.Context, lock resourcelock.Interface, el election) (int64, error) {
	r, _, err := lock.Get(ctx)
	if err != nil {
		return 0, fmt.Errorf("read the delta Lease %s for its epoch: %w", el.name, err)
	}
	if r.HolderIdentity != el.identity {
		return 0, fmt.Errorf("delta Lease %s: held by %q, not this agent (%s), right after acquiring it", el.name, r.HolderIdentity, el.identity)
	}
	return int64(r.LeaderTransitions), nil
}
