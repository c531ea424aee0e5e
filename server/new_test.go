package server_test

import (
	"strings"
	"testing"

	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/server"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/server/config"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/storage/filesystem"
)

// TestNewChecksTargets: server.New refuses what the config file would,
// naming the field, for servers built without config.Load.
func TestNewChecksTargets(t *testing.T) {
	loc, err := filesystem.New(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	ok := config.Target{Name: "t", Endpoints: []string{"http://a:2379"}}
	with := func(edit func(*config.Target)) config.Target {
		c := ok
		edit(&c)
		return c
	}
	for _, tc := range []struct {
		name      string
		locations []string
		targets   []config.Target
		want      string
	}{
		{"duplicate location", []string{"default", "default"}, nil, `locations[1].name: Duplicate value: "default"`},
		{"location name", []string{"Default"}, nil, `locations[0].name: Invalid value: "Default"`},
		{"duplicate target", []string{"default"}, []config.Target{ok, ok}, `targets[1].name: Duplicate value: "t"`},
		{"no endpoints", []string{"default"}, []config.Target{with(func(c *config.Target) { c.Endpoints = nil })}, "targets[0].endpoints: Required value"},
		{"unknown location", []string{"default"}, []config.Target{with(func(c *config.Target) { c.Location = "s3" })}, `targets[0].location: Not found: "s3"`},
		{"compression", []string{"default"}, []config.Target{with(func(c *config.Target) { c.Compression = "gzip" })}, `targets[0].compression: Unsupported value: "gzip"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var locs []server.NamedLocation
			for _, n := range tc.locations {
				locs = append(locs, server.NamedLocation{Name: n, Location: loc})
			}
			_, err := server.New(server.Config{Locations: locs, Targets: tc.targets})
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("New: %v, want %q", err, tc.want)
			}
		})
	}
}

func TestTargetMembersAreValidated(t *testing.T) {
	loc, err := filesystem.New(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	pvc := config.MemberVolume{PersistentVolumeClaim: &config.ClaimRef{ClaimName: "c"}}
	host := config.MemberVolume{HostPath: &config.HostPathRef{Path: "/var/lib/etcd"}}
	for _, m := range []config.Member{
		{Name: "a", PeerURL: "etcd-0:2380", Volume: pvc},
		{Name: "a", PeerURL: "http://a:2380", DataDir: "../x", Volume: pvc},
		{Name: "a", PeerURL: "http://a:2380", DataDir: "/abs", Volume: pvc},
		{Name: "a", PeerURL: "http://a:2380"},
		{Name: "a", PeerURL: "http://a:2380", Volume: host},
		{Name: "a", PeerURL: "http://a:2380", Volume: config.MemberVolume{PersistentVolumeClaim: pvc.PersistentVolumeClaim, HostPath: host.HostPath}, NodeName: "n"},
	} {
		_, err := server.New(server.Config{
			Locations: []server.NamedLocation{{Name: "default", Location: loc}},
			Targets:   []config.Target{{Name: "t", Endpoints: []string{"http://a:2379"}, Members: []config.Member{m}}},
		})
		if err == nil {
			t.Errorf("member %+v accepted", m)
		} else if !strings.Contains(err.Error(), "targets[0].members[0].") {
			t.Errorf("member %+v: error %q does not name the field", m, err)
		}
	}
}
