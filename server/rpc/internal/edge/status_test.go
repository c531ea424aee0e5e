package edge_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	ebv1 "github.com/kubectl-etcdbackup/kubectl-etcdbackup/api/etcdbackup/v1"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/server/domain"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/server/rpc/internal/edge"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/storage"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/storage/locations"
)

// Each domain and storage error becomes the status a client acts on, in
// one place; a status made above (request validation) passes as it is,
// and what is not the domain's is the server's own Internal error.
func TestStatusOfDomainErrors(t *testing.T) {
	unavailable := &locations.UnavailableError{Location: "s3", Since: time.Unix(0, 0), Err: errors.New("no route to host")}
	for _, tc := range []struct {
		err    error
		code   codes.Code
		says   string
		server bool // marked as the server's own
		loc    string
	}{
		{status.Error(codes.InvalidArgument, "bad name"), codes.InvalidArgument, "bad name", false, ""},
		{&domain.NotConfiguredError{Kind: domain.KindLocation, Name: "x", Have: []string{"default"}}, codes.NotFound,
			`storage location "x" does not exist on this server; it has [default]`, false, ""},
		{&domain.NotConfiguredError{Kind: domain.KindTarget, Name: "x", Have: []string{"cp"}}, codes.NotFound,
			`etcd target "x" is not configured on this server; it has [cp]`, false, ""},
		{domain.ErrNoTargets, codes.FailedPrecondition, "no etcd targets configured", false, ""},
		{&domain.PreconditionError{Msg: "the drill did not start"}, codes.FailedPrecondition, "the drill did not start", false, ""},
		{&domain.ClusterError{Err: errors.New("cannot check for restores")}, codes.Unavailable, "cannot check for restores", true, ""},
		{unavailable, codes.Unavailable, "no route to host", true, "s3"},
		{&domain.StorageError{Location: "default", Name: "b", Err: fmt.Errorf("stat: %w", storage.ErrNotFound)}, codes.NotFound,
			`backup "b" not found in location "default"`, false, ""},
		{&domain.StorageError{Location: "default", Name: "b", Err: storage.ErrAlreadyExists}, codes.AlreadyExists, "backups are immutable", false, ""},
		{&domain.StorageError{Location: "default", Name: "b", Err: storage.ErrNoSpace}, codes.ResourceExhausted, `op "b": storage location "default" is full`, false, ""},
		{&domain.StorageError{Location: "s3", Name: "b", Err: unavailable}, codes.Unavailable, `op "b": storage location "s3" is unavailable`, true, "s3"},
		{&domain.StorageError{Location: "default", Name: "b", Err: context.Canceled}, codes.Canceled, "cancelled", false, ""},
		{&domain.StorageError{Location: "default", Name: "b", Err: errors.New("disk on fire")}, codes.Internal, `op "b" in location "default": disk on fire`, true, ""},
		{&domain.ReservedNameError{Name: "cp-20261201-000000", Target: "cp"}, codes.InvalidArgument,
			`op: name "cp-20261201-000000" has the form of target "cp"'s scheduled backups (cp-YYYYMMDD-HHMMSS)`, false, ""},
		{errors.New("start backup agent for \"b\": boom"), codes.Internal, "start backup agent for \"b\": boom", true, ""},
	} {
		st := status.Convert(edge.Status("op", tc.err))
		if st.Code() != tc.code || !strings.Contains(st.Message(), tc.says) {
			t.Errorf("%v: %v %q; want %v saying %q", tc.err, st.Code(), st.Message(), tc.code, tc.says)
		}
		if got := ebv1.IsServerError(st); got != tc.server && tc.loc == "" {
			t.Errorf("%v: marked the server's %v, want %v", tc.err, got, tc.server)
		}
		if loc, ok := ebv1.UnavailableLocation(st); tc.loc != "" && (!ok || loc != tc.loc) {
			t.Errorf("%v: not LOCATION_UNAVAILABLE of %q", tc.err, tc.loc)
		}
	}
	if edge.Status("op", nil) != nil {
		t.Error("no error became a status")
	}
}
