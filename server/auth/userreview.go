package auth

import (
	"cmp"
	"context"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"strings"
	"time"

	"golang.org/x/sync/singleflight"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	authnv1 "k8s.io/api/authentication/v1"
	authzv1 "k8s.io/api/authorization/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/util/flowcontrol"

	ebv1 "github.com/kubectl-etcdbackup/kubectl-etcdbackup/api/etcdbackup/v1"
)

// Bounds of the user listener's reviews in SubjectAccessReview mode.
// Whoever may port-forward to the server — a right this mode otherwise
// makes worth nothing — can send calls with any token, and each unknown
// token is a TokenReview. Defaults of UserReviews' fields.
const (
	// MaxUserTokenBytes: OIDC and cloud tokens are a few KB; a larger
	// one is not a token the API server would accept.
	MaxUserTokenBytes = 16 << 10
	// DefaultUserReviewCacheTTL is how long a TokenReview's answer and a
	// SubjectAccessReview's decision (per token and permission) are
	// reused: a revoked token or a removed RoleBinding counts for at
	// most this long.
	DefaultUserReviewCacheTTL = 10 * time.Second
	// DefaultUserReviewCacheSize bounds the caches of acceptances and
	// decisions; refusals have one of their own of
	// DefaultNegativeReviewCacheSize, so junk cannot push real users'
	// answers out.
	DefaultUserReviewCacheSize = 1024
	// DefaultMaxConcurrentUserReviews bounds the reviews in flight, for
	// tokens the server accepted in the last hour and, in slots of their
	// own, for tokens it has not: a flood of new tokens does not hold up
	// a returning user. A call that finds no free slot within
	// DefaultUserReviewQueueWait is refused Unavailable, which the
	// plugin retries.
	DefaultMaxConcurrentUserReviews = 4
	DefaultUserReviewQueueWait      = time.Second
	// DefaultNewTokenReviewQPS bounds the TokenReviews of tokens the
	// server has not accepted before, at half the main client's rate:
	// even on that client (no UserReviews.Client), a flood of junk
	// tokens leaves the other half to leader election, Leases and Jobs.
	DefaultNewTokenReviewQPS   = 5
	DefaultNewTokenReviewBurst = 5
	// DefaultReturningReviewQPS and DefaultReturningReviewBurst bound
	// the reviews of tokens accepted before (their re-reviews once the
	// cache expires, and their SubjectAccessReviews): a user's command
	// costs two or three, and someone who holds many valid tokens still
	// cannot take more than a share of the client. With the new tokens'
	// rate, 8 of the main client's 10 a second at most.
	DefaultReturningReviewQPS   = 3
	DefaultReturningReviewBurst = 10
	// DefaultUserReviewTimeout bounds one TokenReview or
	// SubjectAccessReview.
	DefaultUserReviewTimeout = 5 * time.Second
	// returningFor is how long a token the API server accepted counts as
	// a returning user's: about a kubectl token's life.
	returningFor = time.Hour
)

// UserReviews bounds the SubjectAccessReviewGuard's reviews; zero fields
// take the defaults above.
type UserReviews struct {
	// Client makes the TokenReviews and SubjectAccessReviews; nil uses
	// the guard's Client. A client of its own (its own rate limiter)
	// keeps a flood of calls off the server's main client altogether.
	Client kubernetes.Interface
	// CacheTTL and CacheSize bound the caches of answers.
	CacheTTL  time.Duration
	CacheSize int
	// MaxConcurrent reviews run at once (each for returning tokens and
	// new ones); a call waits QueueWait at most for a slot.
	MaxConcurrent int
	QueueWait     time.Duration
	// NewTokenQPS and NewTokenBurst bound the reviews of new tokens,
	// ReturningQPS and ReturningBurst those of tokens accepted before.
	NewTokenQPS    float32
	NewTokenBurst  int
	ReturningQPS   float32
	ReturningBurst int
	// Timeout bounds one review.
	Timeout time.Duration
	// Now is the clock of the caches; nil is time.Now.
	Now func() time.Time
}

// userReviewer is the SubjectAccessReviewGuard's TokenReviews and
// SubjectAccessReviews with caches, shared flights and bounds.
type userReviewer struct {
	client       kubernetes.Interface
	namespace    string
	now          func() time.Time
	ttl, timeout time.Duration
	queueWait    time.Duration
	// returning and returningRate are for tokens the API server
	// accepted within returningFor (seen) and their
	// SubjectAccessReviews; fresh and freshRate for the others.
	returning, fresh         semaphore
	returningRate, freshRate flowcontrol.RateLimiter
	users                    reviewCache
	seen                     *lru[[32]byte, struct{}]
	decisions                *lru[sarKey, sarDecision]
	flight                   singleflight.Group
}

type sarKey struct {
	token [32]byte
	perm  Permission
}

type sarDecision struct {
	allowed bool
	reason  string
}

func newUserReviewer(client kubernetes.Interface, namespace string, o UserReviews) *userReviewer {
	if o.Client != nil {
		client = o.Client
	}
	size := cmp.Or(max(o.CacheSize, 0), DefaultUserReviewCacheSize)
	n := cmp.Or(max(o.MaxConcurrent, 0), DefaultMaxConcurrentUserReviews)
	r := &userReviewer{
		client:    client,
		namespace: namespace,
		now:       o.Now,
		ttl:       cmp.Or(o.CacheTTL, DefaultUserReviewCacheTTL),
		timeout:   cmp.Or(o.Timeout, DefaultUserReviewTimeout),
		queueWait: cmp.Or(o.QueueWait, DefaultUserReviewQueueWait),
		returning: make(semaphore, n),
		fresh:     make(semaphore, n),
		freshRate: flowcontrol.NewTokenBucketRateLimiter(cmp.Or(o.NewTokenQPS, DefaultNewTokenReviewQPS), cmp.Or(o.NewTokenBurst, DefaultNewTokenReviewBurst)),
		returningRate: flowcontrol.NewTokenBucketRateLimiter(cmp.Or(o.ReturningQPS, DefaultReturningReviewQPS),
			cmp.Or(o.ReturningBurst, DefaultReturningReviewBurst)),
		users:     newReviewCache(size),
		seen:      newLRU[[32]byte, struct{}](size),
		decisions: newLRU[sarKey, sarDecision](size),
	}
	if r.now == nil {
		r.now = time.Now
	}
	return r
}

// authenticate says who token (key its SHA-256) belongs to.
func (r *userReviewer) authenticate(ctx context.Context, key [32]byte, token string) (authnv1.UserInfo, error) {
	exp, err := userPrecheck(token, r.now())
	if err != nil {
		return authnv1.UserInfo{}, err
	}
	if e, ok := r.cachedUser(key); ok {
		return e.user, e.err
	}
	return sharedReview(ctx, &r.flight, "token/"+string(key[:]), func(ctx context.Context) reviewEntry {
		return r.tokenReview(ctx, key, token, exp)
	})
}

func (r *userReviewer) cachedUser(key [32]byte) (reviewEntry, bool) {
	return r.users.get(key, r.now())
}

func (r *userReviewer) tokenReview(ctx context.Context, key [32]byte, token string, exp time.Time) reviewEntry {
	if e, ok := r.cachedUser(key); ok {
		return e
	}
	_, returning := r.seen.get(key, r.now())
	release, err := r.slot(ctx, returning)
	if err != nil {
		return reviewEntry{err: err}
	}
	defer release()
	rctx, cancel := context.WithTimeout(ctx, r.timeout)
	defer cancel()
	user, err := Reviewer{Client: r.client}.Authenticate(rctx, token)
	e := reviewEntry{user: user, err: err}
	now := r.now()
	r.users.put(key, e, capAt(now.Add(r.ttl), exp))
	if err == nil {
		r.seen.put(key, struct{}{}, capAt(now.Add(returningFor), exp))
	}
	return e
}

// authorize says whether user, whose token's SHA-256 is key, has perm
// in the server's namespace.
func (r *userReviewer) authorize(ctx context.Context, key [32]byte, user authnv1.UserInfo, perm Permission) (sarDecision, error) {
	k := sarKey{key, perm}
	if d, ok := r.decisions.get(k, r.now()); ok {
		return d, nil
	}
	v, err := shared(ctx, &r.flight, "sar/"+string(key[:])+"/"+perm.String(), func(ctx context.Context) any {
		if d, ok := r.decisions.get(k, r.now()); ok {
			return d
		}
		// The token was just accepted: its user is a returning one.
		release, err := r.slot(ctx, true)
		if err != nil {
			return err
		}
		defer release()
		rctx, cancel := context.WithTimeout(ctx, r.timeout)
		defer cancel()
		sar, err := r.client.AuthorizationV1().SubjectAccessReviews().Create(rctx, &authzv1.SubjectAccessReview{
			Spec: authzv1.SubjectAccessReviewSpec{
				User:   user.Username,
				Groups: user.Groups,
				UID:    user.UID,
				Extra:  extraOf(user),
				ResourceAttributes: &authzv1.ResourceAttributes{
					Namespace: r.namespace,
					Group:     APIGroup,
					Resource:  perm.Resource,
					Verb:      perm.Verb,
				},
			},
		}, metav1.CreateOptions{})
		if err != nil {
			return ebv1.ServerErrorf(codes.Unavailable, "cannot authorize the call: SubjectAccessReview failed: %v", err)
		}
		d := sarDecision{allowed: sar.Status.Allowed && !sar.Status.Denied, reason: sar.Status.Reason}
		r.decisions.put(k, d, r.now().Add(r.ttl))
		return d
	})
	if err != nil {
		return sarDecision{}, err
	}
	if err, ok := v.(error); ok {
		return sarDecision{}, err
	}
	return v.(sarDecision), nil
}

// slot waits for a review slot and its rate — a returning token's, or a
// new one's — and returns its release, or the refusal of a call that
// could not get one in time.
func (r *userReviewer) slot(ctx context.Context, returning bool) (release func(), err error) {
	sem, rate := r.fresh, r.freshRate
	if returning {
		sem, rate = r.returning, r.returningRate
	}
	ok, err := sem.acquire(ctx, r.queueWait)
	if err != nil {
		return nil, status.FromContextError(err).Err()
	}
	if !ok {
		return nil, r.busy(returning)
	}
	wctx, cancel := context.WithTimeout(ctx, r.queueWait)
	err = rate.Wait(wctx)
	cancel()
	if err != nil {
		sem.release()
		return nil, r.busy(returning)
	}
	return sem.release, nil
}

func (r *userReviewer) busy(returning bool) error {
	if returning {
		return ebv1.ServerErrorf(codes.Unavailable,
			"the server is busy checking tokens with the API server (at most %d TokenReviews and SubjectAccessReviews at once, %g a second) and could not check this call's within %s; try again in a few seconds",
			cap(r.returning), r.returningRate.QPS(), r.queueWait)
	}
	return ebv1.ServerErrorf(codes.Unavailable,
		"the server is busy checking bearer tokens it has not seen before (at most %d at once, %g a second) and could not check this call's within %s; try again in a few seconds. "+
			"If this lasts, something that may port-forward to the server is sending calls with many different tokens: the API server's audit log of pods/portforward on the server's pod names it",
		cap(r.fresh), r.freshRate.QPS(), r.queueWait)
}

// userPrecheck refuses, without a request to the API server, a token
// that no authenticator would accept — too long, not printable ASCII, a
// JWT whose exp has passed — and returns a JWT's exp (zero if none).
// Tokens are not all JWTs (static, bootstrap, cloud tokens): anything
// else goes to the TokenReview.
func userPrecheck(token string, now time.Time) (time.Time, error) {
	if len(token) > MaxUserTokenBytes {
		return time.Time{}, status.Errorf(codes.Unauthenticated, "the bearer token is longer than %d KiB: not a token of this cluster", MaxUserTokenBytes>>10)
	}
	for i := 0; i < len(token); i++ {
		if token[i] <= ' ' || token[i] > '~' {
			return time.Time{}, status.Error(codes.Unauthenticated, "the bearer token has characters no bearer token has (not printable ASCII)")
		}
	}
	parts := strings.Split(token, ".")
	if len(parts) != 3 {
		return time.Time{}, nil
	}
	payload, err := base64.RawURLEncoding.DecodeString(strings.TrimRight(parts[1], "="))
	if err != nil {
		return time.Time{}, nil
	}
	var c struct {
		Exp *float64 `json:"exp"`
	}
	if json.Unmarshal(payload, &c) != nil || c.Exp == nil {
		return time.Time{}, nil
	}
	exp := time.Unix(int64(*c.Exp), 0)
	if !now.Before(exp) {
		return time.Time{}, status.Errorf(codes.Unauthenticated,
			"the server did not accept the bearer token: it expired at %s; get a new one (kubectl create token, or your kubeconfig's login)", exp.UTC().Format(time.RFC3339))
	}
	return exp, nil
}

// capAt is until, or exp if that is earlier (zero exp: none).
func capAt(until, exp time.Time) time.Time {
	if !exp.IsZero() && exp.Before(until) {
		return exp
	}
	return until
}

// userTokenKey hashes token: the only form in which the caches hold it.
func userTokenKey(token string) [32]byte { return sha256.Sum256([]byte(token)) }
