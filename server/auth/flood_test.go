package auth_test

import (
	"bytes"
	"context"
	"crypto/sha256"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"

	ebv1 "github.com/kubectl-etcdbackup/kubectl-etcdbackup/api/etcdbackup/v1"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/client"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/server/auth"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/server/config"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/server/jobs"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/server/servertest"
)

// flood is a real in-process server whose agent port is guarded by the
// real AgentGuard over a fake API server that counts TokenReviews, with a
// real backup agent's token file.
type flood struct {
	srv     *servertest.Server
	reviews *atomic.Int64
}

func newFlood(tb testing.TB) *flood {
	tb.Helper()
	c := newCluster(tb)
	var reviews atomic.Int64
	c.cs.PrependReactor("create", "tokenreviews", func(k8stesting.Action) (bool, runtime.Object, error) {
		reviews.Add(1)
		return false, nil, nil
	})
	bj := c.backupJob(tb)
	tok := c.tokenFor(c.pod(tb, bj, "backup-pod", true))
	file := filepath.Join(tb.TempDir(), "token")
	if err := os.WriteFile(file, []byte(agentJWT(tok)), 0o600); err != nil {
		tb.Fatal(err)
	}
	srv := servertest.StartWith(tb, servertest.Options{AgentGuard: c.guard, AgentDialOptions: []grpc.DialOption{client.WithTokenFile(file)}})
	return &flood{srv: srv, reviews: &reviews}
}

// junk sends n calls with tokens that fail the cheap checks, from
// workers goroutines on a connection of their own.
func (f *flood) junk(tb testing.TB, ctx context.Context, n, workers int, token func(i int) string) int64 {
	tb.Helper()
	conn, c, err := client.Dial(f.srv.AgentAddr)
	if err != nil {
		tb.Fatal(err)
	}
	defer conn.Close()
	var sent atomic.Int64
	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() {
			for i := w; i < n && ctx.Err() == nil; i += workers {
				md := metadata.Pairs("authorization", "Bearer "+token(i))
				_, _ = c.Info.GetServerInfo(metadata.NewOutgoingContext(ctx, md), &ebv1.GetServerInfoRequest{})
				sent.Add(1)
			}
		})
	}
	wg.Wait()
	return sent.Load()
}

func junkToken(i int) string {
	switch i % 4 {
	case 0:
		return fmt.Sprintf("junk-%d", i)
	case 1:
		return claimsWith(func(c map[string]any) { c["aud"] = []string{"https://kubernetes.default.svc"}; c["jti"] = i })
	case 2:
		return claimsWith(func(c map[string]any) { c["sub"] = "system:serviceaccount:intruder:default"; c["jti"] = i })
	default:
		return claimsWith(func(c map[string]any) { c["exp"] = time.Now().Add(-time.Minute).Unix(); c["jti"] = i })
	}
}

// wellShaped tokens pass the cheap checks (anyone can write such claims)
// but the API server knows none.
func wellShaped(i int) string {
	return claimsWith(func(c map[string]any) {
		onPod(i)(c)
		c["jti"] = fmt.Sprintf("forged-%d", i)
		c["exp"] = forgedExp
	})
}

// forgedExp keeps each forged token the same from call to call.
var forgedExp = time.Now().Add(time.Hour).Unix()

// upload is the real agent's backup: its Job's backup b1.
func (f *flood) upload(ctx context.Context) error {
	db := bytes.Repeat([]byte{7}, 512)
	sum := sha256.Sum256(db)
	_, err := f.srv.AgentClient.Upload(ctx, bytes.NewReader(append(db, sum[:]...)), &ebv1.UploadHeader{Name: "b1"}, nil)
	return err
}

// A flood of tokens on the agent port costs the API server nothing when
// they are junk and at most one review per distinct well-shaped token,
// while the real agent's backup and a user's list go through. The fake
// API server here answers at once and the guard has no pod cache: the
// tests below put the clients behind real rate limiters.
func TestAgentPortFlood(t *testing.T) {
	f := newFlood(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if n := f.junk(t, ctx, 10_000, 16, junkToken); n != 10_000 {
		t.Fatalf("sent %d", n)
	}
	if n := f.reviews.Load(); n != 0 {
		t.Fatalf("10,000 junk tokens cost %d TokenReviews; want 0", n)
	}

	// Distinct well-shaped tokens, each sent 5 times, while the agent
	// backs up and a user lists.
	const distinct = 200
	var wg sync.WaitGroup
	wg.Go(func() { f.junk(t, ctx, 5*distinct, 16, func(i int) string { return wellShaped(i % distinct) }) })
	if err := f.upload(ctx); err != nil {
		t.Fatalf("the real agent's backup during the flood: %v", err)
	}
	if _, err := f.srv.Client.Backups.ListBackups(ctx, &ebv1.ListBackupsRequest{}); err != nil {
		t.Fatalf("a user's list during the flood: %v", err)
	}
	wg.Wait()
	// Each distinct token is reviewed once, then its answer is cached;
	// one more for the real agent's token.
	if n := f.reviews.Load(); n > distinct+1 {
		t.Fatalf("%d distinct forged tokens sent 5 times each cost %d TokenReviews; want at most %d", distinct, n, distinct+1)
	}
	t.Logf("TokenReviews: %d for %d distinct well-shaped tokens sent %d times, and the agent's", f.reviews.Load(), distinct, 5*distinct)
}

// BenchmarkAgentCallUnderFlood times the real backup agent's calls
// (GetServerInfo through the real guard, after its upload) while 16 goroutines send junk and well-shaped
// forged tokens without pause; it reports the reviews the flood cost.
//
//	go test -run '^$' -bench AgentCallUnderFlood ./server/auth/
func BenchmarkAgentCallUnderFlood(b *testing.B) {
	f := newFlood(b)
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	var sent atomic.Int64
	wg.Go(func() {
		sent.Add(f.junk(b, ctx, 1<<40, 16, func(i int) string {
			if i%2 == 0 {
				return junkToken(i)
			}
			return wellShaped(i)
		}))
	})
	if err := f.upload(context.Background()); err != nil {
		b.Fatal(err)
	}
	b.ResetTimer()
	for b.Loop() {
		if _, err := f.srv.AgentClient.Info.GetServerInfo(context.Background(), &ebv1.GetServerInfoRequest{}); err != nil {
			b.Fatal(err)
		}
	}
	b.StopTimer()
	cancel()
	wg.Wait()
	b.ReportMetric(float64(f.reviews.Load()), "reviews")
	b.ReportMetric(float64(sent.Load()), "flood-calls")
}

// limitedGuard is the agent guard of a server wired as in production:
// its main client and its review client each behind a real 10 QPS
// limiter, and, with caches, pods and Jobs read from informers.
type limitedGuard struct {
	c       *cluster
	main    *limited
	reviews *limited
	guard   *auth.AgentGuard
	pods    auth.PodLister
	jobs    auth.JobLister
}

func newLimitedGuard(t *testing.T, caches bool) *limitedGuard {
	t.Helper()
	c := newCluster(t)
	lg := &limitedGuard{c: c, main: limit(c.cs, mainQPS, mainBurst)}
	rcs := fake.NewClientset()
	c.answerReviews(rcs)
	lg.reviews = limit(rcs, reviewQPS, reviewBurst)
	createLease(t, c.cs)
	cfg := auth.AgentGuardConfig{
		Client: c.cs, Namespace: serverNS, RestoreNamespaces: []string{appNS, otherNS}, ServiceAccount: config.DefaultServiceAccount,
		Signer: c.launcher.Signer(), TargetNamespaces: map[string]string{"app": appNS, "other": otherNS},
		Reviews: auth.AgentReviews{Client: rcs},
	}
	if caches {
		lg.pods, lg.jobs = agentCaches(t, c.cs, serverNS, appNS, otherNS)
		cfg.Pods, cfg.Jobs = lg.pods, lg.jobs
	}
	g, err := auth.NewAgentGuard(cfg)
	if err != nil {
		t.Fatal(err)
	}
	lg.guard = g
	return lg
}

// agent starts a real agent Job (j) with a pod of its own and returns
// the pod's token, once the caches (if any) hold both.
func (lg *limitedGuard) agent(t *testing.T, j *batchv1.Job, pod string) string {
	t.Helper()
	p := lg.c.pod(t, j, pod, true)
	if lg.pods != nil {
		inCache(t, lg.pods, lg.jobs, p, j)
	}
	return podJWT(lg.c.tokenFor(p), p.Namespace, p.Name, string(p.UID))
}

// intruder makes what anyone who may create pods in a restore
// namespace can: a pod of the agents' ServiceAccount with the agents'
// labels (so the server's informers hold it), controlled by owner if
// set, and its valid projected token.
func (lg *limitedGuard) intruder(t *testing.T, name string, owner *batchv1.Job) string {
	t.Helper()
	p := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: appNS, UID: types.UID("uid-of-pod-" + name),
			Labels: map[string]string{jobs.LabelManagedBy: jobs.ManagedBy, jobs.LabelComponent: "restore-agent"}},
		Spec: corev1.PodSpec{ServiceAccountName: config.DefaultServiceAccount, Containers: []corev1.Container{{Name: "sh", Image: "busybox"}}},
	}
	if owner != nil {
		p.OwnerReferences = []metav1.OwnerReference{*metav1.NewControllerRef(owner, batchv1.SchemeGroupVersion.WithKind("Job"))}
	}
	p, err := lg.c.cs.CoreV1().Pods(appNS).Create(context.Background(), p, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if lg.pods != nil {
		inCache(t, lg.pods, lg.jobs, p, nil)
	}
	return podJWT(lg.c.tokenFor(p), appNS, p.Name, string(p.UID))
}

// M2: forged tokens, well-shaped and each distinct, that name pods the
// server never started cost no review at all (the pod cache refuses
// them), so a real agent's fresh token — a new pod, a rotated token —
// is admitted at once while they flood.
func TestAgentPortForgedTokenFlood(t *testing.T) {
	lg := newLimitedGuard(t, true)
	real := lg.agent(t, lg.c.backupJob(t), "backup-pod")

	f := startFlood(8, func(ctx context.Context, i int) (string, error) {
		pod, uid := fmt.Sprintf("restore-b1-%010x-x", i), fmt.Sprintf("uid-%d", i)
		if i%4 == 0 {
			// The real agent's pod name with another UID: its earlier
			// incarnation's, or a guess.
			pod = "backup-pod"
		}
		tok := podJWT(fmt.Sprintf("forged-%d", i), []string{serverNS, appNS}[i%2], pod, uid)
		_, err := lg.guard.Admit(withRawToken(tok), auth.MethodDownloadBackup)
		if status.Code(err) == codes.Unauthenticated && strings.Contains(err.Error(), "unknown to the server") && !strings.Contains(err.Error(), tok) {
			return "", nil
		}
		return "unexpected", err
	})
	waitFor(t, func() bool { return f.calls.Load() >= 5000 })
	within(t, "the real agent's first call (its token never reviewed)", time.Second, func() error {
		_, err := lg.guard.Admit(withRawToken(real), auth.MethodUploadBackup)
		return err
	})
	within(t, "the leader's Lease renewal", time.Second, func() error { leaseRenewal(t, lg.c.cs); return nil })
	seen := f.end()
	if err, ok := seen["unexpected"]; ok {
		t.Fatalf("a forged token naming an unknown pod: %v; want Unauthenticated, pod unknown, without the token", err)
	}
	if n := lg.reviews.count("create tokenreviews"); n != 1 {
		t.Fatalf("%d TokenReviews for %d forged tokens and the real agent's; want 1, the real agent's", n, f.calls.Load())
	}
	if n := lg.main.count("get pods") + lg.main.count("get jobs"); n != 0 {
		t.Fatalf("%d pod and Job reads from the API server; want none (the caches answer)", n)
	}
	t.Logf("%d forged tokens: 0 TokenReviews, 0 reads", f.calls.Load())
}

// M2, from an insider who can see a real agent pod's name and UID:
// forged tokens naming that pod are reviewed, but only at that pod's
// own rate, so another agent's fresh token, and the named agent's
// reviewed one, go through at once.
func TestAgentPortForgedTokensNamingARealPod(t *testing.T) {
	lg := newLimitedGuard(t, true)
	named := lg.agent(t, lg.c.backupJob(t), "backup-pod")
	other := lg.agent(t, lg.c.restoreJob(t), "restore-pod")
	if _, err := lg.guard.Admit(withRawToken(named), auth.MethodUploadBackup); err != nil {
		t.Fatal(err)
	}
	p, err := lg.pods.Pods(serverNS).Get("backup-pod")
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	f := startFlood(8, func(ctx context.Context, i int) (string, error) {
		tok := podJWT(fmt.Sprintf("forged-%d", i), serverNS, p.Name, string(p.UID))
		_, err := lg.guard.Admit(withRawToken(tok), auth.MethodUploadBackup)
		switch {
		case err != nil && strings.Contains(err.Error(), tok):
			return "token in the refusal", err
		case status.Code(err) == codes.Unauthenticated:
			return "", nil
		case status.Code(err) == codes.Unavailable && strings.Contains(err.Error(), "too many token reviews for pod "+serverNS+"/backup-pod"):
			return "own bucket", err
		}
		return "unexpected", err
	})
	waitFor(t, func() bool { return f.saw("own bucket") && f.calls.Load() >= 200 })
	within(t, "another agent's first call", time.Second, func() error {
		_, err := lg.guard.Admit(withRawToken(other), auth.MethodDownloadBackup)
		return err
	})
	within(t, "the named agent's next call", time.Second, func() error {
		_, err := lg.guard.Admit(withRawToken(named), auth.MethodUploadBackup)
		return err
	})
	seen := f.end()
	elapsed := time.Since(start)
	for kind, err := range seen {
		if kind != "own bucket" {
			t.Fatalf("%s: %v", kind, err)
		}
	}
	// Two real tokens, and the forged ones at the pod's rate.
	bound := 2 + auth.DefaultCallerReviewBurst + int(elapsed.Seconds()*auth.DefaultCallerReviewQPS) + 1
	if n := lg.reviews.count("create tokenreviews"); n > bound {
		t.Fatalf("%d TokenReviews in %v; want at most %d", n, elapsed, bound)
	}
	t.Logf("%d forged tokens naming a real pod in %v: %d TokenReviews", f.calls.Load(), elapsed, lg.reviews.count("create tokenreviews"))
}

// M1: a pod made in a restore namespace with the agents' ServiceAccount
// has a valid token. Its flood — as a pod no Job owns, and as one owned
// by a Job of its maker's — costs the main client no pod reads and a
// Job read per DefaultLookupCacheTTL: the leader renews its Lease and a
// real agent is admitted within a second.
func TestAgentPortValidTokenFlood(t *testing.T) {
	lg := newLimitedGuard(t, true)
	real := lg.agent(t, lg.c.backupJob(t), "backup-pod")
	lone := lg.intruder(t, "lone", nil)
	own, err := lg.c.cs.BatchV1().Jobs(appNS).Create(context.Background(), &batchv1.Job{ObjectMeta: metav1.ObjectMeta{Name: "my-job", Namespace: appNS}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	owned := lg.intruder(t, "owned", own)
	floodFrom(t, lg, real, lone, owned, func(elapsed time.Duration) {
		if n := lg.main.count("get pods"); n != 0 {
			t.Errorf("%d pod reads from the API server; want none (the pod cache answers)", n)
		}
		// The Job of its maker's is not in the cache (not the
		// server's labels): read, then reused.
		if n, bound := lg.main.count("get jobs"), 2+int(elapsed/auth.DefaultLookupCacheTTL); n > bound {
			t.Errorf("%d Job reads in %v; want at most %d", n, elapsed, bound)
		}
	})
}

// M1 without the informers (a server not given them): each pod and Job
// is read at most once per DefaultLookupCacheTTL, whatever the flood.
func TestAgentPortValidTokenFloodWithoutCaches(t *testing.T) {
	lg := newLimitedGuard(t, false)
	real := lg.agent(t, lg.c.backupJob(t), "backup-pod")
	lone := lg.intruder(t, "lone", nil)
	own, err := lg.c.cs.BatchV1().Jobs(appNS).Create(context.Background(), &batchv1.Job{ObjectMeta: metav1.ObjectMeta{Name: "my-job", Namespace: appNS}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	owned := lg.intruder(t, "owned", own)
	floodFrom(t, lg, real, lone, owned, func(elapsed time.Duration) {
		// Each of three pods (two intruders, the real agent) and two
		// Jobs read once per TTL.
		if n, bound := lg.main.count("get pods")+lg.main.count("get jobs"), 5*(2+int(elapsed/auth.DefaultLookupCacheTTL)); n > bound {
			t.Errorf("%d pod and Job reads in %v; want at most %d", n, elapsed, bound)
		}
	})
}

// floodFrom floods lg's guard with the valid tokens of the intruders
// lone (no Job owns its pod) and owned (a Job of its maker's owns it),
// checks that a Lease renewal and the real agent's call each take at
// most a second meanwhile and that each intruder is refused for what it
// is, then checks reads (elapsed: the flood's length).
func floodFrom(t *testing.T, lg *limitedGuard, real, lone, owned string, reads func(elapsed time.Duration)) {
	t.Helper()
	start := time.Now()
	f := startFlood(8, func(ctx context.Context, i int) (string, error) {
		tok, who, want := lone, "lone", "not controlled by a Job"
		if i%2 == 1 {
			tok, who, want = owned, "owned", "is not the pod Job"
		}
		_, err := lg.guard.Admit(withRawToken(tok), auth.MethodDownloadBackup)
		if status.Code(err) == codes.PermissionDenied && strings.Contains(err.Error(), want) {
			return "", nil
		}
		return who, err
	})
	// Long enough for the reads' cache to expire twice over.
	waitFor(t, func() bool { return f.calls.Load() >= 5000 && time.Since(start) > 5*auth.DefaultLookupCacheTTL/2 })
	within(t, "the leader's Lease renewal", time.Second, func() error { leaseRenewal(t, lg.c.cs); return nil })
	within(t, "the real agent's call", time.Second, func() error {
		_, err := lg.guard.Admit(withRawToken(real), auth.MethodUploadBackup)
		return err
	})
	seen := f.end()
	elapsed := time.Since(start)
	for who, err := range seen {
		t.Errorf("the %s intruder: %v", who, err)
	}
	// One review per token: each is cached.
	if n := lg.reviews.count("create tokenreviews"); n > 3 {
		t.Errorf("%d TokenReviews for 3 tokens; want at most 3", n)
	}
	if n := lg.main.count("create tokenreviews"); n != 0 {
		t.Errorf("%d TokenReviews on the main client; want none", n)
	}
	reads(elapsed)
	t.Logf("%d calls with valid intruder tokens in %v: %d pod and %d Job reads, %d TokenReviews",
		f.calls.Load(), elapsed, lg.main.count("get pods"), lg.main.count("get jobs"), lg.reviews.count("create tokenreviews"))
}
