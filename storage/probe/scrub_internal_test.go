package probe

import (
	"strings"
	"testing"
)

// A store's message, or a proxy's, may echo a signed request: nothing of
// its credentials reaches a step's detail.
func TestScrub(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{"GET https://s3.example/b/k?X-Amz-Algorithm=AWS4-HMAC-SHA256&X-Amz-Credential=AKIAIOSFODNN7EXAMPLE%2F20260101%2Fus-east-1%2Fs3%2Faws4_request&X-Amz-Signature=0123456789abcdef0123456789abcdef&X-Amz-Security-Token=FQoGZXIvYXdzE failed",
			"GET https://s3.example/b/k?X-Amz-Algorithm=AWS4-HMAC-SHA256&X-Amz-Credential=REDACTED&X-Amz-Signature=REDACTED&X-Amz-Security-Token=REDACTED failed"},
		{"Authorization: AWS4-HMAC-SHA256 Credential=AKIAIOSFODNN7EXAMPLE/20260101/us-east-1/s3/aws4_request, SignedHeaders=host, Signature=fe5f80f77d5fa3beca038a248ff027",
			"Authorization: AWS4-HMAC-SHA256 Credential=REDACTED, SignedHeaders=host, Signature=REDACTED"},
		{"dial https://user:pa55@s3.example:9000/b: refused", "dial https://REDACTED@s3.example:9000/b: refused"},
		{"User: AKIAIOSFODNN7EXAMPLE is not authorized", "User: REDACTED is not authorized"},
		{"api error AccessDenied: Access Denied.", "api error AccessDenied: Access Denied."},
	} {
		if got := scrub(tc.in); got != tc.want {
			t.Errorf("scrub(%q)\n got %q\nwant %q", tc.in, got, tc.want)
		}
	}
	if got := clip(strings.Repeat("x", 2000)); len(got) != maxDetail+len("…") {
		t.Errorf("clip: %d bytes", len(got))
	}
}
