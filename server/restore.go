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
	"syscall"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	apierrors "k8s.io/apimachinery/pkg/api/errors"

	ebv1 "github.com/kubectl-etcdbackup/kubectl-etcdbackup/api/etcdbackup/v1"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/server/config"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/server/jobs"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/snapshot"
)

// probeTimeout bounds the check that a member is stopped; a member that
// neither answers nor refuses within it is "unknown" and the restore is
// refused. A variable for tests.
var probeTimeout = 5 * time.Second

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

// revisionBump is what a restore request adds to etcd's revision: its
// bump_revision, unset meaning snapshot.DefaultRevisionBump (a client that
// predates the field still gets what etcd recommends for Kubernetes).
func revisionBump(req *ebv1.RestoreBackupRequest) (int64, error) {
	if req.BumpRevision == nil {
		return snapshot.DefaultRevisionBump, nil
	}
	b := req.GetBumpRevision()
	if b < 0 {
		return 0, status.Errorf(codes.InvalidArgument,
			"--bump-revision %d is negative: etcd's revision only grows; give 0 to keep the snapshot's revisions, or a positive amount (default %d)", b, snapshot.DefaultRevisionBump)
	}
	return b, nil
}

// RestoreBackup implements ebv1.BackupServiceServer.
func (s *Server) RestoreBackup(ctx context.Context, req *ebv1.RestoreBackupRequest) (*ebv1.RestoreBackupResponse, error) {
	if err := validateName("backup", req.GetName()); err != nil {
		return nil, err
	}
	bump, err := revisionBump(req)
	if err != nil {
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
		return nil, s.metrics.StorageError("restore backup", locName, name, err)
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
	for _, p := range plan {
		p.BumpRevision, p.MarkCompacted = bump, bump > 0
	}
	seen := s.memberLiveness(ctx, t)
	if req.GetDryRun() {
		for _, p := range plan {
			p.Phase = ebv1.RestorePhase_RESTORE_PHASE_PENDING
			for _, f := range seen {
				// A finding about the whole target (pods that cannot be
				// listed, an endpoint in doubt) concerns every member.
				if p.Message == "" && (f.member == p.GetMember() || (f.member == "" && f.url == "")) {
					p.Message = f.dryRunMessage()
				}
			}
		}
		return &ebv1.RestoreBackupResponse{Members: plan}, nil
	}
	if err := s.refuseUnlessStopped(t, seen); err != nil {
		return nil, err
	}
	created, err := s.agents.StartRestore(ctx, jobs.RestoreSpec{
		Name: name, Location: locName, Target: *t, MoveAside: req.GetMoveAside(), IdentitySecret: secret,
		// What the agents may restore: exactly the backup stored now.
		SHA256:       m.SHA256,
		BumpRevision: bump,
	})
	if errors.Is(err, jobs.ErrRunning) {
		return nil, status.Errorf(codes.AlreadyExists,
			"a restore of backup %q into target %q is still running; wait for it with `kubectl etcdbackup restore %s --target %s --wait` after it ends, or follow `kubectl -n %s get jobs -l app.kubernetes.io/component=restore-agent`",
			name, t.Name, name, t.Name, s.agents.RestoreNamespace(*t))
	}
	if apierrors.IsNotFound(err) || apierrors.IsForbidden(err) {
		return nil, status.Errorf(codes.FailedPrecondition,
			"start restore agents for %q in namespace %s: %v; that namespace must exist with a ServiceAccount %s and a Role letting the server manage Jobs there (manifests/restore-namespace/ for hostPath members, the Role documented in manifests/server.yaml for claims)",
			name, s.agents.RestoreNamespace(*t), err, config.DefaultServiceAccount)
	}
	if err != nil {
		return nil, status.Errorf(codes.Internal, "start restore agents for %q: %v", name, err)
	}
	for _, p := range plan {
		p.Phase = ebv1.RestorePhase_RESTORE_PHASE_RUNNING
	}
	s.log.Info("restore agents started", "backup", name, "location", locName, "target", t.Name, "jobs", len(created), "bumpRevision", bump, "caller", caller(ctx))
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
		// What the member's Job was started with (its annotation).
		p.BumpRevision, p.MarkCompacted = r.BumpRevision, r.BumpRevision > 0
	}
	return &ebv1.GetRestoreResponse{Members: plan}, nil
}

// liveness is what the server could learn about whether an etcd member
// runs.
type liveness int

const (
	stopped liveness = iota
	running
	// unknown: neither evidence of running nor of being stopped (a name
	// that does not resolve, a timeout, a pod list refused).
	unknown
)

// finding is one piece of evidence about a member ("" for a target
// endpoint or the whole target).
type finding struct {
	member string
	state  liveness
	// what was seen, for people: "pod NS/NAME uses pvc/X", a URL that
	// answers, or why the state is unknown.
	what string
	// url is the client URL that answers, when that is the evidence.
	url string
}

func (f finding) String() string {
	switch {
	case f.url != "" && f.member != "":
		return fmt.Sprintf("%s (%s) answers", f.member, f.url)
	case f.url != "":
		return f.url + " answers"
	case f.member != "":
		return fmt.Sprintf("%s (%s)", f.member, f.what)
	}
	return f.what
}

func (f finding) dryRunMessage() string {
	switch {
	case f.state == unknown:
		return "cannot tell whether it runs: " + f.what + "; the restore would be refused"
	case f.url != "":
		return "still answers on " + f.url + ": stop it before restoring"
	}
	return "still running: " + f.what + "; stop it before restoring"
}

// memberLiveness gathers what says a member of t runs, or may: the API
// showing a pod that uses its volume (jobs.Launcher.MemberPods), and its
// client URL (and any target endpoint) answering. A member is stopped
// only when the API shows no such pod and its URL refuses connections;
// stopped members have no finding.
func (s *Server) memberLiveness(ctx context.Context, t *config.Target) []finding {
	var out []finding
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
	found := make([]finding, len(probes))
	var wg sync.WaitGroup
	for i, p := range probes {
		wg.Add(1)
		go func() {
			defer wg.Done()
			state, what := probeURL(ctx, p.url)
			found[i] = finding{member: p.member, state: state, what: what}
			if state == running {
				found[i].url = p.url
			}
		}()
	}
	wg.Wait()
	for _, f := range found {
		if f.state != stopped {
			out = append(out, f)
		}
	}
	// After the URLs: a member that answers is shown by its URL first.
	pods, err := s.agents.MemberPods(ctx, *t)
	if err != nil {
		out = append(out, finding{state: unknown, what: fmt.Sprintf(
			"the server cannot see which pods use the members' volumes (%v): it needs pods list in namespace %s",
			err, s.agents.MemberNamespace(*t))})
	}
	for _, m := range t.Members {
		for _, p := range pods[m.Name] {
			out = append(out, finding{member: m.Name, state: running, what: "pod " + p + " uses " + jobs.DescribeVolume(m)})
		}
	}
	return out
}

// refuseUnlessStopped is the refusal of a restore while findings say a
// member of t runs, or cannot tell.
func (s *Server) refuseUnlessStopped(t *config.Target, findings []finding) error {
	var live, unsure []string
	for _, f := range findings {
		switch f.state {
		case running:
			live = append(live, f.String())
		case unknown:
			unsure = append(unsure, f.String())
		}
	}
	if len(live) > 0 {
		return status.Errorf(codes.FailedPrecondition,
			"etcd of target %q is still running: %s; a restore must not write under a running member. Stop every member first — scale its StatefulSet or Deployment to 0 (`kubectl -n %s scale statefulset NAME --replicas=0`), or for control-plane etcd move /etc/kubernetes/manifests/etcd.yaml out of /etc/kubernetes/manifests on each node — then run the restore again",
			t.Name, strings.Join(live, ", "), s.agents.MemberNamespace(*t))
	}
	if len(unsure) > 0 {
		return status.Errorf(codes.FailedPrecondition,
			"cannot tell whether etcd of target %q is stopped: %s. A restore must not write under a running member, so it counts a member as stopped only when no pod uses its volume and its client URL refuses connections. Every member's clientURL and the target's endpoints must resolve and be reachable from the server's pod (a ClusterIP Service per member keeps its name while the member is stopped; a headless Service's pod names vanish with the pods, so do not use them there), and the server needs pods list where the members' pods run: fix what is named above, then run the restore again",
			t.Name, strings.Join(unsure, "; "))
	}
	return nil
}

// probeURL says whether etcd serves at a client URL. Accepting a TCP
// connection is not enough (a Service without endpoints may accept and
// close): the peer must send bytes back — an HTTP response, or its side of
// a TLS handshake. A refused connection (or no route to a resolved
// address) means stopped; a name that does not resolve, a timeout or any
// other error means unknown, with what was seen. No credential is used
// and nothing is read from etcd.
func probeURL(ctx context.Context, raw string) (liveness, string) {
	u, err := url.Parse(raw)
	if err != nil {
		return unknown, fmt.Sprintf("%s is not a URL: %v", raw, err)
	}
	host := u.Host
	if u.Port() == "" {
		host = net.JoinHostPort(u.Hostname(), "2379")
	}
	ctx, cancel := context.WithTimeout(ctx, probeTimeout)
	defer cancel()
	var d net.Dialer
	conn, err := d.DialContext(ctx, "tcp", host)
	var dnsErr *net.DNSError
	switch {
	case err == nil:
	case errors.As(err, &dnsErr):
		return unknown, fmt.Sprintf("%s does not resolve from the server (%v)", raw, err)
	case errors.Is(err, syscall.ECONNREFUSED), errors.Is(err, syscall.EHOSTUNREACH):
		return stopped, ""
	case isTimeout(err):
		return unknown, fmt.Sprintf("%s: no answer to a connection within %s", raw, probeTimeout)
	default:
		return unknown, fmt.Sprintf("%s: %v", raw, err)
	}
	defer conn.Close()
	deadline, _ := ctx.Deadline()
	_ = conn.SetDeadline(deadline)
	c := &countingConn{Conn: conn}
	if u.Scheme == "https" {
		// Only whether the server speaks matters, not who it is.
		tc := tls.Client(c, &tls.Config{InsecureSkipVerify: true, ServerName: u.Hostname()}) //nolint:gosec // a liveness probe, no data is exchanged
		err = tc.HandshakeContext(ctx)
	} else if _, err = fmt.Fprintf(c, "GET /version HTTP/1.0\r\nHost: %s\r\n\r\n", u.Host); err == nil {
		var b [1]byte
		_, err = c.Read(b[:])
	}
	switch {
	case c.read > 0:
		return running, ""
	case isTimeout(err):
		return unknown, fmt.Sprintf("%s accepts connections but sent nothing within %s", raw, probeTimeout)
	}
	return stopped, ""
}

func isTimeout(err error) bool {
	var ne net.Error
	return errors.Is(err, context.DeadlineExceeded) || (errors.As(err, &ne) && ne.Timeout())
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
