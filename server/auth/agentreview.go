package auth

import (
	"cmp"
	"context"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"errors"
	"slices"
	"strings"
	"time"

	"golang.org/x/sync/singleflight"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	authnv1 "k8s.io/api/authentication/v1"
	"k8s.io/client-go/kubernetes"

	ebv1 "github.com/kubectl-etcdbackup/kubectl-etcdbackup/api/etcdbackup/v1"
)

// Bounds of the agent listener's token reviews: whoever reaches the
// agent port can send tokens, and each review is a call to the API
// server. Defaults of AgentGuardConfig's fields.
const (
	// MaxTokenBytes: a projected ServiceAccount token is 1–2 KB.
	MaxTokenBytes = 8 << 10
	// DefaultReviewCacheTTL is how long a review's answer is reused for
	// the same token (never past the token's exp), an acceptance or a
	// refusal alike: a refused token does not become valid, and an
	// accepted one is checked against its pod on every call anyway.
	DefaultReviewCacheTTL = 10 * time.Second
	// DefaultReviewCacheSize bounds the cache of acceptances (least
	// recently used out).
	DefaultReviewCacheSize = 1024
	// DefaultNegativeReviewCacheSize bounds the cache of refusals. It is
	// a cache of its own so that a flood of forged tokens, each refused,
	// cannot push the real agents' acceptances out.
	DefaultNegativeReviewCacheSize = 4096
	// DefaultMaxConcurrentReviews bounds the reviews in flight; more wait
	// at most DefaultReviewQueueWait, then are refused (Unavailable,
	// which agents retry). With pod caches (AgentGuardConfig.Pods), the
	// bound is for tokens of pods the cache knows; tokens whose pod it
	// cannot vouch for have half as many slots of their own, so they can
	// neither take the known pods' slots nor queue more than a few
	// requests ahead of them on the review client's rate limiter.
	DefaultMaxConcurrentReviews = 8
	DefaultReviewQueueWait      = 250 * time.Millisecond
	// DefaultReviewTimeout bounds one TokenReview.
	DefaultReviewTimeout = 5 * time.Second
	// DefaultCallerReviewQPS and DefaultCallerReviewBurst bound the
	// reviews of tokens that claim one pod: a real agent needs one per
	// token and DefaultReviewCacheTTL (its token changes every few
	// minutes), so a caller who sends more waits on its own bucket, at
	// most DefaultCallerReviewWait, and is then refused Unavailable.
	DefaultCallerReviewQPS   = 1
	DefaultCallerReviewBurst = 4
	DefaultCallerReviewWait  = time.Second
	// callerLimitsSize bounds the number of callers with a bucket.
	callerLimitsSize = 4096
)

// AgentReviews bounds the agent guard's TokenReviews; zero fields take
// the defaults above.
type AgentReviews struct {
	// Client makes the reviews: a client of its own (its own rate
	// limiter), so a flood of tokens cannot slow the server's other
	// requests. Nil uses AgentGuardConfig.Client.
	Client kubernetes.Interface
	// CacheTTL and CacheSize bound the cache of review answers
	// (CacheSize the acceptances; refusals are kept apart, up to
	// DefaultNegativeReviewCacheSize).
	CacheTTL  time.Duration
	CacheSize int
	// MaxConcurrent reviews run at once; a call waits QueueWait at most
	// for one.
	MaxConcurrent int
	QueueWait     time.Duration
	// Timeout bounds one review.
	Timeout time.Duration
	// CallerQPS and CallerBurst bound the reviews per claimed pod;
	// CallerWait is the longest a call waits on its pod's bucket.
	CallerQPS   float32
	CallerBurst int
	CallerWait  time.Duration
	// Now is the clock; nil is time.Now.
	Now func() time.Time
}

// TokenAuthenticator says who a bearer token belongs to (Reviewer does,
// with a TokenReview).
type TokenAuthenticator interface {
	Authenticate(ctx context.Context, token string, audiences ...string) (authnv1.UserInfo, error)
}

// agentReviewer puts cheap checks, caches and bounds in front of the
// agent listener's TokenReviews:
//
//  1. the token must look like the projected token of an agent pod — a
//     JWT of at most MaxTokenBytes whose unverified claims have the
//     agent audience, sub system:serviceaccount:NS:SA with NS one where
//     agents run, kubernetes.io pod claims and an exp not past; anything
//     else is refused without a request to the API server. The claims
//     are not trusted for anything but this refusal and for choosing
//     which bucket and which slots the review takes: the TokenReview
//     decides;
//  2. a review's answer is reused for the same token (keyed by its
//     SHA-256, never the token) for ttl, at most until its exp;
//     acceptances and refusals in caches of their own;
//  3. concurrent calls with one token share one review;
//  4. reviews per claimed pod are rate limited (callers), so that one
//     pod's flood waits on its own bucket;
//  5. at most maxConcurrent reviews run at once for tokens whose pod the
//     guard's pod cache knows (known), and fewer, in slots of their own,
//     for the others (unverified), each bounded by timeout; a call that
//     cannot start one within queueWait is refused Unavailable.
type agentReviewer struct {
	next           TokenAuthenticator
	serviceAccount string
	namespaces     []string
	now            func() time.Time
	ttl, timeout   time.Duration
	queueWait      time.Duration
	// known is for tokens of pods the cache knows; unverified for the
	// rest. Without a pod cache they are the same slots.
	known, unverified semaphore
	callers           *callerLimits
	cache             reviewCache
	flight            singleflight.Group
}

// newAgentReviewer reviews agent tokens for cfg (whose RestoreNamespaces
// include the server's).
func newAgentReviewer(cfg AgentGuardConfig) *agentReviewer {
	o := cfg.Reviews
	client := o.Client
	if client == nil {
		client = cfg.Client
	}
	r := &agentReviewer{
		next:           Reviewer{Client: client},
		serviceAccount: cfg.ServiceAccount,
		namespaces:     cfg.RestoreNamespaces,
		now:            o.Now,
		ttl:            cmp.Or(o.CacheTTL, DefaultReviewCacheTTL),
		timeout:        cmp.Or(o.Timeout, DefaultReviewTimeout),
		queueWait:      cmp.Or(o.QueueWait, DefaultReviewQueueWait),
		callers: newCallerLimits(cmp.Or(o.CallerQPS, DefaultCallerReviewQPS), cmp.Or(o.CallerBurst, DefaultCallerReviewBurst),
			cmp.Or(o.CallerWait, DefaultCallerReviewWait), callerLimitsSize),
		cache: newReviewCache(cmp.Or(max(o.CacheSize, 0), DefaultReviewCacheSize)),
	}
	if r.now == nil {
		r.now = time.Now
	}
	n := cmp.Or(max(o.MaxConcurrent, 0), DefaultMaxConcurrentReviews)
	r.known = make(semaphore, n)
	r.unverified = r.known
	if cfg.Pods != nil {
		r.unverified = make(semaphore, max(n/2, 1))
	}
	return r
}

// agentClaims are what a token says of itself, unverified: enough to
// refuse it cheaply and to route it, never to admit it.
type agentClaims struct {
	namespace, pod, podUID string
	exp                    time.Time
}

// caller names the pod the token claims, for its bucket.
func (c agentClaims) caller() string { return c.namespace + "/" + c.pod }

// authenticate reviews token (whose unverified claims are c), for the
// agent audience, in the known pods' slots if known.
func (r *agentReviewer) authenticate(ctx context.Context, token string, c agentClaims, known bool) (authnv1.UserInfo, error) {
	key := sha256.Sum256([]byte(token))
	if e, ok := r.cached(key); ok {
		return e.user, e.err
	}
	// Concurrent calls with one token share one review: the cache alone
	// would let each of them miss it and ask the API server too.
	return sharedReview(ctx, &r.flight, string(key[:]), func(ctx context.Context) reviewEntry {
		return r.review(ctx, key, token, c, known)
	})
}

func (r *agentReviewer) cached(key [32]byte) (reviewEntry, bool) {
	return r.cache.get(key, r.now())
}

// review asks the next Authenticator about token (key its SHA-256)
// within the caller's bucket and the bound on reviews in flight, and
// caches a definite answer.
func (r *agentReviewer) review(ctx context.Context, key [32]byte, token string, c agentClaims, known bool) reviewEntry {
	// Another call may have reviewed the same token meanwhile.
	if e, ok := r.cached(key); ok {
		return e
	}
	if !r.callers.wait(ctx, c.caller()) {
		return reviewEntry{err: ebv1.ServerErrorf(codes.Unavailable,
			"too many token reviews for pod %s/%s (each pod's tokens are reviewed at most %d at once, then %g per second); try again",
			c.namespace, c.pod, r.callers.burst, r.callers.qps)}
	}
	sem := r.unverified
	if known {
		sem = r.known
	}
	ok, err := sem.acquire(ctx, r.queueWait)
	if err != nil {
		return reviewEntry{err: status.FromContextError(err).Err()}
	}
	if !ok {
		return reviewEntry{err: ebv1.ServerError(codes.Unavailable, "too many agent token reviews in flight; try again")}
	}
	defer sem.release()
	rctx, cancel := context.WithTimeout(ctx, r.timeout)
	defer cancel()
	user, err := r.next.Authenticate(rctx, token, AgentAudience)
	e := reviewEntry{user: user, err: err}
	r.cache.put(key, e, capAt(r.now().Add(r.ttl), c.exp))
	return e
}

// shared runs fn once for all concurrent callers with key and returns
// its result to each caller unless that caller's ctx ends first. fn runs
// under the first caller's context: detached, work for callers who all
// left (a flood of calls with short deadlines) would pile up.
func shared(ctx context.Context, g *singleflight.Group, key string, fn func(context.Context) any) (any, error) {
	ch := g.DoChan(key, func() (any, error) { return fn(ctx), nil })
	select {
	case res := <-ch:
		return res.Val, nil
	case <-ctx.Done():
		return nil, status.FromContextError(ctx.Err()).Err()
	}
}

// sharedReview is shared for a TokenReview, its answer unpacked.
func sharedReview(ctx context.Context, g *singleflight.Group, key string, review func(context.Context) reviewEntry) (authnv1.UserInfo, error) {
	v, err := shared(ctx, g, key, func(ctx context.Context) any { return review(ctx) })
	if err != nil {
		return authnv1.UserInfo{}, err
	}
	e := v.(reviewEntry)
	return e.user, e.err
}

// precheck refuses a token that cannot be an agent's, from its
// unverified claims, and returns them.
func (r *agentReviewer) precheck(token string, audiences []string, now time.Time) (agentClaims, error) {
	refuse := func(why string) (agentClaims, error) {
		return agentClaims{}, status.Error(codes.Unauthenticated, "the bearer token is not an agent's projected ServiceAccount token: "+why)
	}
	if len(token) > MaxTokenBytes {
		return refuse("too long")
	}
	parts := strings.Split(token, ".")
	if len(parts) != 3 || parts[0] == "" || parts[1] == "" || parts[2] == "" {
		return refuse("not a JWT (three base64url segments)")
	}
	for _, p := range []string{parts[0], parts[2]} {
		if !isBase64URL(p) {
			return refuse("not a JWT (three base64url segments)")
		}
	}
	payload, err := base64.RawURLEncoding.DecodeString(strings.TrimRight(parts[1], "="))
	if err != nil {
		return refuse("not a JWT (three base64url segments)")
	}
	var c struct {
		Aud audience `json:"aud"`
		Sub string   `json:"sub"`
		Exp *float64 `json:"exp"`
		K8s *struct {
			Pod *struct {
				Name string `json:"name"`
				UID  string `json:"uid"`
			} `json:"pod"`
		} `json:"kubernetes.io"`
	}
	if err := json.Unmarshal(payload, &c); err != nil {
		return refuse("its claims are not JSON")
	}
	for _, a := range audiences {
		if !slices.Contains(c.Aud, a) {
			return refuse("not for audience " + a)
		}
	}
	ns, sa, ok := strings.Cut(strings.TrimPrefix(c.Sub, "system:serviceaccount:"), ":")
	if !ok || !strings.HasPrefix(c.Sub, "system:serviceaccount:") || sa != r.serviceAccount || !slices.Contains(r.namespaces, ns) {
		return refuse("not of the agents' ServiceAccount " + r.serviceAccount + " in a namespace agents run in")
	}
	if c.K8s == nil || c.K8s.Pod == nil || c.K8s.Pod.Name == "" || c.K8s.Pod.UID == "" {
		return refuse("not bound to a pod")
	}
	if c.Exp == nil {
		return refuse("no expiry")
	}
	exp := time.Unix(int64(*c.Exp), 0)
	if !now.Before(exp) {
		return refuse("expired")
	}
	return agentClaims{namespace: ns, pod: c.K8s.Pod.Name, podUID: c.K8s.Pod.UID, exp: exp}, nil
}

func isBase64URL(s string) bool {
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !('A' <= c && c <= 'Z' || 'a' <= c && c <= 'z' || '0' <= c && c <= '9' || c == '-' || c == '_' || c == '=') {
			return false
		}
	}
	return true
}

// audience is a JWT aud: one string or a list.
type audience []string

func (a *audience) UnmarshalJSON(b []byte) error {
	var one string
	if err := json.Unmarshal(b, &one); err == nil {
		*a = audience{one}
		return nil
	}
	var many []string
	if err := json.Unmarshal(b, &many); err != nil {
		return errors.New("aud is neither a string nor a list of strings")
	}
	*a = many
	return nil
}

type reviewEntry struct {
	user authnv1.UserInfo
	err  error
}

// reviewCache keeps definite review answers by token hash, acceptances
// and refusals apart, so that a flood of refused tokens cannot push real
// callers' answers out. A failure to ask (Unavailable) is not kept.
type reviewCache struct {
	accepted, refused *lru[[32]byte, reviewEntry]
}

func newReviewCache(size int) reviewCache {
	return reviewCache{accepted: newLRU[[32]byte, reviewEntry](size), refused: newLRU[[32]byte, reviewEntry](DefaultNegativeReviewCacheSize)}
}

func (c reviewCache) get(key [32]byte, now time.Time) (reviewEntry, bool) {
	if e, ok := c.accepted.get(key, now); ok {
		return e, true
	}
	return c.refused.get(key, now)
}

func (c reviewCache) put(key [32]byte, e reviewEntry, until time.Time) {
	switch {
	case e.err == nil:
		c.accepted.put(key, e, until)
	case status.Code(e.err) == codes.Unauthenticated:
		c.refused.put(key, e, until)
	}
}
