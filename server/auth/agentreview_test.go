package auth_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	authnv1 "k8s.io/api/authentication/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/client-go/rest"
	k8stesting "k8s.io/client-go/testing"

	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/server/auth"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/server/config"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/server/jobs"
)

// reviewCounter is a fake API server that counts TokenReviews and
// authenticates every token for the audience asked, as the agent of a
// pod that does not exist (so a review that runs ends in PermissionDenied).
type reviewCounter struct {
	cs      *fake.Clientset
	reviews atomic.Int64
	// audiences, when set, is what the review says the token is for.
	audiences []string
}

func newReviewCounter() *reviewCounter {
	r := &reviewCounter{cs: fake.NewClientset()}
	r.cs.PrependReactor("create", "tokenreviews", func(a k8stesting.Action) (bool, runtime.Object, error) {
		r.reviews.Add(1)
		review := a.(k8stesting.CreateAction).GetObject().(*authnv1.TokenReview).DeepCopy()
		auds := review.Spec.Audiences
		if r.audiences != nil {
			auds = r.audiences
		}
		review.Status = authnv1.TokenReviewStatus{Authenticated: true, Audiences: auds, User: authnv1.UserInfo{
			Username: "system:serviceaccount:" + serverNS + ":" + config.DefaultServiceAccount,
			Extra:    map[string]authnv1.ExtraValue{auth.ExtraPodName: {"gone"}, auth.ExtraPodUID: {"u"}},
		}}
		return true, review, nil
	})
	return r
}

func (r *reviewCounter) guard(t *testing.T, reviews auth.AgentReviews) *auth.AgentGuard {
	t.Helper()
	signer, err := jobs.NewSigner(make([]byte, 32))
	if err != nil {
		t.Fatal(err)
	}
	g, err := auth.NewAgentGuard(auth.AgentGuardConfig{
		Client: r.cs, Namespace: serverNS, RestoreNamespaces: []string{appNS}, ServiceAccount: config.DefaultServiceAccount, Reviews: reviews,
		Signer: signer,
	})
	if err != nil {
		t.Fatal(err)
	}
	return g
}

func agentClaims() map[string]any {
	return map[string]any{
		"aud": []string{"etcdbackup"},
		"sub": "system:serviceaccount:" + serverNS + ":" + config.DefaultServiceAccount,
		"exp": time.Now().Add(10 * time.Minute).Unix(),
		"kubernetes.io": map[string]any{
			"namespace": serverNS,
			"pod":       map[string]string{"name": "p", "uid": "u"},
		},
	}
}

func claimsWith(change func(map[string]any)) string {
	c := agentClaims()
	change(c)
	return jwtWith(c)
}

// Tokens that cannot be an agent's are refused from their unverified
// claims, before any request to the API server.
func TestAgentGuardCheapChecks(t *testing.T) {
	r := newReviewCounter()
	g := r.guard(t, auth.AgentReviews{})
	for _, tc := range []struct{ name, token, want string }{
		{"junk", "junk", "not a JWT"},
		{"two segments", "a.b", "not a JWT"},
		{"not base64url", "a+b.c.d", "not a JWT"},
		{"payload not base64", "a.!!!.c", "not a JWT"},
		{"payload not JSON", jwtRaw("not json"), "not JSON"},
		{"too long", strings.Repeat("a", auth.MaxTokenBytes) + ".b.c", "too long"},
		{"API server audience", claimsWith(func(c map[string]any) { c["aud"] = []string{"https://kubernetes.default.svc"} }), "not for audience etcdbackup"},
		{"no audience", claimsWith(func(c map[string]any) { delete(c, "aud") }), "not for audience"},
		{"another ServiceAccount", claimsWith(func(c map[string]any) { c["sub"] = "system:serviceaccount:" + serverNS + ":default" }), "not of the agents' ServiceAccount"},
		{"foreign namespace", claimsWith(func(c map[string]any) {
			c["sub"] = "system:serviceaccount:elsewhere:" + config.DefaultServiceAccount
		}), "in a namespace agents run in"},
		{"a user", claimsWith(func(c map[string]any) { c["sub"] = "alice" }), "not of the agents' ServiceAccount"},
		{"not pod-bound", claimsWith(func(c map[string]any) { delete(c, "kubernetes.io") }), "not bound to a pod"},
		{"expired", claimsWith(func(c map[string]any) { c["exp"] = time.Now().Add(-time.Second).Unix() }), "expired"},
		{"no expiry", claimsWith(func(c map[string]any) { delete(c, "exp") }), "no expiry"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			refusedRaw(t, g, tc.token, codes.Unauthenticated, tc.want)
		})
	}
	// aud as one string is a JWT's other form.
	_, err := g.Admit(withRawToken(claimsWith(func(c map[string]any) { c["aud"] = "etcdbackup" })), auth.MethodGetServerInfo)
	if status.Code(err) != codes.PermissionDenied {
		t.Fatalf("a well-shaped token (aud a string): %v; want the review to pass and the pod check to refuse", err)
	}
	if n := r.reviews.Load(); n != 1 {
		t.Fatalf("%d TokenReviews; want 1, for the one well-shaped token only", n)
	}
}

// A review's answer is reused for the same token within the TTL (and the
// token's exp), and the cache is bounded.
func TestAgentGuardCachesReviews(t *testing.T) {
	r := newReviewCounter()
	now := time.Now()
	var mu sync.Mutex
	clock := func() time.Time { mu.Lock(); defer mu.Unlock(); return now }
	advance := func(d time.Duration) { mu.Lock(); now = now.Add(d); mu.Unlock() }
	g := r.guard(t, auth.AgentReviews{CacheTTL: 10 * time.Second, CacheSize: 2, Now: clock})
	tok := func(i int) string { return claimsWith(onPod(i)) }
	call := func(token string) {
		t.Helper()
		if _, err := g.Admit(withRawToken(token), auth.MethodGetServerInfo); status.Code(err) != codes.PermissionDenied {
			t.Fatalf("Admit: %v; want PermissionDenied from the pod check", err)
		}
	}
	want := func(n int64) {
		t.Helper()
		if got := r.reviews.Load(); got != n {
			t.Fatalf("%d TokenReviews, want %d", got, n)
		}
	}
	call(tok(1))
	call(tok(1))
	want(1)
	advance(9 * time.Second)
	call(tok(1))
	want(1)
	advance(2 * time.Second)
	call(tok(1))
	want(2)
	// Bounded: a third token evicts the least recently used.
	call(tok(2))
	call(tok(3))
	want(4)
	call(tok(3))
	call(tok(2))
	want(4)
	call(tok(1))
	want(5)

	// Never past the token's own exp.
	short := claimsWith(func(c map[string]any) { c["exp"] = clock().Add(3 * time.Second).Unix(); c["jti"] = "short" })
	call(short)
	want(6)
	advance(4 * time.Second)
	refusedRaw(t, g, short, codes.Unauthenticated, "expired")
	want(6)
}

// At most MaxConcurrent reviews run at once; a call that finds none free
// within QueueWait is refused Unavailable (agents retry it) without a
// review. The reviews go to an HTTP API server (the fake clientset runs
// one reaction at a time) through the guard's own client.
func TestAgentGuardBoundsConcurrentReviews(t *testing.T) {
	var reviews atomic.Int64
	gate := make(chan struct{})
	api := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		reviews.Add(1)
		<-gate
		var review authnv1.TokenReview
		_ = json.NewDecoder(req.Body).Decode(&review)
		review.Status = authnv1.TokenReviewStatus{Error: "not this cluster's"}
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(&review)
	}))
	defer api.Close()
	own, err := kubernetes.NewForConfig(&rest.Config{Host: api.URL, QPS: -1})
	if err != nil {
		t.Fatal(err)
	}
	g := newReviewCounter().guard(t, auth.AgentReviews{Client: own, MaxConcurrent: 2, QueueWait: 20 * time.Millisecond})
	var wg sync.WaitGroup
	defer func() { close(gate); wg.Wait() }()
	for i := range 2 {
		wg.Go(func() {
			_, _ = g.Admit(withRawToken(claimsWith(onPod(i))), auth.MethodGetServerInfo)
		})
	}
	waitFor(t, func() bool { return reviews.Load() == 2 })
	for i := range 20 {
		_, err := g.Admit(withRawToken(claimsWith(onPod(100+i))), auth.MethodGetServerInfo)
		if status.Code(err) != codes.Unavailable || !strings.Contains(err.Error(), "too many agent token reviews") {
			t.Fatalf("a review beyond the cap: %v; want Unavailable", err)
		}
	}
	if n := reviews.Load(); n != 2 {
		t.Fatalf("%d TokenReviews started; want the cap, 2", n)
	}
}

// onPod makes the claims of token i, of a pod of its own: the cap on
// reviews is what is tested, not each pod's bucket.
func onPod(i int) func(map[string]any) {
	return func(c map[string]any) {
		c["jti"] = i
		c["kubernetes.io"] = map[string]any{"namespace": serverNS, "pod": map[string]string{"name": fmt.Sprintf("p-%d", i), "uid": "u"}}
	}
}

// The API server must say the token is for our audience: an
// authenticator that ignores audiences would accept anyone's token.
func TestAgentGuardRefusesAReviewForAnotherAudience(t *testing.T) {
	r := newReviewCounter()
	r.audiences = []string{"https://kubernetes.default.svc"}
	g := r.guard(t, auth.AgentReviews{})
	refusedRaw(t, g, jwtWith(agentClaims()), codes.Unauthenticated, "not for audience")
	r.audiences = []string{}
	refusedRaw(t, g, claimsWith(func(c map[string]any) { c["jti"] = "no-audiences" }), codes.Unauthenticated, "not for audience")
}

func jwtRaw(payload string) string {
	t := jwtWith(map[string]any{})
	parts := strings.Split(t, ".")
	return parts[0] + "." + b64(payload) + "." + parts[2]
}

func withRawToken(tok string) context.Context {
	return metadataCtx("Bearer " + tok)
}

func refusedRaw(t *testing.T, g auth.Guard, tok string, code codes.Code, want string) {
	t.Helper()
	_, err := g.Admit(withRawToken(tok), auth.MethodGetServerInfo)
	if status.Code(err) != code || !strings.Contains(status.Convert(err).Message(), want) {
		t.Fatalf("Admit: %v; want %s saying %q", err, code, want)
	}
	if strings.Contains(err.Error(), tok) {
		t.Fatalf("the refusal shows the token: %v", err)
	}
}

// waitFor polls cond (no fixed sleep: it returns as soon as cond holds).
func waitFor(t *testing.T, cond func() bool) {
	t.Helper()
	if err := wait.PollUntilContextTimeout(t.Context(), time.Millisecond, 10*time.Second, true, func(context.Context) (bool, error) {
		return cond(), nil
	}); err != nil {
		t.Fatal("condition not met within 10s")
	}
}
