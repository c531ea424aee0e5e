package servertest

import (
	"strings"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// WantCode stops the test unless err has the status code code.
func WantCode(t testing.TB, err error, code codes.Code) {
	t.Helper()
	if status.Code(err) != code {
		t.Fatalf("got %v, want code %v", err, code)
	}
}

// WantRefusal checks err's code and that its message says every part of
// want (the limit's config key, the field, ...).
func WantRefusal(t testing.TB, err error, code codes.Code, want ...string) {
	t.Helper()
	WantCode(t, err, code)
	MustSay(t, status.Convert(err).Message(), want...)
}

// MustSay reports each of wants that msg does not say.
func MustSay(t testing.TB, msg string, wants ...string) {
	t.Helper()
	for _, want := range wants {
		if !strings.Contains(msg, want) {
			t.Errorf("%q does not say %q", msg, want)
		}
	}
}
