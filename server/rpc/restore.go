package rpc

import (
	"context"
	"errors"
	"fmt"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	apierrors "k8s.io/apimachinery/pkg/api/errors"

	ebv1 "github.com/kubectl-etcdbackup/kubectl-etcdbackup/api/etcdbackup/v1"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/delta"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/ledger"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/server/config"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/server/jobs"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/server/liveness"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/server/rpc/internal/edge"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/snapshot"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/storage"
)

// restoreTarget resolves and checks the target of a restore request.
func (s *Service) restoreTarget(name string) (*config.Target, error) {
	if s.agents == nil {
		return nil, status.Error(codes.FailedPrecondition,
			"this server cannot launch restore agents (it runs outside a cluster or without an agent image); restore each member with `kubectl etcdbackup restore NAME --local` instead")
	}
	if name == "" {
		return nil, status.Error(codes.InvalidArgument, "name the etcd target to restore (--target); see `kubectl etcdbackup version` for the server's targets")
	}
	t, err := s.target(name)
	if err != nil {
		return nil, err
	}
	if len(t.Members) == 0 {
		return nil, status.Errorf(codes.FailedPrecondition,
			"target %q has no members in the server's configuration, so the server does not know where their data lives; add `members:` (name, peerURL, volume) to the target, or restore each member with `kubectl etcdbackup restore NAME --local`", t.Name)
	}
	return t, nil
}

// plan is one entry per member of t.
func (s *Service) plan(t *config.Target, locName, name string) []*ebv1.MemberRestore {
	ic := jobs.InitialCluster(*t)
	out := make([]*ebv1.MemberRestore, 0, len(t.Members))
	for _, m := range t.Members {
		out = append(out, &ebv1.MemberRestore{
			Member: m.Name, JobName: s.agents.RestoreNamespace(*t) + "/" + jobs.RestoreJobName(locName, name, t.Name, m.Name),
			Volume: jobs.DescribeVolume(m), DataDir: m.DataDir, InitialCluster: ic, PeerUrl: m.PeerURL,
			InitialClusterToken: t.InitialClusterToken,
		})
	}
	return out
}

// revisionBump is what a restore request adds to etcd's revision: its
// bump_revision, unset meaning snapshot.DefaultRevisionBump (a client that
// predates the field still gets what etcd recommends for Kubernetes).
func revisionBump(req *ebv1.RestoreBackupRequest) (int64, error) {
	if req.BumpRevision == nil {
		return snapshot.DefaultRevisionBump, nil
	}
	b := req.GetBumpRevision()
	if b < 0 {
		return 0, status.Errorf(codes.InvalidArgument,
			"--bump-revision %d is negative: etcd's revision only grows; give 0 to keep the snapshot's revisions, or a positive amount (default %d)", b, snapshot.DefaultRevisionBump)
	}
	return b, nil
}

// RestoreBackup implements ebv1.BackupServiceServer: admit the request,
// plan one restore per member, and unless it is a dry run, start the
// restore Jobs once every member is seen stopped.
func (s *Service) RestoreBackup(ctx context.Context, req *ebv1.RestoreBackupRequest) (*ebv1.RestoreBackupResponse, error) {
	r, err := s.admitRestore(ctx, req)
	if err != nil {
		return nil, err
	}
	plan := s.plan(r.target, r.locName, r.name)
	for _, p := range plan {
		p.BumpRevision, p.MarkCompacted = r.bump, r.bump > 0
	}
	resp := &ebv1.RestoreBackupResponse{Members: plan}
	if r.point != nil {
		resp.Backup, resp.Segments, resp.ToRevision, resp.Warnings = r.name, r.point.names(), r.point.toRevision, r.point.warnings
		for _, w := range r.point.warnings {
			s.log.Warn("restore to a point: "+w, "target", r.target.Name, "point", r.pointAt.String())
		}
	}
	seen := liveness.Members(ctx, s.agents, r.target)
	if req.GetDryRun() {
		for _, p := range plan {
			p.Phase = ebv1.RestorePhase_RESTORE_PHASE_PENDING
			for _, f := range seen {
				// A finding about the whole target (pods that cannot be
				// listed, an endpoint in doubt) concerns every member.
				if p.Message == "" && (f.Member == p.GetMember() || (f.Member == "" && f.URL == "")) {
					p.Message = f.DryRunMessage()
				}
			}
		}
		return resp, nil
	}
	if err := liveness.RefuseUnlessStopped(s.agents, r.target, seen); err != nil {
		return nil, err
	}
	if err := s.stopDeltaAgents(ctx, r.target.Name); err != nil {
		return nil, err
	}
	created, err := s.startRestore(ctx, req, r)
	if err != nil {
		return nil, err
	}
	for _, p := range plan {
		p.Phase = ebv1.RestorePhase_RESTORE_PHASE_RUNNING
	}
	s.record(ctx, r.locName, ledger.Entry{Action: ledger.ActionRestore, Backup: r.name, SHA256: r.stored.SHA256, Who: caller(ctx),
		Detail: fmt.Sprintf("target %s, %d member(s)", r.target.Name, created)})
	s.log.Info("restore agents started", "backup", r.name, "location", r.locName, "target", r.target.Name, "jobs", created, "bumpRevision", r.bump,
		"toRevision", resp.GetToRevision(), "toTime", r.pointAt.Time, "segments", len(resp.GetSegments()), "caller", caller(ctx))
	return resp, nil
}

// stopDeltaAgents stops target's delta agents before its restore: what
// they hold is stored, and the chain is not continued into the restored
// etcd unless the agent that starts next finds the chain's newest
// revision there as the chain holds it (agents/delta checks etcd's
// cluster, revision and that write at every start). A restore with a
// revision bump marks the revisions in between compacted, which ends
// the chain; one without goes back, which ends it as a history break.
func (s *Service) stopDeltaAgents(ctx context.Context, target string) error {
	runs, err := s.agents.Deltas(ctx)
	if err != nil {
		return ebv1.ServerErrorf(codes.Unavailable, "list the delta agents of target %q to stop them before its restore: %v; try again", target, err)
	}
	for _, r := range runs {
		if r.Target != target || r.Phase != jobs.PhaseRunning {
			continue
		}
		if err := s.agents.StopDelta(ctx, r.JobName); err != nil {
			return ebv1.ServerErrorf(codes.Unavailable, "stop delta agent %s of target %q before its restore: %v; try again", r.JobName, target, err)
		}
		s.log.Info("delta agent stopped for a restore of its target", "target", target, "job", r.JobName, "chain", r.Chain)
	}
	return nil
}

// restore is an admitted restore request.
type restore struct {
	target *config.Target
	// name is the backup restored: the request's, or for a restore to a
	// point the full backup planned.
	name    string
	locName string
	// stored is the backup's manifest: the agents may restore exactly it.
	stored *storage.Manifest
	bump   int64
	// secret names the Secret holding the age identity, for an
	// encrypted backup.
	secret string
	// point is a restore to a point's plan (nil otherwise), pointAt the
	// point itself.
	point   *pointPlan
	pointAt delta.Point
}

// admitRestore checks a restore request: the backup's name, the revision
// bump, a target the server can restore (restoreTarget), the backup
// stored, an identity Secret when it is encrypted, and data directories
// that --move-aside can rename. A restore to a point is planned here: the
// backup is then the full backup the plan picks (among the target's, or
// only the request's name when given).
func (s *Service) admitRestore(ctx context.Context, req *ebv1.RestoreBackupRequest) (*restore, error) {
	point, toPoint, err := pointOf(req)
	if err != nil {
		return nil, err
	}
	if req.GetName() != "" || !toPoint {
		if err := edge.ValidateName("backup", req.GetName()); err != nil {
			return nil, err
		}
	}
	bump, err := revisionBump(req)
	if err != nil {
		return nil, err
	}
	t, err := s.restoreTarget(req.GetTarget())
	if err != nil {
		return nil, err
	}
	name := req.GetName()
	locName, loc, err := s.location(req.GetLocation())
	if err != nil {
		return nil, err
	}
	var pp *pointPlan
	var m *storage.Manifest
	if toPoint {
		if pp, err = s.planPoint(ctx, locName, loc, t.Name, name, point); err != nil {
			return nil, err
		}
		m, name = pp.full, pp.full.Name
	} else if m, err = loc.Stat(ctx, name); err != nil {
		return nil, edge.StorageStatus("restore backup", locName, name, err)
	}
	encrypted := m.Encryption != ""
	if pp != nil {
		for _, sm := range pp.segments {
			encrypted = encrypted || sm.Encryption != ""
		}
	}
	secret := req.GetIdentitySecret()
	if secret != "" {
		if err := edge.ValidateName("identity Secret", secret); err != nil {
			return nil, err
		}
	}
	if encrypted && secret == "" {
		return nil, status.Errorf(codes.FailedPrecondition,
			"backup %q (or its delta segments) is age-encrypted and the server holds no key: create a Secret with your age identity file in namespace %q (`kubectl -n %s create secret generic etcd-backup-identity --from-file=identity=KEYFILE`) and pass --identity-secret etcd-backup-identity; it is mounted only into the restore Jobs",
			name, s.agents.RestoreNamespace(*t), s.agents.RestoreNamespace(*t))
	}
	if req.GetMoveAside() {
		for _, m := range t.Members {
			if m.DataDir == "" {
				return nil, status.Errorf(codes.InvalidArgument,
					"member %q's data directory is the root of its volume, which cannot be renamed: --move-aside needs a dataDir below the volume's root in the target's configuration", m.Name)
			}
		}
	}
	return &restore{target: t, name: name, locName: locName, stored: m, bump: bump, secret: secret, point: pp, pointAt: point}, nil
}

// startRestore creates the restore Jobs, one per member, and returns how
// many it created.
func (s *Service) startRestore(ctx context.Context, req *ebv1.RestoreBackupRequest, r *restore) (int, error) {
	name, t := r.name, r.target
	spec := jobs.RestoreSpec{
		Name: name, Location: r.locName, Target: *t, MoveAside: req.GetMoveAside(), IdentitySecret: r.secret,
		// What the agents may restore: exactly the backup stored now.
		SHA256:        r.stored.SHA256,
		BumpRevision:  r.bump,
		SnapshotBytes: r.stored.PlainSize(),
	}
	if r.point != nil {
		// And replay exactly the segments planned, each as stored now.
		p := r.point.replay
		spec.ToRevision, spec.ToTime, spec.ToMinRevision, spec.Segments, spec.AllowLeaseLoss = p.Revision, p.Time, p.MinRevision, r.point.pins(), req.GetAllowLeaseLoss()
		for _, m := range r.point.segments {
			spec.SnapshotBytes += m.PlainSize()
		}
	}
	created, err := s.agents.StartRestore(ctx, spec)
	if errors.Is(err, jobs.ErrRunning) {
		return 0, status.Errorf(codes.AlreadyExists,
			"a restore of backup %q into target %q is still running; wait for it with `kubectl etcdbackup restore %s --target %s --wait` after it ends, or follow `kubectl -n %s get jobs -l app.kubernetes.io/component=restore-agent`",
			name, t.Name, name, t.Name, s.agents.RestoreNamespace(*t))
	}
	if apierrors.IsNotFound(err) || apierrors.IsForbidden(err) {
		return 0, status.Errorf(codes.FailedPrecondition,
			"start restore agents for %q in namespace %s: %v; that namespace must exist with a ServiceAccount %s and a Role letting the server manage Jobs there (manifests/restore-namespace/ for hostPath members, the Role documented in manifests/server.yaml for claims)",
			name, s.agents.RestoreNamespace(*t), err, config.DefaultServiceAccount)
	}
	if err != nil {
		return 0, ebv1.ServerErrorf(codes.Internal, "start restore agents for %q: %v", name, err)
	}
	return len(created), nil
}

// GetRestore implements ebv1.BackupServiceServer.
func (s *Service) GetRestore(ctx context.Context, req *ebv1.GetRestoreRequest) (*ebv1.GetRestoreResponse, error) {
	if err := edge.ValidateName("backup", req.GetName()); err != nil {
		return nil, err
	}
	t, err := s.restoreTarget(req.GetTarget())
	if err != nil {
		return nil, err
	}
	locName, _, err := s.location(req.GetLocation())
	if err != nil {
		return nil, err
	}
	runs, err := s.agents.ListRestores(ctx, locName, req.GetName(), *t)
	if err != nil {
		return nil, ebv1.ServerErrorf(codes.Unavailable, "list restore agents: %v", err)
	}
	if len(runs) == 0 {
		return nil, status.Errorf(codes.NotFound,
			"no restore of backup %q from location %q into target %q: it was never started, or its Jobs were cleaned up (finished Jobs are kept for a day)", req.GetName(), locName, t.Name)
	}
	plan := s.plan(t, locName, req.GetName())
	for _, p := range plan {
		r, ok := runs[p.GetMember()]
		if !ok {
			p.Phase = ebv1.RestorePhase_RESTORE_PHASE_FAILED
			p.Message = "no restore Job for this member (deleted?); start the restore again"
			continue
		}
		p.Phase, p.Message = restorePhases[r.Phase], r.Message
		// What the member's Job was started with (its annotation).
		p.BumpRevision, p.MarkCompacted = r.BumpRevision, r.BumpRevision > 0
	}
	return &ebv1.GetRestoreResponse{Members: plan}, nil
}

// restorePhases is a member's phase as its restore Job's says.
var restorePhases = map[jobs.Phase]ebv1.RestorePhase{
	jobs.PhaseRunning:   ebv1.RestorePhase_RESTORE_PHASE_RUNNING,
	jobs.PhaseSucceeded: ebv1.RestorePhase_RESTORE_PHASE_SUCCEEDED,
	jobs.PhaseFailed:    ebv1.RestorePhase_RESTORE_PHASE_FAILED,
}
