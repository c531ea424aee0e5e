package work_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"k8s.io/client-go/kubernetes/fake"

	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/server/config"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/server/domain"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/server/jobs"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/server/servertest/backuptest"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/server/work"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/storage"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/storage/filesystem"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/storage/locations"
)

// starter is a Starter over one filesystem location and a fake cluster
// (nil agents: none).
func starter(t *testing.T, withAgents bool) (*work.Starter, storage.Location) {
	t.Helper()
	fs, err := filesystem.New(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	locs, err := domain.NewLocations([]locations.Named{{Name: "default", Location: fs}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	targets := []config.Target{{Name: "cp", Endpoints: []string{"http://127.0.0.1:1"}, InsecurePlaintext: true}}
	var l *jobs.Launcher
	if withAgents {
		if l, err = jobs.New(fake.NewClientset(), "etcdbackup-system", config.Agents{Image: "agent:dev"}); err != nil {
			t.Fatal(err)
		}
		l.SetServerPod("etcdbackup-server-0")
		if err := l.LoadSigningKey(t.Context()); err != nil {
			t.Fatal(err)
		}
		if err := l.Start(t.Context(), targets); err != nil {
			t.Fatal(err)
		}
	}
	now := func() time.Time { return time.Date(2026, 12, 5, 10, 0, 0, 0, time.UTC) }
	return work.New(locs, targets, l, nil, now), fs
}

// What keeps a backup or a drill from starting is a domain error the
// controller can tell apart without a gRPC code: no agents, a name taken
// in storage or by a running agent, what is not configured, a backup a
// drill cannot use.
func TestStartsRefuseWithDomainErrors(t *testing.T) {
	ctx := context.Background()
	none, _ := starter(t, false)
	if _, err := none.StartBackup(ctx, work.BackupRequest{}); !errors.Is(err, domain.ErrNoAgents) {
		t.Errorf("backup without agents: %v", err)
	}
	if _, err := none.StartDrill(ctx, work.DrillRequest{Name: "b"}); !errors.Is(err, domain.ErrNoAgents) {
		t.Errorf("drill without agents: %v", err)
	}

	s, fs := starter(t, true)
	b, err := s.StartBackup(ctx, work.BackupRequest{By: "test"})
	if err != nil || b.Name != "cp-20261205-100000" || b.Location != "default" || b.Job == "" {
		t.Fatalf("default backup: %+v, %v", b, err)
	}
	var running *domain.AlreadyRunningError
	if _, err := s.StartBackup(ctx, work.BackupRequest{Name: b.Name, Scheduled: true}); !errors.As(err, &running) || running.Kind != "backup" || running.Name != b.Name {
		t.Errorf("second start of %s: %v; want it already running", b.Name, err)
	}
	backuptest.Put(t, fs, &storage.Manifest{Name: "stored"}, []byte("data"))
	var se *domain.StorageError
	if _, err := s.StartBackup(ctx, work.BackupRequest{Name: "stored"}); !errors.Is(err, storage.ErrAlreadyExists) || !errors.As(err, &se) || se.Location != "default" {
		t.Errorf("backup of a stored name: %v", err)
	}
	var nc *domain.NotConfiguredError
	if _, err := s.StartBackup(ctx, work.BackupRequest{Target: "nope"}); !errors.As(err, &nc) || nc.Kind != domain.KindTarget {
		t.Errorf("backup of an unknown target: %v", err)
	}
	if _, err := s.StartBackup(ctx, work.BackupRequest{Location: "nope"}); !errors.As(err, &nc) || nc.Kind != domain.KindLocation {
		t.Errorf("backup to an unknown location: %v", err)
	}
	var re *domain.ReservedNameError
	if _, err := s.StartBackup(ctx, work.BackupRequest{Name: "cp-20261201-000000", By: "delta capture"}); !errors.As(err, &re) || re.Target != "cp" {
		t.Errorf("a chosen name of cp's schedule: %v", err)
	}
	if _, err := s.StartBackup(ctx, work.BackupRequest{Name: "cp-20261201-000000", Scheduled: true}); err != nil {
		t.Errorf("cp's schedule taking its own name: %v", err)
	}
	refused := errors.New("refused by the request layer")
	if _, err := s.StartBackup(ctx, work.BackupRequest{Name: "x", Check: func(string, string) error { return refused }}); err != refused {
		t.Errorf("a Check's refusal came back as %v", err)
	}

	var pe *domain.PreconditionError
	if _, err := s.StartDrill(ctx, work.DrillRequest{Name: "stored"}); !errors.As(err, &pe) || !strings.Contains(pe.Error(), "no keyspace fingerprint") {
		t.Errorf("drill of a backup without a fingerprint: %v", err)
	}
	if _, err := s.StartDrill(ctx, work.DrillRequest{Name: "missing"}); !errors.Is(err, storage.ErrNotFound) || !errors.As(err, &se) {
		t.Errorf("drill of a missing backup: %v", err)
	}
}
