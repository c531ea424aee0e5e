// Package liveness tells whether the members of an etcd target are
// stopped, as a restore requires: from the pods the API shows using their
// volumes and from their client URLs answering or refusing connections.
package liveness

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

	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/server/config"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/server/jobs"
)

// probeTimeout bounds the check that a member is stopped; a member that
// neither answers nor refuses within it is "unknown" and the restore is
// refused. A variable for tests.
var probeTimeout = 5 * time.Second

// State is what the server could learn about whether an etcd member
// runs.
type State int

const (
	Stopped State = iota
	Running
	// Unknown: neither evidence of running nor of being stopped (a name
	// that does not resolve, a timeout, a pod list refused).
	Unknown
)

// Finding is one piece of evidence about a member (Member "" for a
// target endpoint or the whole target).
type Finding struct {
	Member string
	State  State
	// What was seen, for people: "pod NS/NAME uses pvc/X", a URL that
	// answers, or why the state is unknown.
	What string
	// URL is the client URL that answers, when that is the evidence.
	URL string
}

func (f Finding) String() string {
	switch {
	case f.URL != "" && f.Member != "":
		return fmt.Sprintf("%s (%s) answers", f.Member, f.URL)
	case f.URL != "":
		return f.URL + " answers"
	case f.Member != "":
		return fmt.Sprintf("%s (%s)", f.Member, f.What)
	}
	return f.What
}

// DryRunMessage is what a restore's dry run says of the member.
func (f Finding) DryRunMessage() string {
	switch {
	case f.State == Unknown:
		return "cannot tell whether it runs: " + f.What + "; the restore would be refused"
	case f.URL != "":
		return "still answers on " + f.URL + ": stop it before restoring"
	}
	return "still running: " + f.What + "; stop it before restoring"
}

// Members gathers what says a member of t runs, or may: the API showing
// a pod that uses its volume (jobs.Launcher.MemberPods), and its client
// URL (and any target endpoint) answering. A member is stopped only when
// the API shows no such pod and its URL refuses connections; stopped
// members have no finding.
func Members(ctx context.Context, agents *jobs.Launcher, t *config.Target) []Finding {
	out := probeURLs(ctx, t)
	// After the URLs: a member that answers is shown by its URL first.
	pods, err := agents.MemberPods(ctx, *t)
	if err != nil {
		out = append(out, Finding{State: Unknown, What: fmt.Sprintf(
			"the server cannot see which pods use the members' volumes (%v): it needs pods list in namespace %s",
			err, agents.MemberNamespace(*t))})
	}
	for _, m := range t.Members {
		for _, p := range pods[m.Name] {
			out = append(out, Finding{Member: m.Name, State: Running, What: "pod " + p + " uses " + jobs.DescribeVolume(m)})
		}
	}
	return out
}

// probeURLs probes every member's client URL and every other endpoint of
// t at once; it returns the findings of those not stopped.
func probeURLs(ctx context.Context, t *config.Target) []Finding {
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
	found := make([]Finding, len(probes))
	var wg sync.WaitGroup
	for i, p := range probes {
		wg.Add(1)
		go func() {
			defer wg.Done()
			state, what := probeURL(ctx, p.url)
			found[i] = Finding{Member: p.member, State: state, What: what}
			if state == Running {
				found[i].URL = p.url
			}
		}()
	}
	wg.Wait()
	var out []Finding
	for _, f := range found {
		if f.State != Stopped {
			out = append(out, f)
		}
	}
	return out
}

// RefuseUnlessStopped is the refusal of a restore while findings say a
// member of t runs, or cannot tell; nil when they say nothing.
func RefuseUnlessStopped(agents *jobs.Launcher, t *config.Target, findings []Finding) error {
	var live, unsure []string
	for _, f := range findings {
		switch f.State {
		case Running:
			live = append(live, f.String())
		case Unknown:
			unsure = append(unsure, f.String())
		}
	}
	if len(live) > 0 {
		return status.Errorf(codes.FailedPrecondition,
			"etcd of target %q is still running: %s; a restore must not write under a running member. Stop every member first — scale its StatefulSet or Deployment to 0 (`kubectl -n %s scale statefulset NAME --replicas=0`), or for control-plane etcd move /etc/kubernetes/manifests/etcd.yaml out of /etc/kubernetes/manifests on each node — then run the restore again",
			t.Name, strings.Join(live, ", "), agents.MemberNamespace(*t))
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
func probeURL(ctx context.Context, raw string) (State, string) {
	u, err := url.Parse(raw)
	if err != nil {
		return Unknown, fmt.Sprintf("%s is not a URL: %v", raw, err)
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
		return Unknown, fmt.Sprintf("%s does not resolve from the server (%v)", raw, err)
	case errors.Is(err, syscall.ECONNREFUSED), errors.Is(err, syscall.EHOSTUNREACH):
		return Stopped, ""
	case isTimeout(err):
		return Unknown, fmt.Sprintf("%s: no answer to a connection within %s", raw, probeTimeout)
	default:
		return Unknown, fmt.Sprintf("%s: %v", raw, err)
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
		return Running, ""
	case isTimeout(err):
		return Unknown, fmt.Sprintf("%s accepts connections but sent nothing within %s", raw, probeTimeout)
	}
	return Stopped, ""
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
