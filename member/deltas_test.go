package member

import (
	"strings"
	"testing"
	"time"

	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/delta"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/fetch"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/snapshot"
)

const pin = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"

func TestValidateDeltas(t *testing.T) {
	m := snapshot.Member{Name: "m1", DataDir: "/tmp/x", InitialCluster: "m1=http://127.0.0.1:2380", InitialAdvertisePeerURLs: []string{"http://127.0.0.1:2380"}}
	ok := &Deltas{Segments: []fetch.Pin{{Name: "b.delta-11", SHA256: pin}}, Point: delta.Point{Revision: 20}}
	if err := (Options{Name: "b", Member: m, Deltas: ok}).Validate(); err != nil {
		t.Fatal(err)
	}
	for name, tc := range map[string]struct {
		o    Options
		want string
	}{
		"from a file": {Options{FromFile: "/x.db", Member: m, Deltas: ok}, "cannot start from a downloaded file"},
		"unpinned":    {Options{Name: "b", Member: m, Deltas: &Deltas{Segments: []fetch.Pin{{Name: "b.delta-11"}}}}, "not a SHA-256"},
		"nameless":    {Options{Name: "b", Member: m, Deltas: &Deltas{Segments: []fetch.Pin{{SHA256: pin}}}}, "without a name"},
		"both points": {Options{Name: "b", Member: m, Deltas: &Deltas{Point: delta.Point{Revision: 1, Time: time.Unix(1, 0)}}}, "not both"},
	} {
		if err := tc.o.Validate(); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v, want an error containing %q", name, err, tc.want)
		}
	}
}
