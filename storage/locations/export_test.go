package locations

import (
	"context"
	"time"

	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/storage"
)

// Opener is a location to open with OpenWith: how, and what it is.
type Opener struct {
	Name, Type, Where string
	Open              func(context.Context) (storage.Location, error)
}

// OpenWith is Open over openers, retrying every retry (no backoff).
func OpenWith(ctx context.Context, openers []Opener, retry time.Duration, opts Options) []Named {
	var os []opener
	for _, o := range openers {
		os = append(os, opener{name: o.Name, typ: o.Type, where: o.Where, open: o.Open})
	}
	return openAll(ctx, os, wait.Backoff{Duration: retry, Steps: 1 << 30}, opts.withDefaults())
}
