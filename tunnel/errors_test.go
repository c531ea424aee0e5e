package tunnel

import (
	"context"
	"errors"
	"net"
	"strings"
	"testing"

	authorizationv1 "k8s.io/api/authorization/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/intstr"
	k8stesting "k8s.io/client-go/testing"
)

func failWith(err error) k8stesting.ReactionFunc {
	return func(k8stesting.Action) (bool, runtime.Object, error) { return true, nil, err }
}

func TestResolveAPIErrors(t *testing.T) {
	forbidden := apierrors.NewForbidden(schema.GroupResource{Resource: "services"}, "etcdbackup", errors.New("RBAC: access denied"))
	refused := &net.OpError{Op: "dial", Net: "tcp", Err: errors.New("connection refused")}
	for _, tc := range []struct {
		name           string
		verb, resource string
		err            error
		check          func(t *testing.T, err error)
	}{
		{"get service forbidden", "get", "services", forbidden, func(t *testing.T, err error) {
			var fe *ForbiddenError
			if !errors.As(err, &fe) || fe.Action != "get service eb-system/etcdbackup" || !apierrors.IsForbidden(errors.Unwrap(err)) {
				t.Fatalf("%T %v, want *ForbiddenError for the get, wrapping the API's Forbidden", err, err)
			}
			if !strings.HasPrefix(err.Error(), "get service eb-system/etcdbackup: ") || !strings.Contains(err.Error(), "RBAC: access denied") {
				t.Fatalf("message %q", err)
			}
		}},
		{"list pods forbidden", "list", "pods", apierrors.NewForbidden(schema.GroupResource{Resource: "pods"}, "", errors.New("no")), func(t *testing.T, err error) {
			var fe *ForbiddenError
			if !errors.As(err, &fe) || fe.Action != "list pods of service eb-system/etcdbackup" {
				t.Fatalf("%T %v, want *ForbiddenError for the list", err, err)
			}
		}},
		{"unauthorized", "get", "services", apierrors.NewUnauthorized("token expired"), func(t *testing.T, err error) {
			if !strings.Contains(err.Error(), "the API server did not accept your credentials") || !strings.Contains(err.Error(), "kubectl auth whoami") {
				t.Fatalf("message %q does not say to check the credentials", err)
			}
		}},
		{"unreachable", "get", "services", refused, func(t *testing.T, err error) {
			var ue *UnreachableError
			if !errors.As(err, &ue) || ue.Host != testHost || !errors.Is(err, refused) {
				t.Fatalf("%T %v, want *UnreachableError for %s wrapping the dial error", err, err, testHost)
			}
			want := "cannot reach the Kubernetes API server at " + testHost + " (dial tcp: connection refused); check your kubeconfig, --context and network: `kubectl get pods` must work"
			if err.Error() != want {
				t.Fatalf("message\n %q\nwant\n %q", err, want)
			}
		}},
		{"other error keeps its cause", "get", "services", apierrors.NewInternalError(errors.New("etcd is sad")), func(t *testing.T, err error) {
			if !strings.HasPrefix(err.Error(), "get service eb-system/etcdbackup: ") || !apierrors.IsInternalError(errors.Unwrap(err)) {
				t.Fatalf("%v", err)
			}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d, cs := testDialer(t, Target{}, service("etcdbackup", grpcPort(intstr.FromString("grpc"))), pod("server-1"))
			cs.PrependReactor(tc.verb, tc.resource, failWith(tc.err))
			_, err := d.Resolve(context.Background())
			if err == nil {
				t.Fatal("Resolve succeeded")
			}
			tc.check(t, err)
		})
	}
}

// A refused port-forward is checked with a SelfSubjectAccessReview; when
// RBAC denies it, the error names exactly the permission to grant.
func TestPortForwardForbidden(t *testing.T) {
	ep := &Endpoint{Pod: pod("server-1"), Port: 9443}
	upgradeErr := errors.New("unable to upgrade connection: Forbidden")
	for _, tc := range []struct {
		name string
		// review answers the access review: allowed, or an error.
		allowed   bool
		reviewErr error
		wantTyped bool
	}{
		{name: "denied", allowed: false, wantTyped: true},
		{name: "allowed: another cause", allowed: true},
		{name: "review failed: no guess", reviewErr: apierrors.NewForbidden(schema.GroupResource{Group: "authorization.k8s.io", Resource: "selfsubjectaccessreviews"}, "", errors.New("no"))},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d, cs := testDialer(t, Target{})
			var asked *authorizationv1.ResourceAttributes
			cs.PrependReactor("create", "selfsubjectaccessreviews", func(a k8stesting.Action) (bool, runtime.Object, error) {
				r := a.(k8stesting.CreateAction).GetObject().(*authorizationv1.SelfSubjectAccessReview)
				asked = r.Spec.ResourceAttributes
				if tc.reviewErr != nil {
					return true, nil, tc.reviewErr
				}
				r.Status.Allowed = tc.allowed
				return true, r, nil
			})
			err := d.portForwardError(context.Background(), ep, upgradeErr)
			if asked == nil || asked.Verb != "create" || asked.Resource != "pods" || asked.Subresource != "portforward" || asked.Namespace != testNS {
				t.Fatalf("access review asked about %+v, want create pods/portforward in %s", asked, testNS)
			}
			if !errors.Is(err, upgradeErr) {
				t.Errorf("error %v does not wrap the dial error", err)
			}
			var fe *ForbiddenError
			if typed := errors.As(err, &fe) && fe.Verb != ""; typed != tc.wantTyped {
				t.Fatalf("%T %v: names the missing permission = %v, want %v", err, err, typed, tc.wantTyped)
			}
			if !tc.wantTyped {
				if want := "port-forward to pod eb-system/server-1 port 9443: unable to upgrade connection: Forbidden"; err.Error() != want {
					t.Fatalf("message %q, want %q", err, want)
				}
				return
			}
			for _, want := range []string{
				"port-forward to pod eb-system/server-1 port 9443: forbidden",
				`verb "create"`, `resource "pods/portforward"`, `namespace "eb-system"`,
				"kubectl auth can-i create pods --subresource=portforward -n eb-system",
			} {
				if !strings.Contains(err.Error(), want) {
					t.Errorf("message %q does not contain %q", err, want)
				}
			}
		})
	}
}

func TestForbiddenErrorFormatting(t *testing.T) {
	cause := errors.New("denied")
	p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "ns1", Name: "p"}}
	err := newPortForwardForbidden(&Endpoint{Pod: p, Port: 1}, cause)
	want := `port-forward to pod ns1/p port 1: forbidden: you may not "create" "pods/portforward" in namespace "ns1"; ` +
		`ask an administrator for a Role granting verb "create" on resource "pods/portforward" in namespace "ns1" ` +
		"(check with `kubectl auth can-i create pods --subresource=portforward -n ns1`)"
	if err.Error() != want {
		t.Fatalf("\n got %q\nwant %q", err, want)
	}
	if errors.Unwrap(err) != cause {
		t.Fatal("ForbiddenError does not unwrap to its cause")
	}
	// Without a known permission it is the action and the API's message.
	plain := &ForbiddenError{Action: "get service a/b", Err: cause}
	if plain.Error() != "get service a/b: denied" {
		t.Fatalf("plain ForbiddenError: %q", plain)
	}
}
