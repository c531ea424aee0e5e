package server

import (
	"context"
	"log/slog"
	"time"

	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/storage"
)

// Opener is a location to open with OpenWith: how, and what it is.
type Opener struct {
	Name, Type, Where string
	Open              func(context.Context) (storage.Location, error)
}

// OpenWith is OpenLocations over openers, retrying every retry and giving
// each attempt attempt.
func OpenWith(ctx context.Context, openers []Opener, retry, attempt time.Duration) []NamedLocation {
	var os []locationOpener
	for _, o := range openers {
		os = append(os, locationOpener{name: o.Name, typ: o.Type, where: o.Where, open: o.Open})
	}
	return openAll(ctx, os, wait.Backoff{Duration: retry, Steps: 1 << 30}, attempt, slog.New(slog.DiscardHandler))
}
