package domain

import "github.com/kubectl-etcdbackup/kubectl-etcdbackup/server/config"

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

// Names are the targets' names in order.
func (ts Targets) Names() []string {
	var out []string
	for _, t := range ts {
		out = append(out, t.Name)
	}
	return out
}
