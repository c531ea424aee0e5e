package auth

import (
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	authnv1 "k8s.io/api/authentication/v1"
	authzv1 "k8s.io/api/authorization/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	k8sruntime "k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/client-go/rest"
	k8stesting "k8s.io/client-go/testing"
	"sigs.k8s.io/yaml"

	ebv1 "github.com/kubectl-etcdbackup/kubectl-etcdbackup/api/etcdbackup/v1"
)

const (
	testNamespace = "etcdbackup-system"
	testToken     = "s3cr3t-token-value"
)

// apiServer is a fake API server's authentication and authorization: it
// knows one token, and allows what allow says.
type apiServer struct {
	client  *fake.Clientset
	user    authnv1.UserInfo
	allow   func(authzv1.ResourceAttributes) (allowed bool, reason string)
	sarErr  error
	reviews []authnv1.TokenReview
	sars    []authzv1.SubjectAccessReview
}

func newAPIServer(t *testing.T) *apiServer {
	t.Helper()
	a := &apiServer{
		client: fake.NewClientset(),
		user: authnv1.UserInfo{
			Username: "alice@example.com",
			UID:      "uid-1234",
			Groups:   []string{"team-etcd", "system:authenticated"},
			Extra:    map[string]authnv1.ExtraValue{"scopes": {"a", "b"}},
		},
		allow: func(authzv1.ResourceAttributes) (bool, string) { return true, "" },
	}
	a.client.PrependReactor("create", "tokenreviews", func(action k8stesting.Action) (bool, k8sruntime.Object, error) {
		tr := action.(k8stesting.CreateAction).GetObject().(*authnv1.TokenReview).DeepCopy()
		a.reviews = append(a.reviews, *tr)
		if tr.Spec.Token == testToken && len(tr.Spec.Audiences) == 0 {
			tr.Status = authnv1.TokenReviewStatus{Authenticated: true, User: a.user}
		} else {
			tr.Status = authnv1.TokenReviewStatus{Error: "invalid bearer token"}
		}
		return true, tr, nil
	})
	a.client.PrependReactor("create", "subjectaccessreviews", func(action k8stesting.Action) (bool, k8sruntime.Object, error) {
		sar := action.(k8stesting.CreateAction).GetObject().(*authzv1.SubjectAccessReview).DeepCopy()
		a.sars = append(a.sars, *sar)
		if a.sarErr != nil {
			return true, nil, a.sarErr
		}
		sar.Status.Allowed, sar.Status.Reason = a.allow(*sar.Spec.ResourceAttributes)
		return true, sar, nil
	})
	return a
}

func withToken(token string) context.Context {
	return metadata.NewIncomingContext(context.Background(), metadata.Pairs(AuthorizationHeader, "Bearer "+token))
}

// The verb each RPC takes is part of the product's interface: roles in
// manifests/roles.yaml and docs/design.md name them.
func TestEveryRPCHasItsDocumentedVerb(t *testing.T) {
	want := map[string]string{
		"/etcdbackup.v1.InfoService/GetServerInfo":     "get backups",
		"/etcdbackup.v1.BackupService/ListBackups":     "list backups",
		"/etcdbackup.v1.BackupService/GetBackup":       "get backups",
		"/etcdbackup.v1.BackupService/DeleteBackup":    "delete backups",
		"/etcdbackup.v1.BackupService/UploadBackup":    "upload backups",
		"/etcdbackup.v1.BackupService/DownloadBackup":  "download backups",
		"/etcdbackup.v1.BackupService/CreateBackup":    "create backups",
		"/etcdbackup.v1.BackupService/GetBackupLogs":   "logs backups",
		"/etcdbackup.v1.BackupService/VerifyBackup":    "get backups",
		"/etcdbackup.v1.BackupService/RestoreBackup":   "create restores",
		"/etcdbackup.v1.BackupService/GetRestore":      "get restores",
		"/etcdbackup.v1.BackupService/GetBackupEvents": "logs backups",
		"/etcdbackup.v1.BackupService/PruneBackups":    "delete backups",
		"/etcdbackup.v1.BackupService/DrillBackup":     "drill backups",
		"/etcdbackup.v1.BackupService/CheckLocation":   "check locations",
		"/etcdbackup.v1.BackupService/GetLedger":       "audit backups",
	}
	for _, sd := range []grpc.ServiceDesc{ebv1.InfoService_ServiceDesc, ebv1.BackupService_ServiceDesc} {
		var names []string
		for _, m := range sd.Methods {
			names = append(names, m.MethodName)
		}
		for _, s := range sd.Streams {
			names = append(names, s.StreamName)
		}
		for _, name := range names {
			method := "/" + sd.ServiceName + "/" + name
			if _, ok := want[method]; !ok {
				t.Errorf("%s has no documented verb: add it to this table, UserPermissions, manifests/roles.yaml and docs/design.md", method)
			}
		}
	}
	for method, w := range want {
		t.Run(method, func(t *testing.T) {
			a := newAPIServer(t)
			g := NewSubjectAccessReviewGuard(a.client, testNamespace)
			if _, err := g.Admit(withToken(testToken), method); err != nil {
				t.Fatalf("Admit: %v", err)
			}
			if len(a.sars) != 1 {
				t.Fatalf("%d SubjectAccessReviews, want 1", len(a.sars))
			}
			ra := a.sars[0].Spec.ResourceAttributes
			if got := ra.Verb + " " + ra.Resource; got != w {
				t.Errorf("%s is authorized as %q, want %q", method, got, w)
			}
		})
	}
	if len(UserPermissions) != len(want) {
		t.Errorf("UserPermissions has %d methods, the documented table %d", len(UserPermissions), len(want))
	}
}

func TestSubjectAccessReviewCarriesTheReviewedUser(t *testing.T) {
	a := newAPIServer(t)
	g := NewSubjectAccessReviewGuard(a.client, testNamespace)
	ctx, err := g.Admit(withToken(testToken), ebv1.BackupService_DownloadBackup_FullMethodName)
	if err != nil {
		t.Fatalf("Admit: %v", err)
	}
	if len(a.reviews) != 1 || a.reviews[0].Spec.Token != testToken || len(a.reviews[0].Spec.Audiences) != 0 {
		t.Fatalf("TokenReviews = %+v, want one of the call's token for the API server's audience", a.reviews)
	}
	spec := a.sars[0].Spec
	if spec.User != "alice@example.com" || spec.UID != "uid-1234" ||
		strings.Join(spec.Groups, ",") != "team-etcd,system:authenticated" ||
		strings.Join(spec.Extra["scopes"], ",") != "a,b" {
		t.Errorf("SubjectAccessReview subject = user %q uid %q groups %v extra %v, want the reviewed user's", spec.User, spec.UID, spec.Groups, spec.Extra)
	}
	want := authzv1.ResourceAttributes{Namespace: testNamespace, Group: "etcdbackup.io", Resource: "backups", Verb: "download"}
	if *spec.ResourceAttributes != want {
		t.Errorf("ResourceAttributes = %+v, want %+v", *spec.ResourceAttributes, want)
	}
	user, ok := UserFrom(ctx)
	if !ok || user.Username != "alice@example.com" {
		t.Errorf("UserFrom(admitted ctx) = %q, %v; want alice@example.com", user.Username, ok)
	}
	if _, ok := UserFrom(context.Background()); ok {
		t.Error("UserFrom(plain ctx) reports a user")
	}
}

func TestRefusalNamesVerbResourceAndCanI(t *testing.T) {
	a := newAPIServer(t)
	a.allow = func(ra authzv1.ResourceAttributes) (bool, string) {
		return ra.Verb == "get" || ra.Verb == "list", `RBAC: no RoleBinding grants "delete"`
	}
	g := NewSubjectAccessReviewGuard(a.client, testNamespace)
	if _, err := g.Admit(withToken(testToken), ebv1.BackupService_ListBackups_FullMethodName); err != nil {
		t.Fatalf("list: %v", err)
	}
	for _, tc := range []struct {
		method string
		want   []string
	}{
		{ebv1.BackupService_DeleteBackup_FullMethodName, []string{
			`"alice@example.com"`, "may not delete backups.etcdbackup.io", `namespace "etcdbackup-system"`,
			`RBAC: no RoleBinding grants "delete"`,
			"kubectl auth can-i delete backups.etcdbackup.io -n etcdbackup-system", "etcdbackup-admin",
		}},
		{ebv1.BackupService_RestoreBackup_FullMethodName, []string{
			"may not create restores.etcdbackup.io", "kubectl auth can-i create restores.etcdbackup.io -n etcdbackup-system",
		}},
		{ebv1.BackupService_CreateBackup_FullMethodName, []string{
			"kubectl auth can-i create backups.etcdbackup.io -n etcdbackup-system", "etcdbackup-operator",
		}},
		{ebv1.BackupService_CheckLocation_FullMethodName, []string{
			"may not check locations.etcdbackup.io", "kubectl auth can-i check locations.etcdbackup.io -n etcdbackup-system", "etcdbackup-operator",
		}},
	} {
		_, err := g.Admit(withToken(testToken), tc.method)
		if status.Code(err) != codes.PermissionDenied {
			t.Errorf("%s: %v, want PermissionDenied", tc.method, err)
			continue
		}
		msg := status.Convert(err).Message()
		for _, w := range tc.want {
			if !strings.Contains(msg, w) {
				t.Errorf("%s: refusal %q does not say %q", tc.method, msg, w)
			}
		}
		if strings.Contains(msg, testToken) {
			t.Errorf("%s: refusal contains the token", tc.method)
		}
	}
}

func TestUnknownMethodIsRefused(t *testing.T) {
	a := newAPIServer(t)
	g := NewSubjectAccessReviewGuard(a.client, testNamespace)
	_, err := g.Admit(withToken(testToken), "/etcdbackup.v1.BackupService/DropEverything")
	if status.Code(err) != codes.PermissionDenied {
		t.Fatalf("unknown method: %v, want PermissionDenied", err)
	}
	if len(a.sars) != 0 {
		t.Errorf("an unknown method was sent to a SubjectAccessReview: %+v", a.sars)
	}
}

func TestMissingTokenTellsHowToUseOne(t *testing.T) {
	a := newAPIServer(t)
	g := NewSubjectAccessReviewGuard(a.client, testNamespace)
	_, err := g.Admit(context.Background(), ebv1.BackupService_ListBackups_FullMethodName)
	if status.Code(err) != codes.Unauthenticated {
		t.Fatalf("no token: %v, want Unauthenticated", err)
	}
	msg := status.Convert(err).Message()
	for _, w := range []string{"client certificate", "--token=$(kubectl create token NAME -n etcdbackup-system)", "exec plugin", "OIDC"} {
		if !strings.Contains(msg, w) {
			t.Errorf("message %q does not say %q", msg, w)
		}
	}
	if len(a.reviews) != 0 {
		t.Error("a call without a token reached TokenReview")
	}
}

func TestUnacceptedTokenIsUnauthenticated(t *testing.T) {
	a := newAPIServer(t)
	g := NewSubjectAccessReviewGuard(a.client, testNamespace)
	const wrong = "not-a-token-of-this-cluster"
	_, err := g.Admit(withToken(wrong), ebv1.BackupService_ListBackups_FullMethodName)
	if status.Code(err) != codes.Unauthenticated {
		t.Fatalf("wrong token: %v, want Unauthenticated", err)
	}
	if strings.Contains(err.Error(), wrong) {
		t.Errorf("error %q contains the token", err)
	}
	if len(a.sars) != 0 {
		t.Error("an unauthenticated call reached SubjectAccessReview")
	}
}

func TestSubjectAccessReviewFailureIsUnavailable(t *testing.T) {
	a := newAPIServer(t)
	a.sarErr = errors.New("connection refused")
	g := NewSubjectAccessReviewGuard(a.client, testNamespace)
	_, err := g.Admit(withToken(testToken), ebv1.BackupService_ListBackups_FullMethodName)
	if status.Code(err) != codes.Unavailable {
		t.Fatalf("SAR API failure: %v, want Unavailable", err)
	}
	if strings.Contains(err.Error(), testToken) {
		t.Errorf("error %q contains the token", err)
	}
}

// The shipped ClusterRoles grant what refusals say they grant: each
// permission by the role roleGranting names and every role above it, and
// not by the roles below it.
func TestShippedRolesGrantTheDocumentedVerbs(t *testing.T) {
	data, err := os.ReadFile("../../manifests/roles.yaml")
	if err != nil {
		t.Fatal(err)
	}
	grants := map[string]map[Permission]bool{}
	for _, doc := range strings.Split(string(data), "\n---\n") {
		var role rbacv1.ClusterRole
		if err := yaml.UnmarshalStrict([]byte(doc), &role); err != nil {
			var binding rbacv1.ClusterRoleBinding
			if yaml.UnmarshalStrict([]byte(doc), &binding) == nil && binding.Kind == "ClusterRoleBinding" {
				continue
			}
			t.Fatalf("manifests/roles.yaml: %v", err)
		}
		if role.Kind != "ClusterRole" {
			continue
		}
		grants[role.Name] = map[Permission]bool{}
		for _, r := range role.Rules {
			for _, g := range r.APIGroups {
				for _, res := range r.Resources {
					for _, v := range r.Verbs {
						// Core and etcdbackup.io resources have distinct names.
						if g == APIGroup || g == "" {
							grants[role.Name][Permission{res, v}] = true
						}
					}
				}
			}
		}
	}
	order := []string{"etcdbackup-viewer", "etcdbackup-operator", "etcdbackup-admin"}
	for _, name := range order {
		if grants[name] == nil {
			t.Fatalf("manifests/roles.yaml has no ClusterRole %s", name)
		}
		for _, p := range []Permission{{"services", "get"}, {"pods", "list"}, {"pods/portforward", "create"}} {
			if !grants[name][p] {
				t.Errorf("%s cannot %s, which the plugin needs to reach the server", name, p)
			}
		}
	}
	for method, p := range UserPermissions {
		want := roleGranting(p)
		granted := false
		for _, name := range order {
			granted = granted || name == want
			if grants[name][p] != granted {
				t.Errorf("%s (%s): %s grants it: %v, want %v (refusals name %s)", method, p, name, grants[name][p], granted, want)
			}
		}
	}
}

// Tokens no authenticator would accept are refused before a TokenReview;
// anything else, JWT or not, is the API server's to judge.
func TestUserTokenCheapChecks(t *testing.T) {
	a := newAPIServer(t)
	g := NewSubjectAccessReviewGuard(a.client, testNamespace)
	enc := base64.RawURLEncoding.EncodeToString
	jwt := func(exp int64) string {
		return enc([]byte(`{"alg":"RS256"}`)) + "." + enc([]byte(fmt.Sprintf(`{"sub":"alice","exp":%d}`, exp))) + "." + enc([]byte("sig"))
	}
	for _, tc := range []struct{ name, token, want string }{
		{"too long", strings.Repeat("a", MaxUserTokenBytes+1), "longer than 16 KiB"},
		{"control character", "abc\x01def", "not printable ASCII"},
		{"not ASCII", "abcé", "not printable ASCII"},
		{"expired JWT", jwt(time.Now().Add(-time.Minute).Unix()), "expired at"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := g.Admit(withToken(tc.token), ebv1.BackupService_ListBackups_FullMethodName)
			if status.Code(err) != codes.Unauthenticated || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Admit: %v; want Unauthenticated saying %q", err, tc.want)
			}
			if strings.Contains(err.Error(), tc.token) {
				t.Fatalf("the refusal shows the token: %v", err)
			}
		})
	}
	if len(a.reviews) != 0 {
		t.Fatalf("%d TokenReviews; want none", len(a.reviews))
	}
	for _, tok := range []string{"abcdef.0123456789abcdef", "k8s-aws-v1.aHR0cHM6Ly9zdHM", jwt(time.Now().Add(time.Hour).Unix()), "a.b.c"} {
		if _, err := g.Admit(withToken(tok), ebv1.BackupService_ListBackups_FullMethodName); status.Code(err) != codes.Unauthenticated {
			t.Fatalf("token %q: %v; want the review's Unauthenticated", tok, err)
		}
	}
	if len(a.reviews) != 4 {
		t.Fatalf("%d TokenReviews; want 4, one per token the shape check cannot refuse", len(a.reviews))
	}
}

// TokenReview answers (acceptances and refusals) and SubjectAccessReview
// decisions (allowed and denied, per verb) are reused for CacheTTL.
func TestUserReviewsAreCached(t *testing.T) {
	a := newAPIServer(t)
	a.allow = func(ra authzv1.ResourceAttributes) (bool, string) { return ra.Verb == "list", "" }
	now := time.Now()
	g := &SubjectAccessReviewGuard{Client: a.client, Namespace: testNamespace, Reviews: UserReviews{Now: func() time.Time { return now }}}
	call := func(token, method string, want codes.Code) {
		t.Helper()
		if _, err := g.Admit(withToken(token), method); status.Code(err) != want {
			t.Fatalf("Admit(%s): %v; want %s", method, err, want)
		}
	}
	counts := func(reviews, sars int) {
		t.Helper()
		if len(a.reviews) != reviews || len(a.sars) != sars {
			t.Fatalf("%d TokenReviews, %d SubjectAccessReviews; want %d, %d", len(a.reviews), len(a.sars), reviews, sars)
		}
	}
	list, del := ebv1.BackupService_ListBackups_FullMethodName, ebv1.BackupService_DeleteBackup_FullMethodName
	for range 3 {
		call(testToken, list, codes.OK)
		call(testToken, del, codes.PermissionDenied)
		call("wrong", list, codes.Unauthenticated)
	}
	counts(2, 2)
	// GetBackup and GetServerInfo take the same permission.
	call(testToken, ebv1.BackupService_GetBackup_FullMethodName, codes.PermissionDenied)
	call(testToken, ebv1.InfoService_GetServerInfo_FullMethodName, codes.PermissionDenied)
	counts(2, 3)
	now = now.Add(DefaultUserReviewCacheTTL)
	call(testToken, list, codes.OK)
	call("wrong", list, codes.Unauthenticated)
	counts(4, 4)
}

// Each review is bounded: an API server that does not answer makes the
// call fail Unavailable after UserReviews.Timeout, not hang.
func TestUserReviewTimesOut(t *testing.T) {
	gate := make(chan struct{})
	api := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		select {
		case <-gate:
		case <-req.Context().Done():
		}
	}))
	defer api.Close()
	defer close(gate)
	cs, err := kubernetes.NewForConfig(&rest.Config{Host: api.URL, QPS: -1})
	if err != nil {
		t.Fatal(err)
	}
	g := &SubjectAccessReviewGuard{Client: cs, Namespace: testNamespace, Reviews: UserReviews{Timeout: 100 * time.Millisecond}}
	start := time.Now()
	_, err = g.Admit(withToken(testToken), ebv1.BackupService_ListBackups_FullMethodName)
	if status.Code(err) != codes.Unavailable || !strings.Contains(err.Error(), "TokenReview failed") {
		t.Fatalf("Admit: %v; want Unavailable, the TokenReview failed", err)
	}
	if took := time.Since(start); took > 5*time.Second {
		t.Fatalf("the call took %v; want about the 100ms timeout", took)
	}
	if strings.Contains(err.Error(), testToken) {
		t.Fatalf("the refusal shows the token: %v", err)
	}
}

// Over the cap on new tokens' reviews, a call is refused at once with
// Unavailable (the plugin retries it) and a message a person can act on.
func TestUserReviewsOverTheCap(t *testing.T) {
	var started atomic.Int64
	gate, arrived := make(chan struct{}), make(chan struct{}, 2)
	api := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		started.Add(1)
		arrived <- struct{}{}
		select {
		case <-gate:
		case <-req.Context().Done():
		}
	}))
	defer api.Close()
	cs, err := kubernetes.NewForConfig(&rest.Config{Host: api.URL, QPS: -1})
	if err != nil {
		t.Fatal(err)
	}
	g := &SubjectAccessReviewGuard{Client: cs, Namespace: testNamespace, Reviews: UserReviews{MaxConcurrent: 2, QueueWait: 20 * time.Millisecond}}
	var wg sync.WaitGroup
	defer func() { close(gate); wg.Wait() }()
	for i := range 2 {
		wg.Go(func() {
			_, _ = g.Admit(withToken(fmt.Sprintf("held-%d", i)), ebv1.BackupService_ListBackups_FullMethodName)
		})
	}
	for range 2 {
		select {
		case <-arrived:
		case <-time.After(10 * time.Second):
			t.Fatal("the first two reviews did not reach the API server")
		}
	}
	_, err = g.Admit(withToken("one-more"), ebv1.BackupService_ListBackups_FullMethodName)
	if status.Code(err) != codes.Unavailable {
		t.Fatalf("a review over the cap: %v; want Unavailable", err)
	}
	for _, want := range []string{"at most 2 at once", "try again in a few seconds", "port-forward"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("refusal %q does not say %q", err, want)
		}
	}
	if strings.Contains(err.Error(), "one-more") {
		t.Errorf("the refusal shows the token: %v", err)
	}
	if n := started.Load(); n != 2 {
		t.Fatalf("%d reviews started; want the cap, 2", n)
	}
}
