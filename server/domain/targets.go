package domain

import (
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/server/config"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/server/schedule"
)

// Targets are the configured etcd targets in order; the first is the
// default.
type Targets []config.Target

// Get resolves a target a request names ("" is the default):
// ErrNoTargets when there are none, a *NotConfiguredError when there is
// none of the name.
func (ts Targets) Get(name string) (*config.Target, error) {
	if len(ts) == 0 {
		return nil, ErrNoTargets
	}
	if name == "" {
		return &ts[0], nil
	}
	for i := range ts {
		if ts[i].Name == name {
			return &ts[i], nil
		}
	}
	return nil, &NotConfiguredError{Kind: KindTarget, Name: name, Have: ts.Names()}
}

// ReservedBy is the target whose own backups' names have the form of
// name — its scheduled runs' (TARGET-YYYYMMDD-HHMMSS), its delta chain
// bases' (TARGET-chain-YYYYMMDD-HHMMSS) or its folds' (TARGET-fold-N) —
// and which of them: only the server may take such a name, which, taken
// by anything else, would stop that run or be counted by retention.
func (ts Targets) ReservedBy(name string) (target, kind string, ok bool) {
	for _, t := range ts {
		if kind, ok := schedule.Automatic(t.Name, name); ok {
			return t.Name, kind, true
		}
	}
	return "", "", false
}

// Names are the targets' names in order.
func (ts Targets) Names() []string {
	var out []string
	for _, t := range ts {
		out = append(out, t.Name)
	}
	return out
}
