package auth_test

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/json"
	"maps"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

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

	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/api/agentjob"
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
	// otherNS is the restore namespace of another target.
	otherNS = "other"
	sum     = "6794a8ff9654e821ba067dda207cf98ec8f022ce1c001fd07cd542530cd173f5"
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

func newCluster(t testing.TB) *cluster {
	t.Helper()
	c := &cluster{cs: fake.NewClientset(), tokens: map[string]token{}}
	c.answerReviews(c.cs)
	// The API server gives every object a UID when it is created.
	c.cs.PrependReactor("create", "jobs", func(a k8stesting.Action) (bool, runtime.Object, error) {
		j := a.(k8stesting.CreateAction).GetObject().(*batchv1.Job)
		j.UID = types.UID("uid-of-job-" + j.Namespace + "-" + j.Name + "-" + strconv.Itoa(len(j.Annotations)))
		return false, nil, nil
	})
	var err error
	if c.launcher, err = jobs.New(c.cs, serverNS, config.Agents{Image: "agent:dev"}); err != nil {
		t.Fatal(err)
	}
	if err := c.launcher.LoadSigningKey(context.Background()); err != nil {
		t.Fatal(err)
	}
	c.guard = c.newGuard(t, c.launcher)
	return c
}

// newGuard is the agent guard of a server whose Launcher is l.
func (c *cluster) newGuard(t testing.TB, l *jobs.Launcher) *auth.AgentGuard {
	t.Helper()
	g, err := auth.NewAgentGuard(auth.AgentGuardConfig{
		Client: c.cs, Namespace: serverNS, RestoreNamespaces: []string{appNS, otherNS, config.DefaultRestoreNamespace}, ServiceAccount: config.DefaultServiceAccount,
		Signer: l.Signer(), TargetNamespaces: map[string]string{"app": appNS, "other": otherNS, "cp": l.RestoreNamespace(kitTarget)},
		// The tests edit Jobs and pods and look at the very next call,
		// each of which reads them.
		Lookups: auth.AgentLookups{CacheTTL: -1, QPS: 1000, Burst: 1000},
	})
	if err != nil {
		t.Fatal(err)
	}
	return g
}

// answerReviews makes cs answer TokenReviews from c's tokens.
func (c *cluster) answerReviews(cs *fake.Clientset) {
	cs.PrependReactor("create", "tokenreviews", func(a k8stesting.Action) (bool, runtime.Object, error) {
		review := a.(k8stesting.CreateAction).GetObject().(*authnv1.TokenReview).DeepCopy()
		tok, ok := c.tokens[nameOfJWT(review.Spec.Token)]
		if ok && slices.Contains(review.Spec.Audiences, tok.audience) {
			review.Status = authnv1.TokenReviewStatus{Authenticated: true, User: tok.user, Audiences: []string{tok.audience}}
		} else {
			review.Status = authnv1.TokenReviewStatus{Error: "token not valid for the audiences asked"}
		}
		return true, review, nil
	})
}

var target = config.Target{
	Name: "app", Endpoints: []string{"http://etcd:2379"}, InsecurePlaintext: true, Namespace: appNS,
	Members: []config.Member{{Name: "m0", PeerURL: "http://m0:2380", DataDir: "data",
		Volume: config.MemberVolume{PersistentVolumeClaim: &config.ClaimRef{ClaimName: "data-m0"}}}},
}

// kitTarget is a control plane's, with a recovery kit: its kit agents
// run in the agents' restore namespace, on its node.
var kitTarget = config.Target{
	Name: "cp", Endpoints: []string{"https://10.0.0.1:2379"},
	Kit: &config.Kit{NodeName: "cp-1", AgeRecipients: []string{"age1zvkyg2lqzraa2lnjvqej32nkuu0ues2s82hzrye869xeexvn73equnujwj"}},
}

// backupJob starts a real backup Job of b1 and gives it a UID, as the API
// server would.
func (c *cluster) backupJob(t testing.TB) *batchv1.Job {
	t.Helper()
	j, err := c.launcher.StartBackup(context.Background(), jobs.BackupSpec{Name: "b1", Location: "default", Target: target})
	if err != nil {
		t.Fatal(err)
	}
	return j
}

func (c *cluster) restoreJob(t testing.TB) *batchv1.Job {
	t.Helper()
	js, err := c.launcher.StartRestore(context.Background(), jobs.RestoreSpec{Name: "b1", Location: "default", Target: target, SHA256: sum})
	if err != nil {
		t.Fatal(err)
	}
	return js[0]
}

// pod creates a pod from j's template; owned says whether j controls it
// (a copy of the template made by hand is not owned).
func (c *cluster) pod(t testing.TB, j *batchv1.Job, name string, owned bool) *corev1.Pod {
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
	return metadata.NewIncomingContext(ctx, metadata.Pairs("authorization", "Bearer "+agentJWT(tok)))
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
	want := auth.Agent{Kind: "backup", JobNamespace: serverNS, JobName: bj.Name, Backup: "b1", Location: "default", Target: "app", Pod: "backup-pod"}
	if !ok || !reflect.DeepEqual(*a, want) {
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
	want = auth.Agent{Kind: "restore", JobNamespace: appNS, JobName: rj.Name, Backup: "b1", Location: "default", Target: "app", SHA256: sum, Pod: "restore-pod"}
	if !reflect.DeepEqual(*a, want) {
		t.Fatalf("agent %+v, want %+v", a, want)
	}

	// Each kind only its own verb.
	refused(t, c.guard, btok, auth.MethodDownloadBackup, codes.PermissionDenied, "only restore, drill and fold agents may download")
	refused(t, c.guard, rtok, auth.MethodUploadBackup, codes.PermissionDenied, "only backup, delta, fold and kit agents may upload")
	// Only delta agents hold a delta Lease (through the server).
	for _, m := range []string{auth.MethodGetDeltaLease, auth.MethodPutDeltaLease} {
		refused(t, c.guard, btok, m, codes.PermissionDenied, "only delta agents hold a delta Lease")
		refused(t, c.guard, rtok, m, codes.PermissionDenied, "only delta agents hold a delta Lease")
	}

	// A drill Job downloads its pinned backup, from the server's
	// namespace, and uploads nothing.
	dj, err := c.launcher.StartDrill(context.Background(), jobs.DrillSpec{Backup: "b1", Location: "default", Target: "app", SHA256: sum})
	if err != nil {
		t.Fatal(err)
	}
	dtok := c.tokenFor(c.pod(t, dj, "drill-pod", true))
	ctx, err = c.guard.Admit(withToken(dtok), auth.MethodDownloadBackup)
	if err != nil {
		t.Fatal(err)
	}
	a, _ = auth.AgentFrom(ctx)
	want = auth.Agent{Kind: "drill", JobNamespace: serverNS, JobName: dj.Name, Backup: "b1", Location: "default", Target: "app", SHA256: sum, Pod: "drill-pod"}
	if !reflect.DeepEqual(*a, want) {
		t.Fatalf("agent %+v, want %+v", a, want)
	}
	refused(t, c.guard, dtok, auth.MethodUploadBackup, codes.PermissionDenied, "only backup, delta, fold and kit agents may upload")
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
	if err := os.WriteFile(file, []byte(agentJWT(tok)+"\n"), 0o600); err != nil {
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

// copyJob creates, in namespace ns, a Job with every label and
// annotation of j (its signature too) and j's spec: what someone who may
// create Jobs there can make from a real agent Job. The API server gives
// it a UID of its own.
func (c *cluster) copyJob(t *testing.T, j *batchv1.Job, ns, name string) *batchv1.Job {
	t.Helper()
	cp := &batchv1.Job{ObjectMeta: metav1.ObjectMeta{
		Name: name, Namespace: ns, Labels: maps.Clone(j.Labels), Annotations: maps.Clone(j.Annotations),
	}, Spec: *j.Spec.DeepCopy()}
	cp, err := c.cs.BatchV1().Jobs(ns).Create(context.Background(), cp, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if cp.UID == j.UID {
		t.Fatalf("the copy has the original's UID %s", cp.UID)
	}
	return cp
}

// Labels and annotations can be copied; the server's signature of one
// Job fits no other, and only the server can make one.
func TestAgentGuardAdmitsOnlyJobsTheServerSigned(t *testing.T) {
	c := newCluster(t)
	rj := c.restoreJob(t)
	if rj.Annotations[jobs.AnnotationSignature] == "" || rj.Spec.Suspend == nil || *rj.Spec.Suspend {
		t.Fatalf("restore Job %s: annotations %v, suspend %v; want signed and let run", rj.Name, rj.Annotations, rj.Spec.Suspend)
	}
	real := c.tokenFor(c.pod(t, rj, "restore-pod", true))
	if _, err := c.guard.Admit(withToken(real), auth.MethodDownloadBackup); err != nil {
		t.Fatalf("the server's own restore Job: %v", err)
	}

	t.Run("copy with every label and annotation", func(t *testing.T) {
		forged := c.copyJob(t, rj, appNS, "restore-forged-0123456789")
		tok := c.tokenFor(c.pod(t, forged, "forged-pod", true))
		refused(t, c.guard, tok, auth.MethodDownloadBackup, codes.PermissionDenied, "is not one the server created")
	})
	t.Run("copy without the signature", func(t *testing.T) {
		forged := c.copyJob(t, rj, appNS, "restore-unsigned-0123456789")
		delete(forged.Annotations, jobs.AnnotationSignature)
		if _, err := c.cs.BatchV1().Jobs(appNS).Update(context.Background(), forged, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
		tok := c.tokenFor(c.pod(t, forged, "unsigned-pod", true))
		refused(t, c.guard, tok, auth.MethodDownloadBackup, codes.PermissionDenied, "carries no "+jobs.AnnotationSignature)
	})
	t.Run("tampered annotation", func(t *testing.T) {
		// The server's own Job, pointed at another backup afterwards.
		js, err := c.launcher.StartRestore(context.Background(), jobs.RestoreSpec{Name: "b2", Location: "default", Target: target, SHA256: sum})
		if err != nil {
			t.Fatal(err)
		}
		j := js[0]
		tok := c.tokenFor(c.pod(t, j, "tampered-pod", true))
		for _, ann := range []string{jobs.AnnotationBackup, jobs.AnnotationLocation, jobs.AnnotationSHA256, jobs.AnnotationTarget} {
			tampered := j.DeepCopy()
			tampered.Annotations[ann] += "x"
			if ann == jobs.AnnotationSHA256 {
				tampered.Annotations[ann] = strings.Repeat("0", 64)
			}
			if _, err := c.cs.BatchV1().Jobs(appNS).Update(context.Background(), tampered, metav1.UpdateOptions{}); err != nil {
				t.Fatal(err)
			}
			refused(t, c.guard, tok, auth.MethodDownloadBackup, codes.PermissionDenied, "does not match what the Job says it is")
		}
	})
	t.Run("signed, but not in its target's restore namespace", func(t *testing.T) {
		// Only the key makes such a Job: say a target's namespace
		// changed in the config while its restore ran.
		moved := c.copyJob(t, rj, otherNS, "restore-moved-0123456789")
		moved.Annotations[jobs.AnnotationSignature] = c.launcher.Signer().Sign(jobs.ClaimsOf(moved))
		moved, err := c.cs.BatchV1().Jobs(otherNS).Update(context.Background(), moved, metav1.UpdateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		tok := c.tokenFor(c.pod(t, moved, "moved-pod", true))
		refused(t, c.guard, tok, auth.MethodDownloadBackup, codes.PermissionDenied, "is not in namespace app, where restores of target \"app\" run")
	})
	t.Run("signed backup Job outside the server's namespace", func(t *testing.T) {
		bj := c.backupJob(t)
		moved := c.copyJob(t, bj, appNS, "backup-moved-0123456789")
		moved.Annotations[jobs.AnnotationSignature] = c.launcher.Signer().Sign(jobs.ClaimsOf(moved))
		moved, err := c.cs.BatchV1().Jobs(appNS).Update(context.Background(), moved, metav1.UpdateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		tok := c.tokenFor(c.pod(t, moved, "moved-backup-pod", true))
		refused(t, c.guard, tok, auth.MethodUploadBackup, codes.PermissionDenied, "is not in the server's namespace")
	})
	t.Run("signed for a target the server does not have", func(t *testing.T) {
		gone := c.copyJob(t, rj, appNS, "restore-gone-0123456789")
		gone.Annotations[jobs.AnnotationTarget] = "removed-target"
		gone.Annotations[jobs.AnnotationSignature] = c.launcher.Signer().Sign(jobs.ClaimsOf(gone))
		gone, err := c.cs.BatchV1().Jobs(appNS).Update(context.Background(), gone, metav1.UpdateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		tok := c.tokenFor(c.pod(t, gone, "gone-pod", true))
		refused(t, c.guard, tok, auth.MethodDownloadBackup, codes.PermissionDenied, `target "removed-target", which the server does not have`)
	})
	t.Run("signed by another key", func(t *testing.T) {
		other, err := jobs.NewSigner(bytes.Repeat([]byte{1}, 32))
		if err != nil {
			t.Fatal(err)
		}
		alien := c.copyJob(t, rj, appNS, "restore-alien-0123456789")
		alien.Annotations[jobs.AnnotationSignature] = other.Sign(jobs.ClaimsOf(alien))
		alien, err = c.cs.BatchV1().Jobs(appNS).Update(context.Background(), alien, metav1.UpdateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		tok := c.tokenFor(c.pod(t, alien, "alien-pod", true))
		refused(t, c.guard, tok, auth.MethodDownloadBackup, codes.PermissionDenied, "is not one the server created")
	})
}

// The key lives in a Secret: a restarted server (a new Launcher and
// guard over the same API server) admits the Jobs the earlier one made;
// one that lost the key does not.
func TestAgentGuardAdmitsJobsOfAnEarlierServer(t *testing.T) {
	c := newCluster(t)
	rj := c.restoreJob(t)
	tok := c.tokenFor(c.pod(t, rj, "restore-pod", true))

	restarted, err := jobs.New(c.cs, serverNS, config.Agents{Image: "agent:dev"})
	if err != nil {
		t.Fatal(err)
	}
	if err := restarted.LoadSigningKey(context.Background()); err != nil {
		t.Fatal(err)
	}
	if _, err := c.newGuard(t, restarted).Admit(withToken(tok), auth.MethodDownloadBackup); err != nil {
		t.Fatalf("after a restart: %v", err)
	}

	if err := c.cs.CoreV1().Secrets(serverNS).Delete(context.Background(), jobs.SigningKeySecret, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	keyless, err := jobs.New(c.cs, serverNS, config.Agents{Image: "agent:dev"})
	if err != nil {
		t.Fatal(err)
	}
	if err := keyless.LoadSigningKey(context.Background()); err != nil {
		t.Fatal(err)
	}
	refused(t, c.newGuard(t, keyless), tok, auth.MethodDownloadBackup, codes.PermissionDenied, "is not one the server created")
}

// A restore to a point's agent may download its full backup and exactly
// the delta segments its signed Job lists, each pinned to its SHA-256;
// editing the list makes the Job one the server did not create.
func TestRestoreAgentMayDownloadOnlyItsListedSegments(t *testing.T) {
	c := newCluster(t)
	segSum := strings.Repeat("d", 64)
	js, err := c.launcher.StartRestore(context.Background(), jobs.RestoreSpec{Name: "b1", Location: "default", Target: target, SHA256: sum,
		ToRevision: 30, Segments: []jobs.SegmentPin{{Name: "b1.delta-11", SHA256: segSum}}})
	if err != nil {
		t.Fatal(err)
	}
	tok := c.tokenFor(c.pod(t, js[0], "point-pod", true))
	ctx, err := c.guard.Admit(withToken(tok), auth.MethodDownloadBackup)
	if err != nil {
		t.Fatal(err)
	}
	a, _ := auth.AgentFrom(ctx)
	for name, want := range map[string]string{"b1": sum, "b1.delta-11": segSum} {
		if got, err := a.MayDownload(name, "default"); err != nil || got != want {
			t.Errorf("MayDownload(%s): %q, %v; want %q", name, got, err, want)
		}
	}
	for _, d := range []struct{ name, loc string }{{"b1.delta-21", "default"}, {"b2", "default"}, {"b1.delta-11", "s3"}} {
		if _, err := a.MayDownload(d.name, d.loc); status.Code(err) != codes.PermissionDenied {
			t.Errorf("MayDownload(%s in %s): %v; want PermissionDenied", d.name, d.loc, err)
		}
	}

	// Someone who may edit Jobs adds a segment to the list.
	j, err := c.cs.BatchV1().Jobs(js[0].Namespace).Get(context.Background(), js[0].Name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	j.Annotations[jobs.AnnotationDeltaSegments] = `[{"name":"b1.delta-11","sha256":"` + segSum + `"},{"name":"other","sha256":"` + segSum + `"}]`
	if _, err := c.cs.BatchV1().Jobs(j.Namespace).Update(context.Background(), j, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	refused(t, c.guard, tok, auth.MethodDownloadBackup, codes.PermissionDenied, "not one the server created")
}

// A fold Job downloads the chain its signed inputs pin and uploads; what
// it may read is exactly its inputs, and a changed list is not the
// server's.
func TestAgentGuardFoldAgent(t *testing.T) {
	c := newCluster(t)
	seg := strings.Repeat("1", 64)
	in := jobs.FoldInputs{Full: jobs.FoldRef{Name: "b1", SHA256: sum}, Segments: []jobs.FoldRef{{Name: "b1.delta-11", SHA256: seg}}, ToRevision: 20}
	fj, err := c.launcher.StartFold(context.Background(), jobs.FoldSpec{
		Target: target, Backup: jobs.FoldName(target.Name, 20), Location: "default", Inputs: in,
	})
	if err != nil {
		t.Fatal(err)
	}
	tok := c.tokenFor(c.pod(t, fj, "fold-pod", true))
	for _, m := range []string{auth.MethodDownloadBackup, auth.MethodUploadBackup, auth.MethodGetServerInfo} {
		ctx, err := c.guard.Admit(withToken(tok), m)
		if err != nil {
			t.Fatalf("%s: %v", m, err)
		}
		a, _ := auth.AgentFrom(ctx)
		want := auth.Agent{Kind: agentjob.Fold, JobNamespace: serverNS, JobName: fj.Name, Backup: "app-fold-20", Location: "default", Target: target.Name,
			Pod: "fold-pod", Inputs: map[string]string{"b1": sum, "b1.delta-11": seg}}
		if !reflect.DeepEqual(*a, want) {
			t.Fatalf("agent %+v, want %+v", a, want)
		}
		for name, pin := range map[string]string{"b1": sum, "b1.delta-11": seg} {
			if got, err := a.MayDownload(name, "default"); err != nil || got != pin {
				t.Errorf("MayDownload(%s) = %q, %v; want %q", name, got, err, pin)
			}
		}
		for _, name := range []string{"app-fold-20", "b2", "b1.delta-30", ""} {
			if _, err := a.MayDownload(name, "default"); err == nil {
				t.Errorf("a fold agent may download %q, which its inputs do not name", name)
			}
		}
	}
	refused(t, c.guard, tok, auth.MethodGetBackup, codes.PermissionDenied, "only delta and kit agents may read a backup's record")

	// One more segment, or another pin, in the annotation: not what the
	// server signed.
	for i, change := range []func(*jobs.FoldInputs){
		func(in *jobs.FoldInputs) {
			in.Segments = append(in.Segments, jobs.FoldRef{Name: "b1.delta-21", SHA256: seg})
		},
		func(in *jobs.FoldInputs) { in.Full.SHA256 = seg },
		func(in *jobs.FoldInputs) { in.Full.Name = "b2" },
	} {
		changed := in
		changed.Segments = slices.Clone(in.Segments)
		change(&changed)
		b, err := json.Marshal(changed)
		if err != nil {
			t.Fatal(err)
		}
		tampered := fj.DeepCopy()
		tampered.Annotations[jobs.AnnotationFoldInputs] = string(b)
		if _, err := c.cs.BatchV1().Jobs(serverNS).Update(context.Background(), tampered, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
		t.Run(strconv.Itoa(i), func(t *testing.T) {
			refused(t, c.guard, tok, auth.MethodDownloadBackup, codes.PermissionDenied, "does not match what the Job says it is")
		})
	}
}

// A delta Job's pod holds its target's delta Lease through the server
// and reads its chain's record; it downloads nothing.
func TestAgentGuardDeltaAgent(t *testing.T) {
	c := newCluster(t)
	j, err := c.launcher.StartDelta(context.Background(), jobs.DeltaSpec{Target: target, Chain: "b1", Location: "default", Period: time.Minute, MaxBytes: 1 << 20})
	if err != nil {
		t.Fatal(err)
	}
	tok := c.tokenFor(c.pod(t, j, "delta-pod", true))
	for _, m := range []string{auth.MethodGetDeltaLease, auth.MethodPutDeltaLease, auth.MethodGetBackup, auth.MethodUploadBackup} {
		ctx, err := c.guard.Admit(withToken(tok), m)
		if err != nil {
			t.Fatalf("%s: %v", m, err)
		}
		a, _ := auth.AgentFrom(ctx)
		if a.Kind != agentjob.Delta || a.Target != target.Name || a.Pod != "delta-pod" || a.Backup != "b1" {
			t.Fatalf("%s: agent %+v", m, a)
		}
	}
	refused(t, c.guard, tok, auth.MethodDownloadBackup, codes.PermissionDenied, "only restore, drill and fold agents may download")
	// The pod no longer mounts a token for the API server: the Lease is
	// the server's to write.
	if am := j.Spec.Template.Spec.AutomountServiceAccountToken; am == nil || *am {
		t.Errorf("the delta pod automounts an API token (automountServiceAccountToken %v)", am)
	}
}

// What a Job's pod may call is its kind's row of agentjob.Kinds, for
// every kind: UploadBackup when it uploads, DownloadBackup when it
// downloads, GetBackup when it reads its backup's record, the delta Lease
// when it writes a delta chain, GetServerInfo always.
func TestAgentGuardFollowsTheKindTable(t *testing.T) {
	c := newCluster(t)
	ctx := context.Background()
	seg := strings.Repeat("1", 64)
	start := map[agentjob.Kind]func() (*batchv1.Job, error){
		agentjob.Backup: func() (*batchv1.Job, error) {
			return c.launcher.StartBackup(ctx, jobs.BackupSpec{Name: "b1", Location: "default", Target: target})
		},
		agentjob.Restore: func() (*batchv1.Job, error) { return c.restoreJob(t), nil },
		agentjob.Drill: func() (*batchv1.Job, error) {
			return c.launcher.StartDrill(ctx, jobs.DrillSpec{Backup: "b1", Location: "default", Target: "app", SHA256: sum})
		},
		agentjob.Delta: func() (*batchv1.Job, error) {
			return c.launcher.StartDelta(ctx, jobs.DeltaSpec{Target: target, Chain: "b1", Location: "default", Period: time.Minute, MaxBytes: 1 << 20})
		},
		agentjob.Kit: func() (*batchv1.Job, error) {
			return c.launcher.StartKit(ctx, jobs.KitSpec{Backup: "b1", Location: "default", Target: kitTarget})
		},
		agentjob.Fold: func() (*batchv1.Job, error) {
			return c.launcher.StartFold(ctx, jobs.FoldSpec{Target: target, Backup: jobs.FoldName(target.Name, 20), Location: "default",
				Inputs: jobs.FoldInputs{Full: jobs.FoldRef{Name: "b1", SHA256: sum}, Segments: []jobs.FoldRef{{Name: "b1.delta-11", SHA256: seg}}, ToRevision: 20}})
		},
	}
	for _, kind := range agentjob.Kinds {
		t.Run(string(kind.Kind), func(t *testing.T) {
			startJob, ok := start[kind.Kind]
			if !ok {
				t.Fatalf("no Job of kind %s here: add how to start one", kind.Kind)
			}
			j, err := startJob()
			if err != nil {
				t.Fatal(err)
			}
			tok := c.tokenFor(c.pod(t, j, string(kind.Kind)+"-pod", true))
			for method, may := range map[string]bool{
				auth.MethodUploadBackup: kind.Uploads, auth.MethodDownloadBackup: kind.Downloads,
				auth.MethodGetBackup: kind.ReadsRecord, auth.MethodGetDeltaLease: kind.DeltaWriter, auth.MethodPutDeltaLease: kind.DeltaWriter,
				auth.MethodGetServerInfo: true,
			} {
				admitted, err := c.guard.Admit(withToken(tok), method)
				switch {
				case may && err != nil:
					t.Errorf("%s: %v; its row allows it", method, err)
				case may:
					if a, _ := auth.AgentFrom(admitted); a == nil || a.Kind != kind.Kind || a.JobName != j.Name {
						t.Errorf("%s: admitted as %+v", method, a)
					} else if kind.ReadsHost && a.Node != kitTarget.Kit.NodeName {
						t.Errorf("%s: a kit agent admitted on node %q, its pod's is %q", method, a.Node, kitTarget.Kit.NodeName)
					}
				case status.Code(err) != codes.PermissionDenied:
					t.Errorf("%s: %v; its row does not allow it", method, err)
				}
			}
		})
	}
}
