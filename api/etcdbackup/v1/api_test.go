package etcdbackupv1_test

import (
	"errors"
	"slices"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/timestamppb"

	ebv1 "github.com/kubectl-etcdbackup/kubectl-etcdbackup/api/etcdbackup/v1"
)

func TestServerErrorIsMarked(t *testing.T) {
	for _, tc := range []struct {
		err    error
		server bool
	}{
		{ebv1.ServerError(codes.Internal, "internal error; see the server log"), true},
		{ebv1.ServerErrorf(codes.Internal, "verify %q: %v", "b", errors.New("boom")), true},
		{ebv1.LocationUnavailableError("s3", "down"), true},
		// What gRPC's transport makes of a torn stream carries no mark.
		{status.Error(codes.Internal, "stream terminated by RST_STREAM with error code: INTERNAL_ERROR"), false},
		{status.Error(codes.Internal, "unexpected EOF"), false},
	} {
		st, _ := status.FromError(tc.err)
		if got := ebv1.IsServerError(st); got != tc.server {
			t.Errorf("IsServerError(%v) = %v, want %v", tc.err, got, tc.server)
		}
	}
	st, _ := status.FromError(ebv1.ServerErrorf(codes.Internal, "verify %q", "b"))
	if st.Code() != codes.Internal || st.Message() != `verify "b"` {
		t.Errorf("ServerErrorf: code %v, message %q", st.Code(), st.Message())
	}
	if _, ok := ebv1.UnavailableLocation(st); ok {
		t.Error("a ServerError reads as an unavailable location")
	}
}

func TestListingOrder(t *testing.T) {
	base := time.Date(2026, 1, 31, 2, 0, 0, 0, time.UTC)
	b := func(name, loc string, ago time.Duration) *ebv1.Backup {
		return &ebv1.Backup{Name: name, Location: loc, CreateTime: timestamppb.New(base.Add(-ago))}
	}
	bs := []*ebv1.Backup{
		b("old", "default", time.Hour),
		b("same-b", "s3", 0),
		b("same-a", "default", 0),
		b("same-b", "default", 0),
		b("new", "default", -time.Minute),
	}
	ebv1.SortBackups(bs)
	var got []string
	for _, x := range bs {
		got = append(got, x.GetName()+"@"+x.GetLocation())
	}
	want := []string{"new@default", "same-a@default", "same-b@default", "same-b@s3", "old@default"}
	if !slices.Equal(got, want) {
		t.Fatalf("SortBackups: %v, want %v (newest first, then name, then location)", got, want)
	}
	if !ebv1.ListedBefore(bs[0], bs[1]) || ebv1.ListedBefore(bs[1], bs[0]) || ebv1.ListedBefore(bs[2], bs[3]) {
		t.Error("ListedBefore disagrees with SortBackups")
	}
	if c := ebv1.CompareListing(base, "a", base, "a"); c != 0 {
		t.Errorf("CompareListing of the same backup = %d", c)
	}
}
