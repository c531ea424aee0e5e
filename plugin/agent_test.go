package plugin

import (
	"context"
	"sync"

	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/api/agentjob"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/server/auth"
)

// agentAs is an agent guard that admits every call as the agent it is
// set to: the test plays the server's agents, whose uploads alone are
// stored as a target's (and, when the Job says so, scheduled) backups.
type agentAs struct {
	mu sync.Mutex
	a  auth.Agent
}

// set makes the next calls those of a backup agent of target storing
// backup in location "default".
func (g *agentAs) set(target, backup string, scheduled bool) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.a = auth.Agent{Kind: agentjob.Backup, JobNamespace: serverNS, JobName: "backup-" + backup,
		Backup: backup, Location: "default", Target: target, Scheduled: scheduled}
}

// setAt is set for a backup stored in location.
func (g *agentAs) setAt(target, backup, location string) {
	g.set(target, backup, false)
	g.mu.Lock()
	defer g.mu.Unlock()
	g.a.Location = location
}

// Admit implements auth.Guard.
func (g *agentAs) Admit(ctx context.Context, _ string) (context.Context, error) {
	g.mu.Lock()
	a := g.a
	g.mu.Unlock()
	return auth.WithAgent(ctx, &a), nil
}
