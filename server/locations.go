package server

import (
	"context"
	"fmt"
	"log/slog"

	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/server/config"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/server/storage"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/server/storage/filesystem"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/server/storage/s3"
)

// OpenLocations opens the storage locations of a configuration, in order,
// for Config.Locations. An S3 location checks that its bucket is reachable
// and logs to log under its name.
func OpenLocations(ctx context.Context, locs []config.Location, log *slog.Logger) ([]NamedLocation, error) {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	out := make([]NamedLocation, 0, len(locs))
	for i, l := range locs {
		var (
			loc storage.Location
			err error
		)
		switch {
		case l.Filesystem != nil && l.S3 == nil:
			loc, err = filesystem.New(l.Filesystem.Path)
		case l.S3 != nil && l.Filesystem == nil:
			loc, err = s3.New(ctx, s3.Config{S3: *l.S3, Logger: log.With("location", l.Name)})
		default:
			err = fmt.Errorf("must have exactly one of filesystem, s3")
		}
		if err != nil {
			return nil, fmt.Errorf("locations[%d] (%q): %w", i, l.Name, err)
		}
		out = append(out, NamedLocation{Name: l.Name, Location: loc})
	}
	return out, nil
}
