package auth

import (
	"context"
	"fmt"
	"slices"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	authnv1 "k8s.io/api/authentication/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	ebv1 "github.com/kubectl-etcdbackup/kubectl-etcdbackup/api/etcdbackup/v1"
)

// Extra keys the API server sets on a token bound to a pod (TokenRequest
// with a Pod boundObjectRef, as projected ServiceAccount tokens are).
const (
	ExtraPodName = "authentication.kubernetes.io/pod-name"
	ExtraPodUID  = "authentication.kubernetes.io/pod-uid"
)

// Reviewer authenticates bearer tokens with the API server's TokenReview.
type Reviewer struct {
	Client kubernetes.Interface
}

// Authenticate returns who token belongs to. With audiences, the token
// must be valid for one of them (a token minted for another audience is
// refused); without, for the API server's own. A token the API server
// does not accept is Unauthenticated, and so is one the API server
// authenticates without naming one of audiences in the review's
// status.audiences; failing to ask it is Unavailable.
func (r Reviewer) Authenticate(ctx context.Context, token string, audiences ...string) (authnv1.UserInfo, error) {
	review, err := r.Client.AuthenticationV1().TokenReviews().Create(ctx, &authnv1.TokenReview{
		Spec: authnv1.TokenReviewSpec{Token: token, Audiences: audiences},
	}, metav1.CreateOptions{})
	if err != nil {
		return authnv1.UserInfo{}, ebv1.ServerErrorf(codes.Unavailable, "cannot authenticate the call: TokenReview failed: %v", err)
	}
	if !review.Status.Authenticated {
		msg := "the API server did not accept the bearer token (expired, revoked, bound to an object that is gone, or not a token of this cluster)"
		if len(audiences) > 0 {
			msg = fmt.Sprintf("the API server did not accept the bearer token for audience %q (wrong audience, expired, or bound to a pod that is gone)", audiences)
		}
		if review.Status.Error != "" {
			msg += ": " + review.Status.Error
		}
		return authnv1.UserInfo{}, status.Error(codes.Unauthenticated, msg)
	}
	// An authenticator that ignores audiences would accept a token for
	// anyone: the API server must say which of ours the token is for.
	if len(audiences) > 0 && !slices.ContainsFunc(review.Status.Audiences, func(a string) bool { return slices.Contains(audiences, a) }) {
		return authnv1.UserInfo{}, status.Errorf(codes.Unauthenticated,
			"the API server authenticated the bearer token but not for audience %q (it answered for %q): refused", audiences, review.Status.Audiences)
	}
	return review.Status.User, nil
}
