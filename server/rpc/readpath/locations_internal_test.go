package readpath

import (
	"testing"

	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/server/domain"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/server/metrics"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/storage"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/storage/locations"
)

// oneLocation is the location set of a server with l as its one
// location, "default", its failures counted in m (nil: not counted).
func oneLocation(t testing.TB, l storage.Location, m *metrics.Metrics) *domain.Locations {
	t.Helper()
	locs, err := domain.NewLocations([]locations.Named{{Name: "default", Location: l}}, m)
	if err != nil {
		t.Fatal(err)
	}
	return locs
}
