package plugin

import (
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	authnv1 "k8s.io/api/authentication/v1"
	authzv1 "k8s.io/api/authorization/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/client-go/rest"
	k8stesting "k8s.io/client-go/testing"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"

	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/server/auth"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/server/servertest"
)

// tokenServer is a gRPC server that records, per call, the bearer token
// the server side reads (auth.BearerToken), or "" when the call has no
// authorization header.
type tokenServer struct {
	addr string
	mu   sync.Mutex
	seen []string
}

func startTokenServer(t *testing.T) *tokenServer {
	t.Helper()
	ts := &tokenServer{}
	srv := grpc.NewServer(grpc.UnaryInterceptor(func(ctx context.Context, req any, info *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
		token := ""
		if md, _ := metadata.FromIncomingContext(ctx); len(md.Get(auth.AuthorizationHeader)) > 0 {
			var err error
			if token, err = auth.BearerToken(ctx); err != nil {
				return nil, err
			}
		}
		ts.mu.Lock()
		ts.seen = append(ts.seen, token)
		ts.mu.Unlock()
		return h(ctx, req)
	}))
	healthpb.RegisterHealthServer(srv, health.NewServer())
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = srv.Serve(lis) }()
	t.Cleanup(srv.Stop)
	ts.addr = lis.Addr().String()
	return ts
}

// callsWith makes n calls to ts with the kubeconfig credentials of cfg and
// returns the tokens the server saw.
func (ts *tokenServer) callsWith(t *testing.T, cfg *rest.Config, n int) []string {
	t.Helper()
	creds, err := newKubeconfigToken(cfg)
	if err != nil {
		t.Fatal(err)
	}
	conn, err := grpc.NewClient("passthrough:///"+ts.addr,
		grpc.WithTransportCredentials(insecure.NewCredentials()), grpc.WithPerRPCCredentials(creds))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	for range n {
		if _, err := healthpb.NewHealthClient(conn).Check(context.Background(), &healthpb.HealthCheckRequest{}); err != nil {
			t.Fatalf("call: %v", err)
		}
	}
	ts.mu.Lock()
	defer ts.mu.Unlock()
	return append([]string(nil), ts.seen...)
}

func TestCallsCarryTheKubeconfigUsersToken(t *testing.T) {
	t.Run("token", func(t *testing.T) {
		ts := startTokenServer(t)
		got := ts.callsWith(t, &rest.Config{Host: "https://api.example:6443", BearerToken: "static-token-1"}, 1)
		if len(got) != 1 || got[0] != "static-token-1" {
			t.Errorf("server saw %q, want [static-token-1]", got)
		}
	})
	t.Run("token file", func(t *testing.T) {
		ts := startTokenServer(t)
		file := filepath.Join(t.TempDir(), "token")
		if err := os.WriteFile(file, []byte("file-token-2\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		got := ts.callsWith(t, &rest.Config{Host: "https://api.example:6443", BearerTokenFile: file}, 1)
		if len(got) != 1 || got[0] != "file-token-2" {
			t.Errorf("server saw %q, want [file-token-2]", got)
		}
	})
	t.Run("exec plugin", func(t *testing.T) {
		ts := startTokenServer(t)
		// The credential expired long ago, so client-go runs the plugin
		// again for each call: every call gets the plugin's current token,
		// as it would after a refresh.
		dir := t.TempDir()
		script := filepath.Join(dir, "credential-plugin")
		counter := filepath.Join(dir, "count")
		if err := os.WriteFile(script, fmt.Appendf(nil, `#!/bin/sh
n=$(cat %[1]q 2>/dev/null || echo 0)
n=$((n+1))
echo $n > %[1]q
cat <<EOF
{"apiVersion":"client.authentication.k8s.io/v1","kind":"ExecCredential","status":{"token":"exec-token-$n","expirationTimestamp":"2001-01-01T00:00:00Z"}}
EOF
`, counter), 0o700); err != nil {
			t.Fatal(err)
		}
		got := ts.callsWith(t, &rest.Config{Host: "https://api.example:6443", ExecProvider: &clientcmdapi.ExecConfig{
			Command: script, APIVersion: "client.authentication.k8s.io/v1", InteractiveMode: clientcmdapi.NeverExecInteractiveMode,
		}}, 2)
		if strings.Join(got, ",") != "exec-token-1,exec-token-2" {
			t.Errorf("server saw %q, want [exec-token-1 exec-token-2]", got)
		}
	})
	t.Run("client certificate", func(t *testing.T) {
		ts := startTokenServer(t)
		got := ts.callsWith(t, &rest.Config{Host: "https://api.example:6443", TLSClientConfig: rest.TLSClientConfig{
			CertFile: "/nonexistent/client.crt", KeyFile: "/nonexistent/client.key",
		}}, 1)
		if len(got) != 1 || got[0] != "" {
			t.Errorf("server saw %q, want one call without a token", got)
		}
	})
}

func TestFailingExecPluginFailsTheCall(t *testing.T) {
	ts := startTokenServer(t)
	script := filepath.Join(t.TempDir(), "credential-plugin")
	if err := os.WriteFile(script, []byte("#!/bin/sh\necho 'login expired, run sso-login' >&2\nexit 1\n"), 0o700); err != nil {
		t.Fatal(err)
	}
	creds, err := newKubeconfigToken(&rest.Config{Host: "https://api.example:6443", ExecProvider: &clientcmdapi.ExecConfig{
		Command: script, APIVersion: "client.authentication.k8s.io/v1", InteractiveMode: clientcmdapi.NeverExecInteractiveMode,
	}})
	if err != nil {
		t.Fatal(err)
	}
	conn, err := grpc.NewClient("passthrough:///"+ts.addr,
		grpc.WithTransportCredentials(insecure.NewCredentials()), grpc.WithPerRPCCredentials(creds))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	_, err = healthpb.NewHealthClient(conn).Check(context.Background(), &healthpb.HealthCheckRequest{})
	if status.Code(err) != codes.Unauthenticated || !strings.Contains(err.Error(), "kubeconfig user's credentials") {
		t.Errorf("call with a failing exec plugin: %v, want Unauthenticated naming the kubeconfig credentials", err)
	}
}

// strictServer runs the real data server in SubjectAccessReview mode
// against a fake API server that knows one token, allowed to list and get
// backups only.
func strictServer(t *testing.T) string {
	t.Helper()
	client := fake.NewClientset()
	client.PrependReactor("create", "tokenreviews", func(action k8stesting.Action) (bool, runtime.Object, error) {
		tr := action.(k8stesting.CreateAction).GetObject().(*authnv1.TokenReview).DeepCopy()
		tr.Status.Authenticated = tr.Spec.Token == "viewer-token"
		tr.Status.User = authnv1.UserInfo{Username: "system:serviceaccount:team:viewer"}
		return true, tr, nil
	})
	client.PrependReactor("create", "subjectaccessreviews", func(action k8stesting.Action) (bool, runtime.Object, error) {
		sar := action.(k8stesting.CreateAction).GetObject().(*authzv1.SubjectAccessReview).DeepCopy()
		v := sar.Spec.ResourceAttributes.Verb
		sar.Status.Allowed = sar.Spec.ResourceAttributes.Resource == "backups" && (v == "list" || v == "get")
		return true, sar, nil
	})
	srv := servertest.StartWith(t, servertest.Options{UserGuard: auth.NewSubjectAccessReviewGuard(client, "etcdbackup-system")})
	return "--server-address=" + srv.Addr
}

func TestDirectConnectionSendsOnlyAnExplicitToken(t *testing.T) {
	addr := strictServer(t)
	mustRun(t, addr, "--token=viewer-token", "list")

	// A kubeconfig's token never goes to a --server-address: only --token.
	kubeconfig := filepath.Join(t.TempDir(), "kubeconfig")
	if err := os.WriteFile(kubeconfig, []byte(`apiVersion: v1
kind: Config
clusters: [{name: c, cluster: {server: "https://api.example:6443"}}]
users: [{name: u, user: {token: viewer-token}}]
contexts: [{name: c, context: {cluster: c, user: u}}]
current-context: c
`), 0o600); err != nil {
		t.Fatal(err)
	}
	r := mustFail(t, "carries no bearer token", addr, "--kubeconfig="+kubeconfig, "list")
	if code := ExitCode(r.err); code != ExitRefused {
		t.Errorf("no token: exit code %d, want %d (refused)", code, ExitRefused)
	}
	if !strings.Contains(r.err.Error(), "kubectl etcdbackup --token=$(kubectl create token NAME -n etcdbackup-system)") {
		t.Errorf("no token: %q does not say how to use a token", r.err)
	}
}

func TestRefusalIsPrintedAsTheServerSaysIt(t *testing.T) {
	addr := strictServer(t)
	file, _, _ := writeSnapshot(t, "nightly.db", smallSnapshot)
	r := mustFail(t, `user "system:serviceaccount:team:viewer" may not upload backups.etcdbackup.io in namespace "etcdbackup-system"`,
		addr, "--token=viewer-token", "upload", file, "--name=nightly")
	if code := ExitCode(r.err); code != ExitRefused {
		t.Errorf("refused upload: exit code %d, want %d (refused)", code, ExitRefused)
	}
	if !strings.Contains(r.err.Error(), "kubectl auth can-i upload backups.etcdbackup.io -n etcdbackup-system") {
		t.Errorf("refusal %q does not name the can-i to run", r.err)
	}
	r = mustFail(t, "did not accept the bearer token", addr, "--token=someone-elses", "list")
	if code := ExitCode(r.err); code != ExitRefused {
		t.Errorf("unaccepted token: exit code %d, want %d (refused)", code, ExitRefused)
	}
	if strings.Contains(r.err.Error(), "someone-elses") {
		t.Errorf("error %q contains the token", r.err)
	}
}
