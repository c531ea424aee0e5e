package plugin

import (
	"strings"
	"testing"
)

func TestRestoreFlagCombinations(t *testing.T) {
	for _, tc := range []struct {
		o    RestoreOptions
		want string
	}{
		{RestoreOptions{}, "--local"},
		{RestoreOptions{Local: true, Target: "t"}, "not both"},
		{RestoreOptions{Target: "t", FromFile: "f"}, "--from-file goes with --local"},
		{RestoreOptions{Target: "t", WorkDir: "/w"}, "server's configuration"},
		{RestoreOptions{Local: true, Wait: true}, "--wait goes with --target"},
		{RestoreOptions{Target: "t", Wait: true, DryRun: true}, ""},
	} {
		o := tc.o
		err := o.Validate()
		switch {
		case tc.want == "" && err != nil:
			t.Errorf("%+v: %v", tc.o, err)
		case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
			t.Errorf("%+v: %v, want %q", tc.o, err, tc.want)
		}
	}
}
