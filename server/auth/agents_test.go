package auth_test

import (
	"bytes"
	"context"
	"crypto/sha256"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	authnv1 "k8s.io/api/authentication/v1"
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

const (
	serverNS = "etcdbackup-system"
	appNS    = "app"
	sum      = "6794a8ff9654e821ba067dda207cf98ec8f022ce1c001fd07cd542530cd173f5"
)

// token is what the fake API server knows about one bearer token.
type token struct {
	audience string
	user     authnv1.UserInfo
}

// cluster is a fake API server with real agent Jobs (made by
// jobs.Launcher), their pods, and the tokens TokenReview accepts.
type cluster struct {
	cs       *fake.Clientset
	launcher *jobs.Launcher
	tokens   map[string]token
	guard    *auth.AgentGuard
}

func newCluster(t *testing.T) *cluster {
	t.Helper()
	c := &cluster{cs: fake.NewClientset(), tokens: map[string]token{}}
	c.cs.PrependReactor("create", "tokenreviews", func(a k8stesting.Action) (bool, runtime.Object, error) {
		review := a.(k8stesting.CreateAction).GetObject().(*authnv1.TokenReview).DeepCopy()
		tok, ok := c.tokens[review.Spec.Token]
		if ok && slices.Contains(review.Spec.Audiences, tok.audience) {
			review.Status = authnv1.TokenReviewStatus{Authenticated: true, User: tok.user, Audiences: []string{tok.audience}}
		} else {
			review.Status = authnv1.TokenReviewStatus{Error: "token not valid for the audiences asked"}
		}
		return true, review, nil
	})
	var err error
	if c.launcher, err = jobs.New(c.cs, serverNS, config.Agents{Image: "agent:dev"}); err != nil {
		t.Fatal(err)
	}
	if c.guard, err = auth.NewAgentGuard(auth.AgentGuardConfig{
		Client: c.cs, Namespace: serverNS, RestoreNamespaces: []string{appNS}, ServiceAccount: config.DefaultServiceAccount,
	}); err != nil {
		t.Fatal(err)
	}
	return c
}

var target = config.Target{
	Name: "app", Endpoints: []string{"http://etcd:2379"}, InsecurePlaintext: true, Namespace: appNS,
	Members: []config.Member{{Name: "m0", PeerURL: "http://m0:2380", DataDir: "data",
		Volume: config.MemberVolume{PersistentVolumeClaim: &config.ClaimRef{ClaimName: "data-m0"}}}},
}

// backupJob starts a real backup Job of b1 and gives it a UID, as the API
// server would.
func (c *cluster) backupJob(t *testing.T) *batchv1.Job {
	t.Helper()
	j, err := c.launcher.StartBackup(context.Background(), jobs.BackupSpec{Name: "b1", Location: "default", Target: target})
	if err != nil {
		t.Fatal(err)
	}
	return c.withUID(t, j)
}

func (c *cluster) restoreJob(t *testing.T) *batchv1.Job {
	t.Helper()
	js, err := c.launcher.StartRestore(context.Background(), jobs.RestoreSpec{Name: "b1", Location: "default", Target: target, SHA256: sum})
	if err != nil {
		t.Fatal(err)
	}
	return c.withUID(t, js[0])
}

func (c *cluster) withUID(t *testing.T, j *batchv1.Job) *batchv1.Job {
	t.Helper()
	j.UID = types.UID("uid-of-job-" + j.Name)
	j, err := c.cs.BatchV1().Jobs(j.Namespace).Update(context.Background(), j, metav1.UpdateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return j
}

// pod creates a pod from j's template; owned says whether j controls it
// (a copy of the template made by hand is not owned).
func (c *cluster) pod(t *testing.T, j *batchv1.Job, name string, owned bool) *corev1.Pod {
	t.Helper()
	p := &corev1.Pod{ObjectMeta: *j.Spec.Template.ObjectMeta.DeepCopy(), Spec: *j.Spec.Template.Spec.DeepCopy()}
	p.Name, p.Namespace, p.UID = name, j.Namespace, types.UID("uid-of-pod-"+name)
	if owned {
		p.OwnerReferences = []metav1.OwnerReference{*metav1.NewControllerRef(j, batchv1.SchemeGroupVersion.WithKind("Job"))}
	}
	p, err := c.cs.CoreV1().Pods(p.Namespace).Create(context.Background(), p, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// tokenFor registers a projected token of p (audience etcdbackup) and
// returns it.
func (c *cluster) tokenFor(p *corev1.Pod) string {
	tok := "tok-" + p.Name + "-secret"
	c.tokens[tok] = token{audience: "etcdbackup", user: authnv1.UserInfo{
		Username: "system:serviceaccount:" + p.Namespace + ":" + p.Spec.ServiceAccountName,
		Extra: map[string]authnv1.ExtraValue{
			auth.ExtraPodName: {p.Name},
			auth.ExtraPodUID:  {string(p.UID)},
		},
	}}
	return tok
}

func withToken(tok string) context.Context {
	ctx := context.Background()
	if tok == "" {
		return ctx
	}
	return metadata.NewIncomingContext(ctx, metadata.Pairs("authorization", "Bearer "+tok))
}

// refused checks that Admit refuses with code and a message saying want,
// without the token in it.
func refused(t *testing.T, g auth.Guard, tok, method string, code codes.Code, want string) {
	t.Helper()
	_, err := g.Admit(withToken(tok), method)
	if status.Code(err) != code || !strings.Contains(status.Convert(err).Message(), want) {
		t.Fatalf("Admit(%s): %v; want %s saying %q", method, err, code, want)
	}
	if tok != "" && strings.Contains(err.Error(), tok) {
		t.Fatalf("the refusal shows the token: %v", err)
	}
}

func TestAgentGuardAdmitsItsJobsPods(t *testing.T) {
	c := newCluster(t)
	bj := c.backupJob(t)
	btok := c.tokenFor(c.pod(t, bj, "backup-pod", true))
	ctx, err := c.guard.Admit(withToken(btok), auth.MethodUploadBackup)
	if err != nil {
		t.Fatal(err)
	}
	a, ok := auth.AgentFrom(ctx)
	want := auth.Agent{Kind: "backup", JobNamespace: serverNS, JobName: bj.Name, Backup: "b1", Location: "default", Target: "app"}
	if !ok || *a != want {
		t.Fatalf("agent %+v, want %+v", a, want)
	}
	if _, err := c.guard.Admit(withToken(btok), auth.MethodGetServerInfo); err != nil {
		t.Errorf("GetServerInfo: %v", err)
	}

	rj := c.restoreJob(t)
	rtok := c.tokenFor(c.pod(t, rj, "restore-pod", true))
	ctx, err = c.guard.Admit(withToken(rtok), auth.MethodDownloadBackup)
	if err != nil {
		t.Fatal(err)
	}
	a, _ = auth.AgentFrom(ctx)
	want = auth.Agent{Kind: "restore", JobNamespace: appNS, JobName: rj.Name, Backup: "b1", Location: "default", Target: "app", SHA256: sum}
	if *a != want {
		t.Fatalf("agent %+v, want %+v", a, want)
	}

	// Each kind only its own verb.
	refused(t, c.guard, btok, auth.MethodDownloadBackup, codes.PermissionDenied, "only restore and drill agents may download")
	refused(t, c.guard, rtok, auth.MethodUploadBackup, codes.PermissionDenied, "only backup agents may upload")

	// A drill Job downloads its pinned backup, from the server's
	// namespace, and uploads nothing.
	dj, err := c.launcher.StartDrill(context.Background(), jobs.DrillSpec{Backup: "b1", Location: "default", Target: "app", SHA256: sum})
	if err != nil {
		t.Fatal(err)
	}
	dj = c.withUID(t, dj)
	dtok := c.tokenFor(c.pod(t, dj, "drill-pod", true))
	ctx, err = c.guard.Admit(withToken(dtok), auth.MethodDownloadBackup)
	if err != nil {
		t.Fatal(err)
	}
	a, _ = auth.AgentFrom(ctx)
	want = auth.Agent{Kind: "drill", JobNamespace: serverNS, JobName: dj.Name, Backup: "b1", Location: "default", Target: "app", SHA256: sum}
	if *a != want {
		t.Fatalf("agent %+v, want %+v", a, want)
	}
	refused(t, c.guard, dtok, auth.MethodUploadBackup, codes.PermissionDenied, "only backup agents may upload")
}

func TestAgentGuardRefuses(t *testing.T) {
	c := newCluster(t)
	bj := c.backupJob(t)
	pod := c.pod(t, bj, "backup-pod", true)
	good := c.tokenFor(pod)

	t.Run("no token", func(t *testing.T) {
		refused(t, c.guard, "", auth.MethodUploadBackup, codes.Unauthenticated, "no bearer token")
	})
	t.Run("token for another audience", func(t *testing.T) {
		c.tokens["api-server-token"] = token{audience: "https://kubernetes.default.svc", user: c.tokens[good].user}
		refused(t, c.guard, "api-server-token", auth.MethodUploadBackup, codes.Unauthenticated, "did not accept the bearer token")
	})
	t.Run("unknown token", func(t *testing.T) {
		refused(t, c.guard, "forged", auth.MethodUploadBackup, codes.Unauthenticated, "did not accept the bearer token")
	})
	t.Run("another ServiceAccount", func(t *testing.T) {
		other := c.tokens[good]
		other.user.Username = "system:serviceaccount:" + serverNS + ":default"
		c.tokens["default-sa"] = other
		refused(t, c.guard, "default-sa", auth.MethodUploadBackup, codes.PermissionDenied, "is not the agents'")
	})
	t.Run("agent ServiceAccount in a foreign namespace", func(t *testing.T) {
		other := c.tokens[good]
		other.user.Username = "system:serviceaccount:elsewhere:" + config.DefaultServiceAccount
		c.tokens["tok-foreign-ns"] = other
		refused(t, c.guard, "tok-foreign-ns", auth.MethodUploadBackup, codes.PermissionDenied, "elsewhere/"+config.DefaultServiceAccount+" is not the agents'")
	})
	t.Run("token without pod claims", func(t *testing.T) {
		unbound := c.tokens[good]
		unbound.user.Extra = nil
		c.tokens["unbound"] = unbound
		refused(t, c.guard, "unbound", auth.MethodUploadBackup, codes.PermissionDenied, "not a pod-bound token")
	})
	t.Run("pod uid mismatch", func(t *testing.T) {
		stale := c.tokens[good]
		stale.user.Extra = map[string]authnv1.ExtraValue{auth.ExtraPodName: {pod.Name}, auth.ExtraPodUID: {"uid-of-an-earlier-pod"}}
		c.tokens["stale"] = stale
		refused(t, c.guard, "stale", auth.MethodUploadBackup, codes.PermissionDenied, "uid-of-an-earlier-pod, which is gone")
	})
	t.Run("pod made from a copy of the agent's template", func(t *testing.T) {
		copyTok := c.tokenFor(c.pod(t, bj, "copied-pod", false))
		refused(t, c.guard, copyTok, auth.MethodUploadBackup, codes.PermissionDenied, "not controlled by a Job")
	})
	t.Run("Job not managed by the server", func(t *testing.T) {
		own := bj.DeepCopy()
		own.Name, own.UID, own.ResourceVersion = "my-own-job", "uid-of-my-own-job", ""
		delete(own.Labels, jobs.LabelManagedBy)
		own, err := c.cs.BatchV1().Jobs(serverNS).Create(context.Background(), own, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		tok := c.tokenFor(c.pod(t, own, "my-own-pod", true))
		refused(t, c.guard, tok, auth.MethodUploadBackup, codes.PermissionDenied, "not managed by the server")
	})
	t.Run("method not served on the agent port", func(t *testing.T) {
		for _, m := range []string{
			ebv1.BackupService_ListBackups_FullMethodName, ebv1.BackupService_DeleteBackup_FullMethodName,
			ebv1.BackupService_CreateBackup_FullMethodName, ebv1.BackupService_RestoreBackup_FullMethodName,
		} {
			refused(t, c.guard, good, m, codes.PermissionDenied, "users reach the server through `kubectl etcdbackup` (port-forward)")
		}
	})
	t.Run("finished Job", func(t *testing.T) {
		done := bj.DeepCopy()
		done.Status.Conditions = []batchv1.JobCondition{{Type: batchv1.JobComplete, Status: corev1.ConditionTrue}}
		if _, err := c.cs.BatchV1().Jobs(serverNS).UpdateStatus(context.Background(), done, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
		refused(t, c.guard, good, auth.MethodUploadBackup, codes.PermissionDenied, "has finished")
	})
	t.Run("deleted pod", func(t *testing.T) {
		if err := c.cs.CoreV1().Pods(serverNS).Delete(context.Background(), pod.Name, metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
		refused(t, c.guard, good, auth.MethodGetServerInfo, codes.PermissionDenied, "does not exist")
	})
}

// Over gRPC: the agent's token file reaches the real guard on the agent
// listener, and the handler holds the admitted agent to its own backup.
func TestAgentListenerWithTokenFile(t *testing.T) {
	c := newCluster(t)
	bj := c.backupJob(t)
	tok := c.tokenFor(c.pod(t, bj, "backup-pod", true))
	file := filepath.Join(t.TempDir(), "token")
	if err := os.WriteFile(file, []byte(tok+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	srv := servertest.StartWith(t, servertest.Options{AgentGuard: c.guard, AgentDialOptions: []grpc.DialOption{client.WithTokenFile(file)}})
	ctx := context.Background()

	// What etcd sends: whole 512-byte pages and their SHA-256, which the
	// server checks on an agent's upload.
	db := bytes.Repeat([]byte{7}, 512)
	sum := sha256.Sum256(db)
	snap := append(db, sum[:]...)
	up := func(name string) error {
		_, err := srv.AgentClient.Upload(ctx, bytes.NewReader(snap), &ebv1.UploadHeader{
			Name: name, Source: &ebv1.BackupSource{Kind: "agent", Target: "claimed-by-the-client", Description: "trust me"},
		}, nil)
		return err
	}
	if err := up("b2"); status.Code(err) != codes.PermissionDenied || !strings.Contains(err.Error(), `only backup "b1" in location "default", not "b2"`) {
		t.Fatalf("backup agent of b1 uploading b2: %v; want PermissionDenied naming both", err)
	}
	if err := up("b1"); err != nil {
		t.Fatal(err)
	}
	got, err := srv.Client.Backups.GetBackup(ctx, &ebv1.GetBackupRequest{Name: "b1"})
	if err != nil {
		t.Fatal(err)
	}
	if s := got.GetBackup().GetSource(); s.GetKind() != "agent" || s.GetTarget() != "app" || s.GetDescription() != "job "+serverNS+"/"+bj.Name {
		t.Fatalf("source %v: want what the server knows of the Job, not what the client said", s)
	}
	if _, err := srv.AgentClient.Backups.ListBackups(ctx, &ebv1.ListBackupsRequest{}); status.Code(err) != codes.PermissionDenied {
		t.Fatalf("ListBackups on the agent port: %v", err)
	}

	// The kubelet rotates the token: the next call reads the new file.
	if err := os.WriteFile(file, []byte("rotated-but-unknown"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := srv.AgentClient.Info.GetServerInfo(ctx, &ebv1.GetServerInfoRequest{}); status.Code(err) != codes.Unauthenticated {
		t.Fatalf("GetServerInfo with a token the API server rejects: %v", err)
	}
}
