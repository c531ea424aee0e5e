package etcdbackupv1

import (
	"fmt"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// ErrorDomain is the domain of the google.rpc.ErrorInfo details the server
// attaches to some errors, so that clients can tell them apart by more
// than their code.
const ErrorDomain = "etcdbackup.io"

// ReasonLocationUnavailable marks an Unavailable error of a storage
// location the server cannot reach now (an S3 store down), which the
// server retries in the background, from an Unavailable error of the
// connection to the server itself. Its metadata "location" names the
// location.
const ReasonLocationUnavailable = "LOCATION_UNAVAILABLE"

// LocationUnavailableError is the Unavailable status of a call to the
// unavailable storage location loc; msg says why and since when.
func LocationUnavailableError(loc, msg string) error {
	st := status.New(codes.Unavailable, msg)
	if d, err := st.WithDetails(&errdetails.ErrorInfo{
		Reason: ReasonLocationUnavailable, Domain: ErrorDomain, Metadata: map[string]string{"location": loc},
	}); err == nil {
		st = d
	}
	return st.Err()
}

// UnavailableLocation returns the storage location a status says is
// unavailable, if it is a LocationUnavailableError.
func UnavailableLocation(st *status.Status) (string, bool) {
	for _, d := range st.Details() {
		if ei, ok := d.(*errdetails.ErrorInfo); ok && ei.GetDomain() == ErrorDomain && ei.GetReason() == ReasonLocationUnavailable {
			return ei.GetMetadata()["location"], true
		}
	}
	return "", false
}

// ReasonServerError marks an error the server itself decided on — a
// handler's answer, a recovered panic — from one gRPC's transport makes
// up when a connection breaks mid-call. Both may be Internal: a torn
// stream surfaces as Internal ("stream terminated by RST_STREAM",
// "unexpected EOF") and is worth another attempt; the server's own
// Internal is a bug, which asking again does not mend.
const ReasonServerError = "SERVER_ERROR"

// ServerError is the status of an error the server decided on, with code
// and msg, marked as the server's (ReasonServerError).
func ServerError(code codes.Code, msg string) error {
	st := status.New(code, msg)
	if d, err := st.WithDetails(&errdetails.ErrorInfo{Reason: ReasonServerError, Domain: ErrorDomain}); err == nil {
		st = d
	}
	return st.Err()
}

// ServerErrorf is ServerError with a format.
func ServerErrorf(code codes.Code, format string, a ...any) error {
	return ServerError(code, fmt.Sprintf(format, a...))
}

// IsServerError reports whether st carries the server's mark — an
// ErrorInfo of ErrorDomain, whatever its reason (a ServerError, a
// LocationUnavailableError) — so it is the server's own answer, not the
// transport's.
func IsServerError(st *status.Status) bool {
	for _, d := range st.Details() {
		if ei, ok := d.(*errdetails.ErrorInfo); ok && ei.GetDomain() == ErrorDomain {
			return true
		}
	}
	return false
}
