package readpath

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"sort"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"
	"k8s.io/apimachinery/pkg/labels"

	ebv1 "github.com/kubectl-etcdbackup/kubectl-etcdbackup/api/etcdbackup/v1"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/server/rpc/internal/edge"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/storage"
)

// Pages of ListBackups.
const (
	defaultPageSize = 500
	maxPageSize     = 1000
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
	if after != nil {
		if sorted := s.paged.get(after.Listing, locName, listingKey(req), s.now()); sorted != nil {
			return s.page(sorted, after, locName, req, after.Listing)
		}
	}
	// The location's agent runs (an API request, on the data server)
	// are asked for while the location is listed.
	type listedRuns struct {
		runs map[string]*ebv1.Backup
		err  error
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	runsc := make(chan listedRuns, 1)
	if req.GetChain() == "" {
		go func() {
			runs, err := s.runs(ctx, locName)
			runsc <- listedRuns{runs, err}
		}()
	}
	manifests, err := loc.List(ctx)
	if err != nil {
		return nil, edge.StorageStatus("list", locName, "", err)
	}
	manifests, parts := storage.SplitParts(manifests)
	chains, kits := storage.Chains(parts), storage.Kits(parts)
	if c := req.GetChain(); c != "" {
		return s.page(listChain(locName, chains[c]), after, locName, req, "")
	}
	r := <-runsc
	if r.err != nil {
		return nil, r.err
	}
	runs := r.runs
	copies := s.listCopies(ctx, loc, "")
	resp := &ebv1.ListBackupsResponse{}
	for _, m := range manifests {
		delete(runs, m.Name)
		if sel.Matches(labels.Set(m.Labels)) {
			b := edge.Backup(locName, m)
			edge.WithChain(b, m, chains)
			edge.WithKit(b, kits[m.Name], false)
			copies.set(b, m, s.copies)
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
	return s.page(resp.Backups, after, locName, req, "")
}

// listingKey is what, beside the location, a kept listing is of.
func listingKey(req *ebv1.ListBackupsRequest) string {
	return req.GetLabelSelector() + "\x00" + req.GetChain()
}

// pageToken is where a page ended, and what it listed: a token is only
// good for the same listing.
type pageToken struct {
	Location string    `json:"l"`
	Selector string    `json:"s,omitempty"`
	Time     time.Time `json:"t"`
	Name     string    `json:"n"`
	// Listing names the listing this server keeps for the next pages
	// (pages.go); one it no longer keeps is listed again.
	Listing string `json:"k,omitempty"`
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
// page size and maxPageBytes, and a token for the rest. The whole sorted
// listing is kept for the next pages, under listing (kept already) or a
// new ID.
func (s *Service) page(all []*ebv1.Backup, after *pageToken, location string, req *ebv1.ListBackupsRequest, listing string) (*ebv1.ListBackupsResponse, error) {
	sorted := all
	if after != nil {
		last := &ebv1.Backup{Name: after.Name, CreateTime: timestamppb.New(after.Time)}
		sorted = sorted[sort.Search(len(sorted), func(i int) bool { return ebv1.ListedBefore(last, sorted[i]) }):]
	}
	size := int(req.GetPageSize())
	if size == 0 {
		size = defaultPageSize
	}
	size = min(size, maxPageSize)
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
	if len(resp.Backups) == len(sorted) {
		if listing != "" {
			s.paged.done(listing)
		}
		return resp, nil
	}
	if listing == "" {
		listing = s.paged.keep(location, listingKey(req), all, s.now())
	}
	last := resp.Backups[len(resp.Backups)-1]
	b, err := json.Marshal(pageToken{Location: location, Selector: req.GetLabelSelector(), Time: last.GetCreateTime().AsTime(), Name: last.GetName(), Listing: listing})
	if err != nil {
		return nil, ebv1.ServerErrorf(codes.Internal, "page token: %v", err)
	}
	resp.NextPageToken = base64.RawURLEncoding.EncodeToString(b)
	return resp, nil
}

// GetBackup implements ebv1.BackupServiceServer.
func (s *Service) GetBackup(ctx context.Context, req *ebv1.GetBackupRequest) (*ebv1.GetBackupResponse, error) {
	if err := edge.ValidateName("backup", req.GetName()); err != nil {
		return nil, err
	}
	locName, loc, err := s.location(req.GetLocation())
	if err != nil {
		return nil, err
	}
	// An agent learns nothing of other backups, not even whether one
	// exists: it is refused before any lookup.
	if may := s.hooks.MayGet; may != nil {
		if err := may(ctx, req.GetName(), locName); err != nil {
			return nil, err
		}
	}
	m, err := loc.Stat(ctx, req.GetName())
	if errors.Is(err, storage.ErrNotFound) {
		if b := s.run(ctx, locName, req.GetName()); b != nil {
			return &ebv1.GetBackupResponse{Backup: b}, nil
		}
	}
	if err != nil {
		return nil, edge.StorageStatus("get", locName, req.GetName(), err)
	}
	b := edge.Backup(locName, m)
	s.listCopies(ctx, loc, m.Name).set(b, m, s.copies)
	if !m.IsSegment() && !m.IsKit() {
		if k, err := loc.Stat(ctx, storage.KitName(m.Name)); err == nil && k.IsKit() {
			edge.WithKit(b, k, true)
		}
	}
	if !m.IsSegment() && m.OfTarget(m.Source.Target) && s.capturesDeltas(m.Source.Target) {
		// The chain is in the listing: read it only for targets that
		// have one.
		all, err := loc.List(ctx)
		if err != nil {
			return nil, edge.StorageStatus("list", locName, "", err)
		}
		_, segments := storage.SplitParts(all)
		edge.WithChain(b, m, storage.Chains(segments))
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

// listChain is ListBackups's answer for a chain: every stored segment
// that names it as its full backup, contiguous or not (the caller orders
// them by revision and keeps what follows the full: delta.Contiguous),
// sorted to be paged in the listing's order, as backups are.
func listChain(locName string, segs []*storage.Manifest) []*ebv1.Backup {
	var all []*ebv1.Backup
	for _, m := range segs {
		all = append(all, edge.Backup(locName, m))
	}
	ebv1.SortBackups(all)
	return all
}
