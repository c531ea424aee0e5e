package auth_test

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	authnv1 "k8s.io/api/authentication/v1"
	authzv1 "k8s.io/api/authorization/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"

	ebv1 "github.com/kubectl-etcdbackup/kubectl-etcdbackup/api/etcdbackup/v1"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/server/auth"
)

// userToken is the one token userAPI's TokenReview accepts.
const userToken = "alice-token-6f1c2a9d0b"

// userAPI is an API server's authentication and authorization for the
// user listener: it accepts userToken (alice) and allows her everything,
// and counts her TokenReviews and SubjectAccessReviews.
type userAPI struct {
	cs       *fake.Clientset
	alice    atomic.Int64 // her TokenReviews
	aliceSAR atomic.Int64
}

func newUserAPI() *userAPI {
	u := &userAPI{cs: fake.NewClientset()}
	u.cs.PrependReactor("create", "tokenreviews", func(a k8stesting.Action) (bool, runtime.Object, error) {
		tr := a.(k8stesting.CreateAction).GetObject().(*authnv1.TokenReview).DeepCopy()
		if tr.Spec.Token == userToken {
			u.alice.Add(1)
			tr.Status = authnv1.TokenReviewStatus{Authenticated: true, User: authnv1.UserInfo{Username: "alice", Groups: []string{"system:authenticated"}}}
		} else {
			tr.Status = authnv1.TokenReviewStatus{Error: "invalid bearer token"}
		}
		return true, tr, nil
	})
	u.cs.PrependReactor("create", "subjectaccessreviews", func(a k8stesting.Action) (bool, runtime.Object, error) {
		sar := a.(k8stesting.CreateAction).GetObject().(*authzv1.SubjectAccessReview).DeepCopy()
		if sar.Spec.User == "alice" {
			u.aliceSAR.Add(1)
			sar.Status.Allowed = true
		}
		return true, sar, nil
	})
	return u
}

// testClock is a clock tests move by hand.
type testClock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *testClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *testClock) advance(d time.Duration) {
	c.mu.Lock()
	c.now = c.now.Add(d)
	c.mu.Unlock()
}

// M6: in SubjectAccessReview mode whoever may port-forward to the server
// can send calls with any token. A flood of distinct junk tokens (each
// a TokenReview, as the server cannot tell them from real ones) is held
// to the new tokens' rate and slots: a real user's calls, before and
// after her cached answers expire, and the leader's Lease renewal on the
// main client take at most a second; the flood's excess is refused
// Unavailable with a message saying what to do. With its reviews on the
// main client (the default) and on a client of their own.
func TestUserPortFlood(t *testing.T) {
	for _, own := range []bool{false, true} {
		t.Run(map[bool]string{false: "reviews on the main client", true: "reviews on their own client"}[own], func(t *testing.T) {
			api := newUserAPI()
			main := fake.NewClientset()
			reviews := api.cs
			if !own {
				main = api.cs
			}
			mainCounts := limit(main, mainQPS, mainBurst)
			reviewCounts := mainCounts
			if own {
				reviewCounts = limit(reviews, reviewQPS, reviewBurst)
			}
			createLease(t, main)
			clock := &testClock{now: time.Now()}
			g := &auth.SubjectAccessReviewGuard{Client: main, Namespace: serverNS, Reviews: auth.UserReviews{Now: clock.Now}}
			if own {
				g.Reviews.Client = reviews
			}
			user := func(method string) func() error {
				return func() error {
					_, err := g.Admit(metadataCtx("Bearer "+userToken), method)
					return err
				}
			}
			if err := user(ebv1.BackupService_ListBackups_FullMethodName)(); err != nil {
				t.Fatal(err)
			}

			start := time.Now()
			f := startFlood(16, func(ctx context.Context, i int) (string, error) {
				tok := fmt.Sprintf("junk-%d-0123456789abcdef", i)
				_, err := g.Admit(metadataCtx("Bearer "+tok), ebv1.BackupService_ListBackups_FullMethodName)
				switch {
				case err != nil && strings.Contains(err.Error(), tok):
					return "token in the refusal", err
				case status.Code(err) == codes.Unauthenticated:
					return "", nil
				case status.Code(err) == codes.Unavailable:
					return "busy", err
				}
				return "unexpected", err
			})
			waitFor(t, func() bool { return f.saw("busy") && f.calls.Load() >= 32 })
			within(t, "the leader's Lease renewal on the main client", time.Second, func() error { leaseRenewal(t, main); return nil })
			within(t, "the user's list (her token's answers cached)", time.Second, user(ebv1.BackupService_ListBackups_FullMethodName))
			within(t, "the user's get (a verb not asked yet)", time.Second, user(ebv1.BackupService_GetBackup_FullMethodName))
			clock.advance(auth.DefaultUserReviewCacheTTL + time.Second)
			within(t, "the user's list once her answers expired", time.Second, user(ebv1.BackupService_ListBackups_FullMethodName))
			seen := f.end()
			elapsed := time.Since(start)

			for kind, err := range seen {
				if kind != "busy" {
					t.Errorf("%s: %v", kind, err)
				}
			}
			msg := status.Convert(seen["busy"]).Message()
			for _, want := range []string{"busy checking bearer tokens it has not seen before", "try again in a few seconds", "port-forward", "audit log"} {
				if !strings.Contains(msg, want) {
					t.Errorf("the refusal over the cap %q does not say %q", msg, want)
				}
			}
			// Her token: reviewed once, then again once expired; one
			// decision per verb, the list's again once expired.
			if n := api.alice.Load(); n != 2 {
				t.Errorf("%d TokenReviews of the user's token; want 2", n)
			}
			if n := api.aliceSAR.Load(); n != 3 {
				t.Errorf("%d SubjectAccessReviews of the user's; want 3 (list, get, list once expired)", n)
			}
			junk := reviewCounts.count("create tokenreviews") - int(api.alice.Load())
			if bound := auth.DefaultNewTokenReviewBurst + int(elapsed.Seconds()*auth.DefaultNewTokenReviewQPS) + 1; junk > bound {
				t.Errorf("%d TokenReviews of junk tokens in %v; want at most %d", junk, elapsed, bound)
			}
			if own {
				if n := mainCounts.count("create tokenreviews") + mainCounts.count("create subjectaccessreviews"); n != 0 {
					t.Errorf("%d reviews on the main client; want none", n)
				}
			}
			t.Logf("%d junk calls in %v: %d TokenReviews", f.calls.Load(), elapsed, junk)
		})
	}
}
