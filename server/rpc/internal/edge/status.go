// Package edge is the request layer's edge, what its two halves
// (server/rpc and server/rpc/readpath) share: domain and storage errors
// made statuses a client acts on, names validated, stored manifests made
// API messages.
package edge

import (
	"context"
	"errors"
	"fmt"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	ebv1 "github.com/kubectl-etcdbackup/kubectl-etcdbackup/api/etcdbackup/v1"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/server/domain"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/storage"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/storage/locations"
)

// This is the one place where the domain's and the storage's errors
// become statuses. Nothing below the handlers (server/domain,
// server/work, storage) knows gRPC.

// Status turns err, the error of the domain or of request op, into a
// status: a status already made (request validation) is returned as it
// is; a storage failure is StorageStatus's; what is not the domain's is
// the server's own Internal error.
func Status(op string, err error) error {
	if err == nil {
		return nil
	}
	if _, ok := err.(interface{ GRPCStatus() *status.Status }); ok {
		return err
	}
	var (
		se *domain.StorageError
		nc *domain.NotConfiguredError
		ue *locations.UnavailableError
		pe *domain.PreconditionError
		ce *domain.ClusterError
		re *domain.ReservedNameError
	)
	switch {
	case errors.As(err, &se):
		return StorageStatus(op, se.Location, se.Name, se.Err)
	case errors.As(err, &nc) && nc.Kind == domain.KindTarget:
		return status.Errorf(codes.NotFound, "etcd target %q is not configured on this server; it has %v (see `kubectl etcdbackup version`)", nc.Name, nc.Have)
	case errors.As(err, &nc):
		return status.Errorf(codes.NotFound,
			"storage location %q does not exist on this server; it has %v (see `kubectl etcdbackup version`)", nc.Name, nc.Have)
	case errors.As(err, &ue):
		return ebv1.LocationUnavailableError(ue.Location, ue.Error())
	case errors.Is(err, domain.ErrNoTargets):
		return status.Error(codes.FailedPrecondition,
			"this server has no etcd targets configured; add one under `targets:` in its config file")
	case errors.As(err, &pe):
		return status.Error(codes.FailedPrecondition, pe.Error())
	case errors.As(err, &ce):
		return ebv1.ServerErrorf(codes.Unavailable, "%v", err)
	case errors.As(err, &re):
		return status.Errorf(codes.InvalidArgument, "%s: %v; choose another name (--name)", op, re)
	}
	return ebv1.ServerErrorf(codes.Internal, "%v", err)
}

// StorageStatus turns the failure of storage operation op (on backup
// name, "" for the location) in location loc into a status a client can
// act on. The storage counted it already (domain.Locations).
func StorageStatus(op, loc, name string, err error) error {
	what := op
	if name != "" {
		what = fmt.Sprintf("%s %q", op, name)
	}
	var ue *locations.UnavailableError
	switch {
	case errors.As(err, &ue):
		return ebv1.LocationUnavailableError(ue.Location, fmt.Sprintf("%s: %v", what, ue))
	case errors.Is(err, storage.ErrNoSpace):
		return status.Errorf(codes.ResourceExhausted,
			"%s: storage location %q is full (%v); nothing was stored: delete old backups or give the location more space", what, loc, err)
	case errors.Is(err, storage.ErrNotFound):
		return status.Errorf(codes.NotFound,
			"backup %q not found in location %q; run `kubectl etcdbackup list --location %s` to see the backups", name, loc, loc)
	case errors.Is(err, storage.ErrLocked):
		return status.Errorf(codes.FailedPrecondition, "%s in location %q: %v; wait until then, or keep it", what, loc, err)
	case errors.Is(err, storage.ErrAlreadyExists):
		return status.Errorf(codes.AlreadyExists,
			"backup %q already exists in location %q; backups are immutable: choose another name or delete the old one first", name, loc)
	case errors.Is(err, context.Canceled):
		return status.Errorf(codes.Canceled, "%s %q: cancelled", op, name)
	case errors.Is(err, context.DeadlineExceeded):
		return status.Errorf(codes.DeadlineExceeded, "%s %q: deadline exceeded", op, name)
	}
	return ebv1.ServerErrorf(codes.Internal, "%s %q in location %q: %v", op, name, loc, err)
}
