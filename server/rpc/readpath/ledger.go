package readpath

import (
	"context"
	"errors"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	ebv1 "github.com/kubectl-etcdbackup/kubectl-etcdbackup/api/etcdbackup/v1"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/server/domain"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/server/rpc/internal/edge"
)

// MaxLedgerPage is the most records one GetLedger returns.
const MaxLedgerPage = 1000

// GetLedger implements ebv1.BackupServiceServer: a page of a location's
// ledger as stored, which the client verifies itself; the server
// vouches for nothing in it.
func (s *Service) GetLedger(ctx context.Context, req *ebv1.GetLedgerRequest) (*ebv1.GetLedgerResponse, error) {
	l, err := s.locations.Get(req.GetLocation())
	if err != nil {
		return nil, edge.Status("", err)
	}
	size := int(req.GetPageSize())
	if size <= 0 || size > MaxLedgerPage {
		size = MaxLedgerPage
	}
	recs, err := l.ReadLedger(ctx, req.GetAfterSeq(), size+1)
	if errors.Is(err, domain.ErrNoLedger) {
		return nil, status.Errorf(codes.FailedPrecondition, "storage location %q keeps no ledger", l.Name)
	}
	if err != nil {
		return nil, edge.StorageStatus("read the ledger", l.Name, "", err)
	}
	resp := &ebv1.GetLedgerResponse{More: len(recs) > size}
	for _, r := range recs[:min(len(recs), size)] {
		resp.Records = append(resp.Records, &ebv1.LedgerRecord{Seq: r.Seq, Data: r.Data})
	}
	return resp, nil
}
