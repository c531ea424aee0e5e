package auth

import (
	"context"
	"fmt"
	"strings"
	"sync"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	authnv1 "k8s.io/api/authentication/v1"
	authzv1 "k8s.io/api/authorization/v1"
	"k8s.io/client-go/kubernetes"

	ebv1 "github.com/kubectl-etcdbackup/kubectl-etcdbackup/api/etcdbackup/v1"
)

// APIGroup is the API group of the virtual resources user calls are
// authorized on. No CRD serves them: they exist only in RBAC rules and
// SubjectAccessReviews, so that a cluster's own RBAC decides who may do
// what with backups.
const APIGroup = "etcdbackup.io"

// Virtual resources of APIGroup.
const (
	ResourceBackups   = "backups"
	ResourceRestores  = "restores"
	ResourceLocations = "locations"
)

// Permission is what one RPC takes: Verb on Resource (of APIGroup) in the
// server's namespace.
type Permission struct {
	Resource string
	Verb     string
}

func (p Permission) String() string { return p.Verb + " " + p.Resource + "." + APIGroup }

// UserPermissions maps every RPC of the user API (its full method name) to
// the permission it takes. A method missing here is refused, never
// allowed: a new RPC is unreachable in SubjectAccessReview mode until it
// is given a verb (users_test.go fails until then).
var UserPermissions = map[string]Permission{
	// Server info (locations, targets, limits) is what every command reads
	// first; whoever may read a backup may read where backups live.
	ebv1.InfoService_GetServerInfo_FullMethodName: {ResourceBackups, "get"},

	ebv1.BackupService_ListBackups_FullMethodName: {ResourceBackups, "list"},
	ebv1.BackupService_GetBackup_FullMethodName:   {ResourceBackups, "get"},
	// Download is not get: a backup's bytes are every Secret of the
	// cluster, its metadata is not.
	ebv1.BackupService_DownloadBackup_FullMethodName: {ResourceBackups, "download"},
	ebv1.BackupService_UploadBackup_FullMethodName:   {ResourceBackups, "upload"},
	// Create starts a backup agent Job on one of the server's targets.
	ebv1.BackupService_CreateBackup_FullMethodName: {ResourceBackups, "create"},
	ebv1.BackupService_DeleteBackup_FullMethodName: {ResourceBackups, "delete"},
	// Prune deletes backups (those retention selects).
	ebv1.BackupService_PruneBackups_FullMethodName:  {ResourceBackups, "delete"},
	ebv1.BackupService_GetBackupLogs_FullMethodName: {ResourceBackups, "logs"},
	// Verify reads the backup on the server and returns only a verdict
	// (sizes, hashes, what is corrupt), never its contents: what get shows.
	ebv1.BackupService_VerifyBackup_FullMethodName: {ResourceBackups, "get"},
	// Events of the agent Job and its pods tell the same story as its log
	// (image pulls, scheduling, failures) and can name the same nodes and
	// volumes, so they take what the log takes.
	ebv1.BackupService_GetBackupEvents_FullMethodName: {ResourceBackups, "logs"},

	// A drill downloads the backup into an agent of the server's, never
	// to the caller, and records only a verdict: a verb of its own, which
	// operators have.
	ebv1.BackupService_DrillBackup_FullMethodName: {ResourceBackups, "drill"},

	ebv1.BackupService_RestoreBackup_FullMethodName: {ResourceRestores, "create"},
	ebv1.BackupService_GetRestore_FullMethodName:    {ResourceRestores, "get"},

	// The ledger says who read which backup: what an auditor, not every
	// viewer, reads.
	ebv1.BackupService_GetLedger_FullMethodName: {ResourceBackups, "audit"},

	// A location check writes, reads and deletes probe objects of its
	// own, never a backup: what an operator, who stores backups, may do.
	ebv1.BackupService_CheckLocation_FullMethodName: {ResourceLocations, "check"},
}

// roleGranting names the smallest shipped ClusterRole
// (manifests/roles.yaml) that grants p, for refusal messages.
func roleGranting(p Permission) string {
	switch {
	case p.Resource == ResourceBackups && (p.Verb == "list" || p.Verb == "get" || p.Verb == "download" || p.Verb == "logs"):
		return "etcdbackup-viewer"
	case p.Resource == ResourceBackups && (p.Verb == "create" || p.Verb == "upload" || p.Verb == "drill" || p.Verb == "audit"),
		p.Resource == ResourceRestores && p.Verb == "get",
		p.Resource == ResourceLocations && p.Verb == "check":
		return "etcdbackup-operator"
	}
	return "etcdbackup-admin"
}

// SubjectAccessReviewGuard authenticates every user call's bearer token
// with a TokenReview and authorizes it with a SubjectAccessReview on
// UserPermissions in Namespace: the user listener in
// SubjectAccessReview mode. The server's ServiceAccount needs
// system:auth-delegator (manifests/roles.yaml binds it).
//
// Anyone who may port-forward to the server can send calls, so the
// reviews are bounded as the agent port's are (userreview.go): a cheap
// check of the token first, answers and decisions cached by the token's
// SHA-256 for a few seconds, concurrent calls with one token sharing one
// review, a cap on reviews in flight with slots of their own for tokens
// accepted before, a rate for new tokens, and a timeout on each.
type SubjectAccessReviewGuard struct {
	Client kubernetes.Interface
	// Namespace is the server's: RBAC granted there (RoleBindings of the
	// etcdbackup-* ClusterRoles) is what counts.
	Namespace string
	// Reviews bounds the reviews; read at the first call.
	Reviews UserReviews

	once     sync.Once
	reviewer *userReviewer
}

// NewSubjectAccessReviewGuard returns the Guard of the user listener in
// SubjectAccessReview mode, for a server in namespace, with the default
// bounds on its reviews, which client makes.
func NewSubjectAccessReviewGuard(client kubernetes.Interface, namespace string) Guard {
	return &SubjectAccessReviewGuard{Client: client, Namespace: namespace}
}

// Admit implements Guard. The returned context carries the caller
// (UserFrom).
func (g *SubjectAccessReviewGuard) Admit(ctx context.Context, fullMethod string) (context.Context, error) {
	perm, ok := UserPermissions[fullMethod]
	if !ok {
		return ctx, status.Errorf(codes.PermissionDenied, "%s is not an RPC this server authorizes; refused", fullMethod)
	}
	if md, _ := metadata.FromIncomingContext(ctx); len(md.Get(AuthorizationHeader)) == 0 {
		return ctx, status.Error(codes.Unauthenticated, g.noTokenMessage())
	}
	token, err := BearerToken(ctx)
	if err != nil {
		return ctx, err
	}
	g.once.Do(func() { g.reviewer = newUserReviewer(g.Client, g.Namespace, g.Reviews) })
	key := userTokenKey(token)
	user, err := g.reviewer.authenticate(ctx, key, token)
	if err != nil {
		return ctx, err
	}
	d, err := g.reviewer.authorize(ctx, key, user, perm)
	if err != nil {
		return ctx, err
	}
	if !d.allowed {
		return ctx, status.Error(codes.PermissionDenied, g.refusal(user.Username, perm, d.reason))
	}
	return WithUser(ctx, user), nil
}

func (g *SubjectAccessReviewGuard) noTokenMessage() string {
	return fmt.Sprintf("this server authorizes every call (authorization mode SubjectAccessReview) and the call carries no bearer token: "+
		"a kubeconfig user that authenticates with a client certificate has none to send. "+
		"Use a token: kubectl etcdbackup --token=$(kubectl create token NAME -n %s) … for a ServiceAccount NAME that has an etcdbackup-* role in %s, "+
		"or a kubeconfig user with a token, an exec plugin or OIDC", g.Namespace, g.Namespace)
}

func (g *SubjectAccessReviewGuard) refusal(user string, p Permission, reason string) string {
	var b strings.Builder
	fmt.Fprintf(&b, "user %q may not %s %s.%s in namespace %q", user, p.Verb, p.Resource, APIGroup, g.Namespace)
	if reason != "" {
		fmt.Fprintf(&b, " (%s)", reason)
	}
	fmt.Fprintf(&b, "; check with: kubectl auth can-i %s %s.%s -n %s; ClusterRole %s grants it (bind it with a RoleBinding in %s)",
		p.Verb, p.Resource, APIGroup, g.Namespace, roleGranting(p), g.Namespace)
	return b.String()
}

// extraOf converts TokenReview's extra to SubjectAccessReview's: the same
// data under another type, which authorizers (node, webhook, CEL) may use.
func extraOf(u authnv1.UserInfo) map[string]authzv1.ExtraValue {
	if len(u.Extra) == 0 {
		return nil
	}
	extra := make(map[string]authzv1.ExtraValue, len(u.Extra))
	for k, v := range u.Extra {
		extra[k] = authzv1.ExtraValue(v)
	}
	return extra
}

type userKey struct{}

// WithUser returns ctx carrying user, as a Guard admitting a call does.
func WithUser(ctx context.Context, user authnv1.UserInfo) context.Context {
	return context.WithValue(ctx, userKey{}, user)
}

// UserFrom returns the caller a Guard authenticated, so that handlers can
// log who did what. ok is false in PortForward mode, where callers are not
// authenticated by the server.
func UserFrom(ctx context.Context) (user authnv1.UserInfo, ok bool) {
	user, ok = ctx.Value(userKey{}).(authnv1.UserInfo)
	return user, ok
}
