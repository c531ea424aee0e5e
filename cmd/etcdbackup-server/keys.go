package main

import (
	"context"
	"log/slog"
	"time"

	"golang.org/x/time/rate"

	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/api/agentjob"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/server/agenttls"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/server/jobs"
)

// keyFollowInterval is how often the Job-signing key and the agent CA are
// read again from their Secrets.
const keyFollowInterval = 30 * time.Second

// followedKey is a key of the server's that follows its Secret: rotated
// by hand, or removed by a restore of this cluster (every backup of the
// cluster holds it) and made anew.
type followedKey struct {
	// what names the key in logs.
	what string
	// refresh reads the Secret again and says whether the key changed;
	// on an error the key in force is kept.
	refresh func(context.Context) (bool, error)
	// changed is the warning logged when it did, saying what follows.
	changed string
}

// signingKey follows the key that signs agent Jobs.
func signingKey(l *jobs.Launcher) followedKey {
	return followedKey{what: "the Job-signing key", refresh: l.RefreshSigningKey,
		changed: "the Job-signing key changed (Secret " + agentjob.SigningKeySecret + " was replaced, or removed by a restore of this cluster and made anew): agent Jobs signed before are refused from now on"}
}

// agentCA follows the agent port's CA.
func agentCA(c *agenttls.Current) followedKey {
	return followedKey{what: "the agent CA", refresh: c.Refresh,
		changed: "the agent CA changed (Secret " + agentjob.AgentCASecret + " was replaced, or removed by a restore of this cluster and made anew): the agent port serves a certificate of the new CA; agents started before cannot connect"}
}

// followKeys refreshes every key at each tick until ctx ends, logging a
// change, and an error at most once a minute per key (a Secret that
// cannot be read keeps failing every tick).
func followKeys(ctx context.Context, ticks <-chan time.Time, log *slog.Logger, namespace string, keys ...followedKey) {
	failing := make([]rate.Sometimes, len(keys))
	for i := range failing {
		failing[i].Interval = time.Minute
	}
	for {
		select {
		case <-ctx.Done():
			return
		case <-ticks:
		}
		for i, k := range keys {
			changed, err := k.refresh(ctx)
			switch {
			case err != nil && ctx.Err() == nil:
				failing[i].Do(func() {
					log.Warn("cannot read "+k.what+" again; the one in force is kept", "namespace", namespace, "error", err.Error())
				})
			case err == nil && changed:
				log.Warn(k.changed, "namespace", namespace)
			}
		}
	}
}
