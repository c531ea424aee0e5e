package auth

import (
	"container/list"
	"context"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"errors"
	"golang.org/x/sync/singleflight"
	"slices"
	"strings"
	"sync"
	"time"

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
	// the same token (never past the token's exp).
	DefaultReviewCacheTTL = 10 * time.Second
	// DefaultReviewCacheSize bounds the cache (least recently used out).
	DefaultReviewCacheSize = 1024
	// DefaultMaxConcurrentReviews bounds the reviews in flight; more wait
	// at most DefaultReviewQueueWait, then are refused (Unavailable,
	// which agents retry).
	DefaultMaxConcurrentReviews = 8
	DefaultReviewQueueWait      = 250 * time.Millisecond
	// DefaultReviewTimeout bounds one TokenReview.
	DefaultReviewTimeout = 5 * time.Second
)

// AgentReviews bounds the agent guard's TokenReviews; zero fields take
// the defaults above.
type AgentReviews struct {
	// Client makes the reviews: a client of its own (its own rate
	// limiter), so a flood of tokens cannot slow the server's other
	// requests. Nil uses AgentGuardConfig.Client.
	Client kubernetes.Interface
	// CacheTTL and CacheSize bound the cache of review answers.
	CacheTTL  time.Duration
	CacheSize int
	// MaxConcurrent reviews run at once; a call waits QueueWait at most
	// for one.
	MaxConcurrent int
	QueueWait     time.Duration
	// Timeout bounds one review.
	Timeout time.Duration
	// Now is the clock; nil is time.Now.
	Now func() time.Time
}

// TokenAuthenticator says who a bearer token belongs to (Reviewer does,
// with a TokenReview).
type TokenAuthenticator interface {
	Authenticate(ctx context.Context, token string, audiences ...string) (authnv1.UserInfo, error)
}

// agentReviewer puts cheap checks, a cache and a bound on concurrency in
// front of the agent listener's TokenReviews:
//
//  1. the token must look like the projected token of an agent pod — a
//     JWT of at most MaxTokenBytes whose unverified claims have the
//     agent audience, sub system:serviceaccount:NS:SA with NS one where
//     agents run, kubernetes.io pod claims and an exp not past; anything
//     else is refused without a request to the API server. The claims
//     are not trusted for anything but this refusal: the TokenReview
//     decides;
//  2. a review's answer is reused for the same token (keyed by its
//     SHA-256, never the token) for cacheTTL, at most until its exp;
//  3. at most maxConcurrent reviews run at once, each bounded by
//     timeout; a call that cannot start one within queueWait is refused
//     Unavailable.
type agentReviewer struct {
	next           TokenAuthenticator
	serviceAccount string
	namespaces     []string
	now            func() time.Time
	ttl, timeout   time.Duration
	queueWait      time.Duration
	sem            chan struct{}
	cache          *reviewCache
	flight         singleflight.Group
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
		ttl:            o.CacheTTL,
		timeout:        o.Timeout,
		queueWait:      o.QueueWait,
	}
	if r.now == nil {
		r.now = time.Now
	}
	if r.ttl == 0 {
		r.ttl = DefaultReviewCacheTTL
	}
	if r.timeout == 0 {
		r.timeout = DefaultReviewTimeout
	}
	if r.queueWait == 0 {
		r.queueWait = DefaultReviewQueueWait
	}
	n := o.MaxConcurrent
	if n <= 0 {
		n = DefaultMaxConcurrentReviews
	}
	r.sem = make(chan struct{}, n)
	size := o.CacheSize
	if size <= 0 {
		size = DefaultReviewCacheSize
	}
	r.cache = newReviewCache(size)
	return r
}

// Authenticate implements TokenAuthenticator for the agent audience.
func (r *agentReviewer) Authenticate(ctx context.Context, token string, audiences ...string) (authnv1.UserInfo, error) {
	now := r.now()
	exp, err := r.precheck(token, audiences, now)
	if err != nil {
		return authnv1.UserInfo{}, err
	}
	key := sha256.Sum256([]byte(token))
	if e, ok := r.cache.get(key, now); ok {
		return e.user, e.err
	}
	// Concurrent calls with one token share one review: the cache alone
	// would let each of them miss it and ask the API server too.
	v, _, _ := r.flight.Do(string(key[:]), func() (any, error) {
		return r.review(ctx, key, token, exp, now, audiences), nil
	})
	e := v.(reviewEntry)
	return e.user, e.err
}

// review asks the next Authenticator about token (key its SHA-256) within
// the bound on reviews in flight, and caches a definite answer.
func (r *agentReviewer) review(ctx context.Context, key [32]byte, token string, exp, now time.Time, audiences []string) reviewEntry {
	select {
	case r.sem <- struct{}{}:
	default:
		wait := time.NewTimer(r.queueWait)
		select {
		case r.sem <- struct{}{}:
			wait.Stop()
		case <-wait.C:
			return reviewEntry{err: ebv1.ServerError(codes.Unavailable, "too many agent token reviews in flight; try again")}
		case <-ctx.Done():
			wait.Stop()
			return reviewEntry{err: status.FromContextError(ctx.Err()).Err()}
		}
	}
	defer func() { <-r.sem }()
	// Another call may have reviewed the same token meanwhile.
	if e, ok := r.cache.get(key, r.now()); ok {
		return e
	}
	rctx, cancel := context.WithTimeout(ctx, r.timeout)
	defer cancel()
	user, err := r.next.Authenticate(rctx, token, audiences...)
	e := reviewEntry{user: user, err: err}
	if err == nil || status.Code(err) == codes.Unauthenticated {
		// A definite answer; a failure to ask (Unavailable) is not kept.
		e.until = now.Add(r.ttl)
		if exp.Before(e.until) {
			e.until = exp
		}
		r.cache.put(key, e)
	}
	return e
}

// precheck refuses a token that cannot be an agent's, from its
// unverified claims, and returns its exp.
func (r *agentReviewer) precheck(token string, audiences []string, now time.Time) (time.Time, error) {
	refuse := func(why string) (time.Time, error) {
		return time.Time{}, status.Error(codes.Unauthenticated, "the bearer token is not an agent's projected ServiceAccount token: "+why)
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
	return exp, nil
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
	user  authnv1.UserInfo
	err   error
	until time.Time
}

// reviewCache is a bounded LRU of review answers by the token's SHA-256.
type reviewCache struct {
	mu    sync.Mutex
	size  int
	order *list.List // of [32]byte, most recent first
	m     map[[32]byte]*list.Element
	e     map[[32]byte]reviewEntry
}

func newReviewCache(size int) *reviewCache {
	return &reviewCache{size: size, order: list.New(), m: map[[32]byte]*list.Element{}, e: map[[32]byte]reviewEntry{}}
}

func (c *reviewCache) get(k [32]byte, now time.Time) (reviewEntry, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	el, ok := c.m[k]
	if !ok {
		return reviewEntry{}, false
	}
	e := c.e[k]
	if !now.Before(e.until) {
		c.remove(k, el)
		return reviewEntry{}, false
	}
	c.order.MoveToFront(el)
	return e, true
}

func (c *reviewCache) put(k [32]byte, e reviewEntry) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if el, ok := c.m[k]; ok {
		c.e[k] = e
		c.order.MoveToFront(el)
		return
	}
	c.m[k] = c.order.PushFront(k)
	c.e[k] = e
	for c.order.Len() > c.size {
		last := c.order.Back()
		c.remove(last.Value.([32]byte), last)
	}
}

func (c *reviewCache) remove(k [32]byte, el *list.Element) {
	c.order.Remove(el)
	delete(c.m, k)
	delete(c.e, k)
}
