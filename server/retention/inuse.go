package retention

import (
	"context"
	"log/slog"
	"sync"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	ebv1 "github.com/kubectl-etcdbackup/kubectl-etcdbackup/api/etcdbackup/v1"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/server/config"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/server/jobs"
)

// InUse knows which backups must not be removed now: those this server
// is sending (downloads), and those a running restore Job reads. It also
// tracks those retention is removing, so that neither happens to the
// other: retention keeps a backup being downloaded, and a download of a
// backup being removed is refused.
type InUse struct {
	agents  *jobs.Launcher // nil: no restore Jobs
	targets []config.Target

	mu        sync.Mutex
	downloads map[string]int
	removing  map[string]bool
}

// NewInUse returns an empty registry; agents (nil when the server
// launches none) finds the restore Jobs of targets.
func NewInUse(agents *jobs.Launcher, targets []config.Target) *InUse {
	return &InUse{agents: agents, targets: targets}
}

// Download marks a download of loc/name; done ends it.
func (u *InUse) Download(loc, name string) (done func(), err error) {
	key := loc + "/" + name
	u.mu.Lock()
	defer u.mu.Unlock()
	if u.removing[key] {
		return nil, status.Errorf(codes.NotFound, "backup %q in location %q is being removed by retention", name, loc)
	}
	if u.downloads == nil {
		u.downloads = map[string]int{}
	}
	u.downloads[key]++
	return func() {
		u.mu.Lock()
		defer u.mu.Unlock()
		if u.downloads[key]--; u.downloads[key] == 0 {
			delete(u.downloads, key)
		}
	}, nil
}

// remove marks loc/name as being removed, unless it is being downloaded.
func (u *InUse) remove(loc, name string) (done func(), ok bool) {
	key := loc + "/" + name
	u.mu.Lock()
	defer u.mu.Unlock()
	if u.downloads[key] > 0 {
		return nil, false
	}
	if u.removing == nil {
		u.removing = map[string]bool{}
	}
	u.removing[key] = true
	return func() {
		u.mu.Lock()
		defer u.mu.Unlock()
		delete(u.removing, key)
	}, true
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
// do, for the Unavailable error when the Jobs cannot be listed.
func (u *InUse) RestoresReading(ctx context.Context, loc, name, doing string) ([]string, error) {
	if u.agents == nil {
		return nil, nil
	}
	running, err := u.agents.RunningRestores(ctx, loc, name, u.targets)
	if err != nil {
		return nil, ebv1.ServerErrorf(codes.Unavailable, "cannot check for restores of backup %q before %s it: %v", name, doing, err)
	}
	return running, nil
}
