package rpc

import (
	"context"
	"time"

	"google.golang.org/grpc/status"

	ebv1 "github.com/kubectl-etcdbackup/kubectl-etcdbackup/api/etcdbackup/v1"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/server/domain"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/server/rpc/internal/edge"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/storage/probe"
)

// checkTimeout bounds one location check: each of its steps has a
// minute at most (probe.DefaultStepTimeout), the whole three.
const checkTimeout = 3 * time.Minute

// CheckLocation implements ebv1.BackupServiceServer: a location check
// (storage/probe) of one location, which writes, reads, lists and
// deletes probes of its own and never touches a backup. One check runs
// at a time in a server; another waits for it.
func (s *Service) CheckLocation(ctx context.Context, req *ebv1.CheckLocationRequest) (*ebv1.CheckLocationResponse, error) {
	l, err := s.locations.Get(req.GetLocation())
	if err != nil {
		return nil, edge.Status("", err)
	}
	r, err := s.checkLocation(ctx, l)
	if err != nil {
		return nil, status.FromContextError(err).Err()
	}
	s.log.Info("storage location checked", "location", l.Name, "by", caller(ctx), "ok", r.OK(), "failed", stepNames(r.Failed()))
	resp := &ebv1.CheckLocationResponse{Location: l.Name, Type: l.Type(), Ok: r.OK()}
	for _, st := range r.Steps {
		resp.Steps = append(resp.Steps, &ebv1.LocationCheckStep{
			Name: st.Name, Result: st.Result, Detail: st.Detail, Advice: st.Advice, DurationMs: st.Duration.Milliseconds(),
		})
	}
	return resp, nil
}

// CheckLocations checks every location available now, one after the
// other, until ctx ends: the server's own look at its stores once it
// serves (server.Config.CheckLocations). Each failed step is a warning
// naming its advice; each location one line besides.
func (s *Service) CheckLocations(ctx context.Context) {
	for _, l := range s.locations.All() {
		if l.Unavailable() != nil {
			// Reported as such, and retried, by the location itself.
			continue
		}
		r, err := s.checkLocation(ctx, l)
		if err != nil || ctx.Err() != nil {
			return
		}
		for _, st := range r.Failed() {
			s.log.Warn("storage location check: a step failed; `kubectl etcdbackup location check "+l.Name+"` runs it again",
				"location", l.Name, "step", st.Name, "error", st.Detail, "advice", st.Advice)
		}
		s.log.Info("storage location checked", "location", l.Name, "type", l.Type(), "ok", r.OK(), "failed", stepNames(r.Failed()))
	}
}

// checkLocation runs the check of l once no other runs, within
// checkTimeout; the error is ctx's, when it ended while waiting.
func (s *Service) checkLocation(ctx context.Context, l *domain.Location) (probe.Result, error) {
	if err := ctx.Err(); err != nil {
		return probe.Result{}, err
	}
	select {
	case s.checking <- struct{}{}:
	case <-ctx.Done():
		return probe.Result{}, ctx.Err()
	}
	defer func() { <-s.checking }()
	ctx, cancel := context.WithTimeout(ctx, checkTimeout)
	defer cancel()
	// The store as it is, not l: l's listings leave the probes out.
	return probe.Run(ctx, l.Location, probe.Options{Now: s.now}), nil
}

func stepNames(steps []probe.Step) []string {
	names := make([]string, len(steps))
	for i, st := range steps {
		names[i] = st.Name
	}
	return names
}
