package retention

import (
	"context"
	"fmt"
	"log/slog"

	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/server/config"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/server/coord"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/server/domain"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/server/jobs"
)

// InUse knows which backups must not be removed now: those being sent
// (downloads, on this replica or, with coord.Leases, on any), and those a
// running restore Job reads. It also knows those retention is removing,
// so that neither happens to the other: retention keeps a backup being
// downloaded, and a download of a backup being removed is refused.
type InUse struct {
	agents  *jobs.Launcher // nil: no restore Jobs
	targets []config.Target
	coord   coord.Registry
}

// NewInUse returns a registry on reg (nil: coord.NewLocal, this replica
// alone); agents (nil when the server launches none) finds the restore
// Jobs of targets.
func NewInUse(agents *jobs.Launcher, targets []config.Target, reg coord.Registry) *InUse {
	if reg == nil {
		reg = coord.NewLocal()
	}
	return &InUse{agents: agents, targets: targets, coord: reg}
}

// Download marks a download of loc/name; done ends it.
func (u *InUse) Download(ctx context.Context, loc, name string) (done func(), err error) {
	return u.coord.Send(ctx, loc, name)
}

// remove marks loc/name as being removed, unless it is being downloaded
// (ok false); an error means that cannot be told, and the backup stays.
func (u *InUse) remove(ctx context.Context, loc, name string) (done func(), ok bool, err error) {
	return u.coord.Remove(ctx, loc, name)
}

// Removed tells the agent Jobs that backup name in location loc is gone
// (deleted, or removed by retention), so that its finished Job does not
// show it again as a Failed run. A failure is only logged: the backup is
// gone either way.
func (u *InUse) Removed(ctx context.Context, loc, name string, log *slog.Logger) {
	if u.agents == nil {
		return
	}
	if err := u.agents.ForgetBackup(ctx, loc, name); err != nil {
		log.Warn("the finished agent Job of a removed backup is kept; list may show the backup as failed until the Job expires",
			"location", loc, "backup", name, "error", err)
	}
}

// RestoresReading returns the running restore Jobs ("namespace/name")
// that read backup name in location loc: removing it would pull it from
// under their agents, or, were it uploaded again, give them other
// content than the restore was started for. Deletion and retention both
// ask it; doing ("deleting", "removing") is what the caller was about to
// do, for the *domain.ClusterError when the Jobs cannot be listed.
func (u *InUse) RestoresReading(ctx context.Context, loc, name, doing string) ([]string, error) {
	if u.agents == nil {
		return nil, nil
	}
	running, err := u.agents.RunningRestores(ctx, loc, name, u.targets)
	if err != nil {
		return nil, &domain.ClusterError{Err: fmt.Errorf("cannot check for restores of backup %q before %s it: %w", name, doing, err)}
	}
	return running, nil
}
