package rpc

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"sort"
	"strings"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"
	"k8s.io/apimachinery/pkg/labels"

	ebv1 "github.com/kubectl-etcdbackup/kubectl-etcdbackup/api/etcdbackup/v1"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/server/auth"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/server/jobs"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/storage"
)

// Pages of ListBackups.
const (
	DefaultPageSize = 500
	MaxPageSize     = 1000
	// maxPageBytes keeps a page well under the 4 MiB a gRPC client
	// receives by default, whatever the backups' labels.
	maxPageBytes = 2 << 20
)

// ListBackups implements ebv1.BackupServiceServer.
func (s *Service) ListBackups(ctx context.Context, req *ebv1.ListBackupsRequest) (*ebv1.ListBackupsResponse, error) {
	locName, loc, err := s.location(req.GetLocation())
	if err != nil {
		return nil, err
	}
	sel, err := labels.Parse(req.GetLabelSelector())
	if err != nil {
		return nil, status.Errorf(codes.InvalidArgument, "label selector %q: %v", req.GetLabelSelector(), err)
	}
	if req.GetPageSize() < 0 {
		return nil, status.Errorf(codes.InvalidArgument, "page size %d is negative", req.GetPageSize())
	}
	var after *pageToken
	if t := req.GetPageToken(); t != "" {
		if after, err = parsePageToken(t, locName, req.GetLabelSelector()); err != nil {
			return nil, err
		}
	}
	manifests, err := loc.List(ctx)
	if err != nil {
		return nil, storageStatus("list", locName, "", err)
	}
	manifests, segments := storage.SplitSegments(manifests)
	chains := storage.Chains(segments)
	if c := req.GetChain(); c != "" {
		return listChain(locName, chains[c], after, req)
	}
	runs, err := s.runs(ctx, locName)
	if err != nil {
		return nil, err
	}
	resp := &ebv1.ListBackupsResponse{}
	for _, m := range manifests {
		delete(runs, m.Name)
		if sel.Matches(labels.Set(m.Labels)) {
			b := backupFromManifest(locName, m)
			withChain(b, m, chains)
			resp.Backups = append(resp.Backups, b)
		}
	}
	for _, b := range runs {
		if sel.Matches(labels.Set(b.GetLabels())) {
			resp.Backups = append(resp.Backups, b)
		}
	}
	// The listing order (ebv1.ListedBefore): names are unique in a
	// location, so it is total, and a page token (the last backup's
	// create time and name) says where the next page starts even when
	// backups were added or deleted in between.
	ebv1.SortBackups(resp.Backups)
	return page(resp.Backups, after, locName, req)
}

// pageToken is where a page ended, and what it listed: a token is only
// good for the same listing.
type pageToken struct {
	Location string    `json:"l"`
	Selector string    `json:"s,omitempty"`
	Time     time.Time `json:"t"`
	Name     string    `json:"n"`
}

func parsePageToken(s, location, selector string) (*pageToken, error) {
	var t pageToken
	b, err := base64.RawURLEncoding.DecodeString(s)
	if err == nil {
		err = json.Unmarshal(b, &t)
	}
	if err != nil {
		return nil, status.Error(codes.InvalidArgument, "page token is not one this server returned; list again without it")
	}
	if t.Location != location || t.Selector != selector {
		return nil, status.Errorf(codes.InvalidArgument,
			"page token is of a listing of location %q with selector %q, not of %q with %q; list again without it", t.Location, t.Selector, location, selector)
	}
	return &t, nil
}

// page returns the sorted backups after the token's, up to the request's
// page size and maxPageBytes, and a token for the rest.
func page(sorted []*ebv1.Backup, after *pageToken, location string, req *ebv1.ListBackupsRequest) (*ebv1.ListBackupsResponse, error) {
	if after != nil {
		last := &ebv1.Backup{Name: after.Name, CreateTime: timestamppb.New(after.Time)}
		sorted = sorted[sort.Search(len(sorted), func(i int) bool { return ebv1.ListedBefore(last, sorted[i]) }):]
	}
	size := int(req.GetPageSize())
	if size == 0 {
		size = DefaultPageSize
	}
	size = min(size, MaxPageSize)
	resp := &ebv1.ListBackupsResponse{}
	total := 0
	for _, b := range sorted {
		n := proto.Size(b)
		if len(resp.Backups) == size || (len(resp.Backups) > 0 && total+n > maxPageBytes) {
			break
		}
		resp.Backups = append(resp.Backups, b)
		total += n
	}
	if len(resp.Backups) < len(sorted) {
		last := resp.Backups[len(resp.Backups)-1]
		b, err := json.Marshal(pageToken{Location: location, Selector: req.GetLabelSelector(), Time: last.GetCreateTime().AsTime(), Name: last.GetName()})
		if err != nil {
			return nil, ebv1.ServerErrorf(codes.Internal, "page token: %v", err)
		}
		resp.NextPageToken = base64.RawURLEncoding.EncodeToString(b)
	}
	return resp, nil
}

// GetBackup implements ebv1.BackupServiceServer.
func (s *Service) GetBackup(ctx context.Context, req *ebv1.GetBackupRequest) (*ebv1.GetBackupResponse, error) {
	if err := validateName("backup", req.GetName()); err != nil {
		return nil, err
	}
	locName, loc, err := s.location(req.GetLocation())
	if err != nil {
		return nil, err
	}
	// An agent learns nothing of other backups, not even whether one
	// exists: it is refused before any lookup.
	if a, ok := auth.AgentFrom(ctx); ok && (a.Kind != auth.AgentDelta || a.Backup != req.GetName() || a.Location != locName) {
		return nil, status.Errorf(codes.PermissionDenied, "%s may read only its chain's backup %q in location %q", a, a.Backup, a.Location)
	}
	m, err := loc.Stat(ctx, req.GetName())
	if errors.Is(err, storage.ErrNotFound) {
		if b := s.run(ctx, locName, req.GetName()); b != nil {
			return &ebv1.GetBackupResponse{Backup: b}, nil
		}
	}
	if err != nil {
		return nil, storageStatus("get", locName, req.GetName(), err)
	}
	b := backupFromManifest(locName, m)
	if !m.IsSegment() && m.OfTarget(m.Source.Target) && s.capturesDeltas(m.Source.Target) {
		// The chain is in the listing: read it only for targets that
		// have one.
		all, err := loc.List(ctx)
		if err != nil {
			return nil, storageStatus("list", locName, "", err)
		}
		_, segments := storage.SplitSegments(all)
		withChain(b, m, storage.Chains(segments))
	}
	return &ebv1.GetBackupResponse{Backup: b}, nil
}

// capturesDeltas says whether target is configured with deltas.
func (s *Service) capturesDeltas(target string) bool {
	for _, t := range s.targets {
		if t.Name == target && target != "" {
			return t.Deltas != nil
		}
	}
	return false
}

// listChain answers ListBackups for a chain: every stored segment that
// names it as its full backup, contiguous or not (the caller orders them
// by revision and keeps what follows the full: delta.Contiguous).
func listChain(locName string, segs []*storage.Manifest, after *pageToken, req *ebv1.ListBackupsRequest) (*ebv1.ListBackupsResponse, error) {
	var all []*ebv1.Backup
	for _, m := range segs {
		all = append(all, backupFromManifest(locName, m))
	}
	// Paged in the listing's order, as backups are; the caller orders by
	// revision.
	ebv1.SortBackups(all)
	return page(all, after, locName, req)
}

// DeleteBackup implements ebv1.BackupServiceServer.
func (s *Service) DeleteBackup(ctx context.Context, req *ebv1.DeleteBackupRequest) (*ebv1.DeleteBackupResponse, error) {
	if err := validateName("backup", req.GetName()); err != nil {
		return nil, err
	}
	locName, loc, err := s.location(req.GetLocation())
	if err != nil {
		return nil, err
	}
	if chain, ok := storage.ChainOf(req.GetName()); ok {
		if m, err := loc.Stat(ctx, req.GetName()); err == nil && m.IsSegment() {
			return nil, status.Errorf(codes.FailedPrecondition,
				"%q is a delta segment of backup %q's chain: segments go only with their full backup; delete %q to remove the chain", req.GetName(), chain, chain)
		}
	}
	if err := s.checkNoRestoreReads(ctx, locName, req.GetName()); err != nil {
		return nil, err
	}
	if err := loc.Delete(ctx, req.GetName()); err != nil {
		return nil, storageStatus("delete", locName, req.GetName(), err)
	}
	s.inUse.Removed(ctx, locName, req.GetName(), s.log)
	if all, err := loc.List(ctx); err == nil {
		_, segments := storage.SplitSegments(all)
		if n, err := storage.DeleteChain(ctx, loc, segments, req.GetName()); err != nil || n > 0 {
			s.log.Info("delta chain removed with its backup", "location", locName, "backup", req.GetName(), "segments", n, "error", err)
		}
	}
	s.log.Info("backup deleted", "location", locName, "backup", req.GetName(), "caller", caller(ctx))
	return &ebv1.DeleteBackupResponse{}, nil
}

// checkNoRestoreReads refuses to delete a backup a running restore Job
// reads: its agent would find it gone, or, if it were uploaded again,
// not the content the restore was started for.
func (s *Service) checkNoRestoreReads(ctx context.Context, locName, name string) error {
	running, err := s.inUse.RestoresReading(ctx, locName, name, "deleting")
	if err != nil {
		return err
	}
	if len(running) > 0 {
		ns, job, _ := strings.Cut(running[0], "/")
		return status.Errorf(codes.FailedPrecondition,
			"backup %q in location %q is being restored by Job %s; wait for the restore to finish, or abandon it with `kubectl -n %s delete job %s`, then delete the backup",
			name, locName, strings.Join(running, ", "), ns, job)
	}
	return nil
}

// runs returns the agent runs of location whose backup is not stored, as
// backups in phase RUNNING or FAILED. A run that succeeded has its backup
// stored and listed from storage instead.
func (s *Service) runs(ctx context.Context, locName string) (map[string]*ebv1.Backup, error) {
	if s.agents == nil {
		return nil, nil
	}
	runs, err := s.agents.List(ctx)
	if err != nil {
		return nil, ebv1.ServerErrorf(codes.Unavailable, "list backup agents: %v", err)
	}
	out := map[string]*ebv1.Backup{}
	for _, r := range runs {
		if r.Location != locName {
			continue
		}
		b := &ebv1.Backup{
			Name: r.Name, Location: r.Location, Message: r.Message,
			CreateTime: timestamppb.New(r.StartTime),
			Source:     &ebv1.BackupSource{Kind: ebv1.SourceAgent, Target: r.Target, StartTime: timestamppb.New(r.StartTime)},
		}
		switch r.Phase {
		case jobs.PhaseRunning:
			b.Phase = ebv1.BackupPhase_BACKUP_PHASE_RUNNING
		case jobs.PhaseFailed:
			b.Phase = ebv1.BackupPhase_BACKUP_PHASE_FAILED
		case jobs.PhaseSucceeded:
			// Stored, or about to be listed; if storage lacks it after the
			// agent exited 0, something is badly wrong: say so.
			b.Phase = ebv1.BackupPhase_BACKUP_PHASE_FAILED
			b.Message = "the agent finished but the backup is not in storage"
		}
		out[r.Name] = b
	}
	return out, nil
}

// run returns the agent run of a backup that is not stored, or nil.
func (s *Service) run(ctx context.Context, locName, name string) *ebv1.Backup {
	runs, err := s.runs(ctx, locName)
	if err != nil {
		return nil
	}
	return runs[name]
}
