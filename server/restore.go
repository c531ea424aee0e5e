package server

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"net/url"
	"strings"
	"sync"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	ebv1 "github.com/kubectl-etcdbackup/kubectl-etcdbackup/api/etcdbackup/v1"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/server/config"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/server/jobs"
)

// probeTimeout bounds the check that a member is stopped.
const probeTimeout = 2 * time.Second

// restoreTarget resolves and checks the target of a restore request.
func (s *Server) restoreTarget(name string) (*config.Target, error) {
	if s.agents == nil {
		return nil, status.Error(codes.FailedPrecondition,
			"this server cannot launch restore agents (it runs outside a cluster or without an agent image); restore each member with `kubectl etcdbackup restore NAME --local` instead")
	}
	if name == "" {
		return nil, status.Error(codes.InvalidArgument, "name the etcd target to restore (--target); see `kubectl etcdbackup version` for the server's targets")
	}
	t, err := s.target(name)
	if err != nil {
		return nil, err
	}
	if len(t.Members) == 0 {
		return nil, status.Errorf(codes.FailedPrecondition,
			"target %q has no members in the server's configuration, so the server does not know where their data lives; add `members:` (name, peerURL, volume) to the target, or restore each member with `kubectl etcdbackup restore NAME --local`", t.Name)
	}
	return t, nil
}

// plan is one entry per member of t.
func (s *Server) plan(t *config.Target, locName, name string) []*ebv1.MemberRestore {
	ic := jobs.InitialCluster(*t)
	out := make([]*ebv1.MemberRestore, 0, len(t.Members))
	for _, m := range t.Members {
		out = append(out, &ebv1.MemberRestore{
			Member: m.Name, JobName: s.agents.RestoreNamespace(*t) + "/" + jobs.RestoreJobName(locName, name, t.Name, m.Name),
			Volume: jobs.DescribeVolume(m), DataDir: m.DataDir, InitialCluster: ic, PeerUrl: m.PeerURL,
			InitialClusterToken: t.InitialClusterToken,
		})
	}
	return out
}

// RestoreBackup implements ebv1.BackupServiceServer.
func (s *Server) RestoreBackup(ctx context.Context, req *ebv1.RestoreBackupRequest) (*ebv1.RestoreBackupResponse, error) {
	if err := validateName("backup", req.GetName()); err != nil {
		return nil, err
	}
	t, err := s.restoreTarget(req.GetTarget())
	if err != nil {
		return nil, err
	}
	name := req.GetName()
	locName, loc, err := s.location(req.GetLocation())
	if err != nil {
		return nil, err
	}
	m, err := loc.Stat(ctx, name)
	if err != nil {
		return nil, storageError("restore backup", locName, name, err)
	}
	secret := req.GetIdentitySecret()
	if secret != "" {
		if err := validateName("identity Secret", secret); err != nil {
			return nil, err
		}
	}
	if m.Encryption != "" && secret == "" {
		return nil, status.Errorf(codes.FailedPrecondition,
			"backup %q is age-encrypted and the server holds no key: create a Secret with your age identity file in namespace %q (`kubectl -n %s create secret generic etcd-backup-identity --from-file=identity=KEYFILE`) and pass --identity-secret etcd-backup-identity; it is mounted only into the restore Jobs",
			name, s.agents.RestoreNamespace(*t), s.agents.RestoreNamespace(*t))
	}
	if req.GetMoveAside() {
		for _, m := range t.Members {
			if m.DataDir == "" {
				return nil, status.Errorf(codes.InvalidArgument,
					"member %q's data directory is the root of its volume, which cannot be renamed: --move-aside needs a dataDir below the volume's root in the target's configuration", m.Name)
			}
		}
	}
	plan := s.plan(t, locName, name)
	live := answering(ctx, t)
	if req.GetDryRun() {
		for _, p := range plan {
			p.Phase = ebv1.RestorePhase_RESTORE_PHASE_PENDING
			if u := live[p.GetMember()]; u != "" {
				p.Message = "still answers on " + u + ": stop it before restoring"
			}
		}
		return &ebv1.RestoreBackupResponse{Members: plan}, nil
	}
	if len(live) > 0 {
		var names []string
		for _, m := range t.Members {
			if u := live[m.Name]; u != "" {
				names = append(names, fmt.Sprintf("%s (%s)", m.Name, u))
			}
		}
		if u := live[""]; u != "" {
			names = append(names, u)
		}
		return nil, status.Errorf(codes.FailedPrecondition,
			"etcd of target %q is still running: %s answers; a restore must not write under a running member. Stop every member first — scale its StatefulSet or Deployment to 0 (`kubectl -n %s scale statefulset NAME --replicas=0`), or for control-plane etcd move /etc/kubernetes/manifests/etcd.yaml out of /etc/kubernetes/manifests on each node — then run the restore again",
			t.Name, strings.Join(names, ", "), s.agents.RestoreNamespace(*t))
	}
	created, err := s.agents.StartRestore(ctx, jobs.RestoreSpec{
		Name: name, Location: locName, Target: *t, MoveAside: req.GetMoveAside(), IdentitySecret: secret,
		// What the agents may restore: exactly the backup stored now.
		SHA256: m.SHA256,
	})
	if errors.Is(err, jobs.ErrRunning) {
		return nil, status.Errorf(codes.AlreadyExists,
			"a restore of backup %q into target %q is still running; wait for it with `kubectl etcdbackup restore %s --target %s --wait` after it ends, or follow `kubectl -n %s get jobs -l app.kubernetes.io/component=restore-agent`",
			name, t.Name, name, t.Name, s.agents.RestoreNamespace(*t))
	}
	if err != nil {
		return nil, status.Errorf(codes.Internal, "start restore agents for %q: %v", name, err)
	}
	for _, p := range plan {
		p.Phase = ebv1.RestorePhase_RESTORE_PHASE_RUNNING
	}
	s.log.Info("restore agents started", "backup", name, "location", locName, "target", t.Name, "jobs", len(created), "caller", caller(ctx))
	return &ebv1.RestoreBackupResponse{Members: plan}, nil
}

// GetRestore implements ebv1.BackupServiceServer.
func (s *Server) GetRestore(ctx context.Context, req *ebv1.GetRestoreRequest) (*ebv1.GetRestoreResponse, error) {
	if err := validateName("backup", req.GetName()); err != nil {
		return nil, err
	}
	t, err := s.restoreTarget(req.GetTarget())
	if err != nil {
		return nil, err
	}
	locName, _, err := s.location(req.GetLocation())
	if err != nil {
		return nil, err
	}
	runs, err := s.agents.ListRestores(ctx, locName, req.GetName(), *t)
	if err != nil {
		return nil, status.Errorf(codes.Unavailable, "list restore agents: %v", err)
	}
	if len(runs) == 0 {
		return nil, status.Errorf(codes.NotFound,
			"no restore of backup %q from location %q into target %q: it was never started, or its Jobs were cleaned up (finished Jobs are kept for a day)", req.GetName(), locName, t.Name)
	}
	plan := s.plan(t, locName, req.GetName())
	for _, p := range plan {
		r, ok := runs[p.GetMember()]
		if !ok {
			p.Phase = ebv1.RestorePhase_RESTORE_PHASE_FAILED
			p.Message = "no restore Job for this member (deleted?); start the restore again"
			continue
		}
		switch r.Phase {
		case jobs.PhaseRunning:
			p.Phase = ebv1.RestorePhase_RESTORE_PHASE_RUNNING
		case jobs.PhaseSucceeded:
			p.Phase = ebv1.RestorePhase_RESTORE_PHASE_SUCCEEDED
		case jobs.PhaseFailed:
			p.Phase = ebv1.RestorePhase_RESTORE_PHASE_FAILED
		}
		p.Message = r.Message
	}
	return &ebv1.GetRestoreResponse{Members: plan}, nil
}

// answering returns the members of t that still answer on their client
// URL (and, under "", any target endpoint that answers), mapped to that
// URL.
func answering(ctx context.Context, t *config.Target) map[string]string {
	type probe struct{ member, url string }
	var probes []probe
	seen := map[string]bool{}
	for _, m := range t.Members {
		if m.ClientURL != "" {
			probes = append(probes, probe{m.Name, m.ClientURL})
			seen[m.ClientURL] = true
		}
	}
	for _, e := range t.Endpoints {
		if !seen[e] {
			probes = append(probes, probe{"", e})
		}
	}
	out := map[string]string{}
	var mu sync.Mutex
	var wg sync.WaitGroup
	for _, p := range probes {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if answers(ctx, p.url) {
				mu.Lock()
				if out[p.member] == "" {
					out[p.member] = p.url
				}
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	return out
}

// answers says whether something serves at an etcd client URL. Accepting a
// TCP connection is not enough (a Service without endpoints may accept and
// close): the peer must send bytes back — an HTTP response, or its side of
// a TLS handshake. No credential is used and nothing is read from etcd.
func answers(ctx context.Context, raw string) bool {
	u, err := url.Parse(raw)
	if err != nil {
		return false
	}
	host := u.Host
	if u.Port() == "" {
		host = net.JoinHostPort(u.Hostname(), "2379")
	}
	ctx, cancel := context.WithTimeout(ctx, probeTimeout)
	defer cancel()
	var d net.Dialer
	conn, err := d.DialContext(ctx, "tcp", host)
	if err != nil {
		return false
	}
	defer conn.Close()
	deadline, _ := ctx.Deadline()
	_ = conn.SetDeadline(deadline)
	c := &countingConn{Conn: conn}
	if u.Scheme == "https" {
		// Only whether the server speaks matters, not who it is.
		tc := tls.Client(c, &tls.Config{InsecureSkipVerify: true, ServerName: u.Hostname()}) //nolint:gosec // a liveness probe, no data is exchanged
		_ = tc.HandshakeContext(ctx)
		return c.read > 0
	}
	if _, err := fmt.Fprintf(c, "GET /version HTTP/1.0\r\nHost: %s\r\n\r\n", u.Host); err != nil {
		return false
	}
	var b [1]byte
	n, _ := c.Read(b[:])
	return n > 0
}

type countingConn struct {
	net.Conn
	read int
}

func (c *countingConn) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	c.read += n
	return n, err
}
