package server_test

import (
	"context"
	"crypto/tls"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"runtime"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	authnv1 "k8s.io/api/authentication/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	k8sruntime "k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"

	ebv1 "github.com/kubectl-etcdbackup/kubectl-etcdbackup/api/etcdbackup/v1"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/server"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/server/agenttls"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/server/auth"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/server/config"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/server/jobs"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/server/servertest"
)

// The attacker's and the legitimate callers' source addresses: both on
// the loopback, told apart by the per-source caps as pod IPs are.
const (
	attacker = "127.0.0.2"
	kubelet  = "127.0.0.1"
)

// agentPort serves the agent port over TLS, as the server binary does,
// with guard g and the health port; it returns the server and the TLS
// configuration of a client that trusts it.
func agentPort(t *testing.T, g auth.Guard) (*servertest.Server, *tls.Config) {
	t.Helper()
	ca, err := agenttls.EnsureCA(context.Background(), fake.NewClientset(), agentNS, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	cert, err := ca.ServingCert(agenttls.ServerNames(agentNS), nil, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	cfg := &tls.Config{RootCAs: ca.Pool(), ServerName: "etcdbackup." + agentNS + ".svc", MinVersion: tls.VersionTLS13, NextProtos: []string{"h2"}}
	creds := grpc.WithTransportCredentials(credentials.NewTLS(cfg.Clone()))
	srv := servertest.StartWith(t, servertest.Options{AgentGuard: g, AgentTLS: agenttls.ServerConfig(cert),
		AgentDialOptions: []grpc.DialOption{creds}, Health: true})
	return srv, cfg
}

// dialAttacker opens n connections from the attacker's address: the
// first want must be served, the rest closed by the server at once.
func dialAttacker(t *testing.T, addr string, cfg *tls.Config, n, want int) []*h2client {
	t.Helper()
	var held []*h2client
	for i := range n {
		h, err := dialH2(addr, attacker, cfg)
		if errors.Is(err, errSkipSource) {
			t.Skip(err)
		}
		switch {
		case i < want && err != nil:
			t.Fatalf("connection %d of %d from one source: %v; want it served", i+1, n, err)
		case i >= want && err == nil:
			h.Close()
			t.Fatalf("connection %d from one source was served; want at most %d", i+1, want)
		}
		if err == nil {
			t.Cleanup(h.Close)
			held = append(held, h)
		}
	}
	return held
}

// A caller who reaches the health port and opens more connections than
// it may from one address, each with a Check that never sends its
// request, holds its own share only: the kubelet's probe from another
// address gets in at once, and the half-open calls' connections end
// after HealthMaxConnectionAge, when the same address gets in again.
func TestHalfOpenCallsDoNotHoldTheHealthPort(t *testing.T) {
	srv, _ := agentPort(t, &countingGuard{})
	held := dialAttacker(t, srv.HealthAddr, nil, server.HealthMaxConnectionsPerSource+2, server.HealthMaxConnectionsPerSource)
	start := time.Now()
	for _, h := range held {
		for range 4 { // the health port's streams per connection
			if _, err := h.open("/grpc.health.v1.Health/Check"); err != nil {
				t.Fatal(err)
			}
		}
		// The server has the calls: they are in its handlers, reading.
		if err := h.ping(time.Now().Add(5 * time.Second)); err != nil {
			t.Fatal(err)
		}
	}
	if err := checkFrom(srv.HealthAddr, kubelet, 2*time.Second); err != nil {
		t.Fatalf("the kubelet's probe while the half-open calls are held: %v", err)
	}
	// gRPC adds up to a tenth of jitter to the age, then waits the grace.
	end := start.Add(server.HealthMaxConnectionAge*11/10 + server.HealthMaxConnectionAgeGrace + 3*time.Second)
	for i, h := range held {
		if err := h.closed(end); errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("connection %d with half-open calls still open after %v", i+1, time.Since(start))
		}
	}
	if err := checkFrom(srv.HealthAddr, attacker, 2*time.Second); err != nil {
		t.Fatalf("a probe from the attacker's address once its connections ended: %v", err)
	}
}

// checkFrom is the kubelet's gRPC probe from source: Check, SERVING,
// within timeout.
func checkFrom(addr, source string, timeout time.Duration) error {
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(source)}}
	conn, err := grpc.NewClient("passthrough:///"+addr, grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithContextDialer(func(ctx context.Context, a string) (net.Conn, error) { return d.DialContext(ctx, "tcp", a) }))
	if err != nil {
		return err
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	r, err := healthpb.NewHealthClient(conn).Check(ctx, &healthpb.HealthCheckRequest{})
	if err != nil {
		return err
	}
	if r.GetStatus() != healthpb.HealthCheckResponse_SERVING {
		return errors.New(r.GetStatus().String())
	}
	return nil
}

// On the agent port, half-open calls from more connections than one
// address may have are answered by the guard without their request being
// read, and a real agent's call (the real guard, a fake API server)
// succeeds at once.
func TestHalfOpenCallsDoNotHoldTheAgentPort(t *testing.T) {
	c := newAgentCluster(t)
	srv, cfg := agentPort(t, c.guard)
	held := dialAttacker(t, srv.AgentAddr, cfg, server.AgentMaxConnectionsPerSource+2, server.AgentMaxConnectionsPerSource)
	deadline := time.Now().Add(10 * time.Second)
	for i, h := range held {
		// Half without a token, half with one shaped as an agent's that
		// the API server does not know.
		md := []string{"authorization", "Bearer " + c.junk}
		if i%2 == 0 {
			md = nil
		}
		for _, m := range []string{ebv1.InfoService_GetServerInfo_FullMethodName, ebv1.BackupService_GetBackup_FullMethodName, ebv1.BackupService_UploadBackup_FullMethodName} {
			id, err := h.open(m, md...)
			if err != nil {
				t.Fatal(err)
			}
			st, err := h.answer(id, deadline)
			if err != nil {
				t.Fatalf("%s without its request (connection %d): %v; want it refused", m, i+1, err)
			}
			// The tap's answer without a token; the guard's, whichever
			// refusal, with the junk one.
			if (md == nil && st.status != "16") || st.status == "" || st.status == "0" {
				t.Fatalf("%s without its request, token %v: %+v; want it refused", m, md != nil, st)
			}
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	ctx = metadata.NewOutgoingContext(ctx, metadata.Pairs("authorization", "Bearer "+c.valid))
	if _, err := srv.AgentClient.Info.GetServerInfo(ctx, &ebv1.GetServerInfoRequest{}); err != nil {
		t.Fatalf("a real agent's call beside the half-open ones: %v", err)
	}
}

// A call without a plausible bearer token is refused from its headers:
// before anything of its request is read, and before the guard.
func TestAgentPortRefusesCallsWithoutABearerTokenUnread(t *testing.T) {
	g := newHoldingGuard()
	g.release() // answers at once
	srv, cfg := agentPort(t, g)
	h, err := dialH2(srv.AgentAddr, kubelet, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	deadline := time.Now().Add(10 * time.Second)
	call := func(method string, md ...string) h2stream {
		t.Helper()
		id, err := h.open(method, md...)
		if err != nil {
			t.Fatal(err)
		}
		st, err := h.answer(id, deadline)
		if err != nil {
			t.Fatalf("%s %v: %v", method, md, err)
		}
		return st
	}
	jwt := fakeJWT(map[string]any{"sub": "anyone"})
	for _, tc := range []struct {
		name string
		md   []string
	}{
		{"no authorization", nil},
		{"not bearer", []string{"authorization", "Basic " + jwt}},
		{"not a JWT", []string{"authorization", "Bearer not-a-jwt"}},
		{"a JWT with a stray character", []string{"authorization", "Bearer " + jwt + "!"}},
		{"too long", []string{"authorization", "Bearer " + fakeJWT(map[string]any{"pad": strings.Repeat("a", 8<<10)})}},
		{"two", []string{"authorization", "Bearer " + jwt, "authorization", "Bearer " + jwt}},
	} {
		for _, m := range []string{ebv1.InfoService_GetServerInfo_FullMethodName, ebv1.BackupService_UploadBackup_FullMethodName, ebv1.BackupService_DownloadBackup_FullMethodName} {
			st := call(m, tc.md...)
			if st.status != "16" || !strings.Contains(st.message, `"authorization: Bearer TOKEN" header`) {
				t.Errorf("%s, %s: %+v; want Unauthenticated asking for a bearer token", tc.name, m, st)
			}
		}
	}
	// Health checks are the health port's: the guards let them through
	// unread.
	if st := call("/grpc.health.v1.Health/Check", "authorization", "Bearer "+jwt); st.status != "7" {
		t.Errorf("health Check on the agent port: %+v; want PermissionDenied", st)
	}
	if n := g.arrived(); n != 0 {
		t.Errorf("%d calls reached the guard; want none", n)
	}
	// A plausible one reaches the guard, still without its request.
	if st := call(ebv1.InfoService_GetServerInfo_FullMethodName, "authorization", "Bearer "+jwt); st.status != "16" || !strings.Contains(st.message, "held") {
		t.Errorf("a plausible token: %+v; want the guard's answer", st)
	}
	if err := h.ping(deadline); err != nil {
		t.Fatalf("the connection after the refusals: %v", err)
	}
}

// The memory a caller without a valid token can make the agent port hold:
// from one address, as many connections as it may have, each with 64
// calls that declare a 1 MiB − 1 request, send all the window lets
// through and wait (the guard holding them, as a slow API server would).
// The guard answers before a request is read, so no window opens past
// its initial size: far less than the 1 MiB each call declares.
func TestAgentPortHeapUnderHalfOpenCalls(t *testing.T) {
	g := newHoldingGuard()
	srv, cfg := agentPort(t, g)
	t.Cleanup(g.release)
	before := heapAlloc()

	conns := dialAttacker(t, srv.AgentAddr, cfg, server.AgentMaxConnectionsPerSource, server.AgentMaxConnectionsPerSource)
	token := fakeJWT(map[string]any{"pad": strings.Repeat("x", 4<<10)})
	const perConn = 64
	ids := make([][]uint32, len(conns))
	for i, h := range conns {
		for range perConn {
			id, err := h.open(ebv1.InfoService_GetServerInfo_FullMethodName, "authorization", "Bearer "+token)
			if err != nil {
				t.Fatal(err)
			}
			ids[i] = append(ids[i], id)
		}
	}
	// The server refuses the streams past its limit per connection and
	// hands the others to the guard.
	want := len(conns) * server.AgentMaxConcurrentStreams
	if err := g.waitArrived(want, 10*time.Second); err != nil {
		t.Fatalf("%v; want %d calls in the guard", err, want)
	}
	deadline := time.Now().Add(15 * time.Second)
	var wg sync.WaitGroup
	errs := make(chan error, len(conns))
	for i, h := range conns {
		wg.Go(func() {
			// Until a round sends nothing: once a ping is answered,
			// everything sent has been read off the connection, and a
			// server that opens a window on reading a request's length
			// has said so.
			for progress := true; progress; {
				progress = false
				for _, id := range ids[i] {
					n, err := h.send(id, 1<<20-1, deadline)
					if err != nil {
						errs <- err
						return
					}
					progress = progress || n > 0
				}
				if err := h.ping(deadline); err != nil {
					errs <- err
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	var sent, held int64
	for i, h := range conns {
		h.mu.Lock()
		for _, id := range ids[i] {
			st := h.streams[id]
			sent += st.sent
			if st.updated {
				t.Errorf("the server opened the window of a call its guard has not admitted (%+v)", *st)
			}
			if !st.answered {
				held++
			}
		}
		h.mu.Unlock()
	}
	growth := int64(heapAlloc()) - int64(before)
	t.Logf("%d connections, %d calls held, %.1f MiB sent, heap grew %.1f MiB", len(conns), held, float64(sent)/(1<<20), float64(growth)/(1<<20))
	if held != int64(want) {
		t.Errorf("%d calls held; want %d", held, want)
	}
	if growth > 64<<20 {
		t.Errorf("the heap grew %d MiB; want under 64 MiB", growth>>20)
	}
	g.release()
	for i, h := range conns {
		for _, id := range ids[i] {
			if st, err := h.answer(id, deadline); err != nil || !st.answered {
				t.Fatalf("after the guard answered: %+v %v", st, err)
			}
		}
	}
}

func heapAlloc() uint64 {
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return m.HeapAlloc
}

// holdingGuard is a BearerGuard that holds every call until released,
// then refuses it.
type holdingGuard struct {
	mu       sync.Mutex
	cond     *sync.Cond
	n        int
	released chan struct{}
	once     sync.Once
}

var _ server.BearerGuard = (*holdingGuard)(nil)

func newHoldingGuard() *holdingGuard {
	g := &holdingGuard{released: make(chan struct{})}
	g.cond = sync.NewCond(&g.mu)
	return g
}

func (*holdingGuard) AdmitsOnlyBearerJWTs() {}

func (g *holdingGuard) Admit(ctx context.Context, _ string) (context.Context, error) {
	g.mu.Lock()
	g.n++
	g.cond.Broadcast()
	g.mu.Unlock()
	select {
	case <-g.released:
	case <-ctx.Done():
	}
	return nil, status.Error(codes.Unauthenticated, "held, then refused")
}

func (g *holdingGuard) release() { g.once.Do(func() { close(g.released) }) }

func (g *holdingGuard) arrived() int {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.n
}

// waitArrived waits until n calls have reached the guard.
func (g *holdingGuard) waitArrived(n int, timeout time.Duration) error {
	t := time.AfterFunc(timeout, func() {
		g.mu.Lock()
		g.cond.Broadcast()
		g.mu.Unlock()
	})
	defer t.Stop()
	end := time.Now().Add(timeout)
	g.mu.Lock()
	defer g.mu.Unlock()
	for g.n < n {
		if !time.Now().Before(end) {
			return fmt.Errorf("only %d calls reached the guard", g.n)
		}
		g.cond.Wait()
	}
	return nil
}

// fakeJWT is a token shaped as a JWT with claims, signed by no one.
func fakeJWT(claims map[string]any) string {
	b, err := json.Marshal(claims)
	if err != nil {
		panic(err)
	}
	enc := base64.RawURLEncoding.EncodeToString
	return enc([]byte(`{"alg":"RS256","kid":"test"}`)) + "." + enc(b) + "." + enc([]byte("not-a-signature"))
}

// agentCluster is a fake API server with a running backup Job (made by
// jobs.Launcher), its pod, and the real agent guard over them.
type agentCluster struct {
	guard *auth.AgentGuard
	// valid is the pod's projected token, which TokenReview accepts;
	// junk names the same pod, but the API server never issued it.
	valid, junk string
}

func newAgentCluster(t *testing.T) *agentCluster {
	t.Helper()
	ctx := context.Background()
	cs := fake.NewClientset()
	var mu sync.Mutex
	users := map[string]authnv1.UserInfo{}
	cs.PrependReactor("create", "tokenreviews", func(a k8stesting.Action) (bool, k8sruntime.Object, error) {
		review := a.(k8stesting.CreateAction).GetObject().(*authnv1.TokenReview).DeepCopy()
		mu.Lock()
		u, ok := users[review.Spec.Token]
		mu.Unlock()
		if ok && slices.Contains(review.Spec.Audiences, auth.AgentAudience) {
			review.Status = authnv1.TokenReviewStatus{Authenticated: true, User: u, Audiences: []string{auth.AgentAudience}}
		} else {
			review.Status = authnv1.TokenReviewStatus{Error: "invalid bearer token"}
		}
		return true, review, nil
	})
	// The API server gives every object a UID when it is created.
	cs.PrependReactor("create", "jobs", func(a k8stesting.Action) (bool, k8sruntime.Object, error) {
		j := a.(k8stesting.CreateAction).GetObject().(*batchv1.Job)
		j.UID = types.UID("uid-of-job-" + j.Name)
		return false, nil, nil
	})
	l, err := jobs.New(cs, agentNS, config.Agents{Image: "agent:dev"})
	if err != nil {
		t.Fatal(err)
	}
	if err := l.LoadSigningKey(ctx); err != nil {
		t.Fatal(err)
	}
	const appNS = "app"
	g, err := auth.NewAgentGuard(auth.AgentGuardConfig{
		Client: cs, Namespace: agentNS, RestoreNamespaces: []string{appNS}, ServiceAccount: config.DefaultServiceAccount,
		Signer: l.Signer(), TargetNamespaces: map[string]string{"app": appNS},
	})
	if err != nil {
		t.Fatal(err)
	}
	target := config.Target{
		Name: "app", Endpoints: []string{"http://etcd:2379"}, InsecurePlaintext: true, Namespace: appNS,
		Members: []config.Member{{Name: "m0", PeerURL: "http://m0:2380", DataDir: "data",
			Volume: config.MemberVolume{PersistentVolumeClaim: &config.ClaimRef{ClaimName: "data-m0"}}}},
	}
	j, err := l.StartBackup(ctx, jobs.BackupSpec{Name: "b1", Location: "default", Target: target})
	if err != nil {
		t.Fatal(err)
	}
	p := &corev1.Pod{ObjectMeta: *j.Spec.Template.ObjectMeta.DeepCopy(), Spec: *j.Spec.Template.Spec.DeepCopy()}
	p.Name, p.Namespace, p.UID = "backup-pod", j.Namespace, "uid-of-backup-pod"
	p.OwnerReferences = []metav1.OwnerReference{*metav1.NewControllerRef(j, batchv1.SchemeGroupVersion.WithKind("Job"))}
	if p, err = cs.CoreV1().Pods(p.Namespace).Create(ctx, p, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	token := func(id string) string {
		return fakeJWT(map[string]any{
			"aud": []string{auth.AgentAudience},
			"sub": "system:serviceaccount:" + p.Namespace + ":" + p.Spec.ServiceAccountName,
			"exp": time.Now().Add(time.Hour).Unix(),
			"jti": id,
			"kubernetes.io": map[string]any{
				"namespace": p.Namespace,
				"pod":       map[string]string{"name": p.Name, "uid": string(p.UID)},
			},
		})
	}
	c := &agentCluster{guard: g, valid: token("valid"), junk: token("junk")}
	users[c.valid] = authnv1.UserInfo{
		Username: "system:serviceaccount:" + p.Namespace + ":" + p.Spec.ServiceAccountName,
		Extra: map[string]authnv1.ExtraValue{
			auth.ExtraPodName: {p.Name},
			auth.ExtraPodUID:  {string(p.UID)},
		},
	}
	return c
}
