package server_test

import (
	"context"
	"strings"
	"testing"

	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/server"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/server/config"
)

func TestOpenLocations(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	locs, err := server.OpenLocations(ctx, []config.Location{{Name: "default", Filesystem: &config.Filesystem{Path: dir}}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if len(locs) != 1 || locs[0].Name != "default" || locs[0].Location.Type() != "filesystem" || !strings.Contains(locs[0].Location.Describe(), dir) {
		t.Fatalf("locations: %+v", locs)
	}
	// The S3 section goes to package s3 as is; its error names the location.
	_, err = server.OpenLocations(ctx, []config.Location{
		{Name: "default", Filesystem: &config.Filesystem{Path: dir}},
		{Name: "s3", S3: &config.S3{Bucket: "b"}},
	}, nil)
	if err == nil || !strings.Contains(err.Error(), `locations[1] ("s3")`) || !strings.Contains(err.Error(), "no credentials configured") {
		t.Fatalf("S3 location without credentials: %v", err)
	}
}
