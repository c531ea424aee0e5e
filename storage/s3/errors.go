package s3

import (
	"errors"
	"fmt"
	"net/http"
	"strings"

	awshttp "github.com/aws/aws-sdk-go-v2/aws/transport/http"
	"github.com/aws/smithy-go"
)

// httpStatus is the HTTP status of a failed S3 call, or 0.
func httpStatus(err error) int {
	var re *awshttp.ResponseError
	if errors.As(err, &re) {
		return re.HTTPStatusCode()
	}
	return 0
}

// apiCode is the S3 error code of a failed call, or "".
func apiCode(err error) string {
	var ae smithy.APIError
	if errors.As(err, &ae) {
		return ae.ErrorCode()
	}
	return ""
}

// isNotFound reports a missing key (HEAD answers a bare 404).
func isNotFound(err error) bool {
	if err == nil {
		return false
	}
	switch apiCode(err) {
	case "NoSuchKey", "NotFound":
		return true
	case "NoSuchBucket":
		return false
	}
	return httpStatus(err) == http.StatusNotFound
}

// isNoSuchUpload reports an unknown (e.g. already aborted) multipart upload.
func isNoSuchUpload(err error) bool {
	return apiCode(err) == "NoSuchUpload" || (err != nil && httpStatus(err) == http.StatusNotFound)
}

// isPreconditionFailed reports a conditional request (If-None-Match: *,
// If-Match) whose condition did not hold, including AWS's 409 for two
// conditional writes racing.
func isPreconditionFailed(err error) bool {
	if err == nil {
		return false
	}
	switch apiCode(err) {
	case "PreconditionFailed", "ConditionalRequestConflict":
		return true
	}
	return httpStatus(err) == http.StatusPreconditionFailed
}

// joinErrs is errors.Join on one line ("a; b"): these messages end up in
// single-line log entries and gRPC statuses. Nil errors are dropped.
func joinErrs(errs ...error) error {
	var kept []error
	for _, e := range errs {
		if e != nil {
			kept = append(kept, e)
		}
	}
	switch len(kept) {
	case 0:
		return nil
	case 1:
		return kept[0]
	}
	format := strings.TrimSuffix(strings.Repeat("%w; ", len(kept)), "; ")
	args := make([]any, len(kept))
	for i, e := range kept {
		args[i] = e
	}
	return fmt.Errorf(format, args...)
}
