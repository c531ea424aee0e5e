package jobs

import (
	"context"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/ptr"

	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/api/agentjob"
)

// Agent Jobs are vouched for by the server: after creating one it
// annotates it with an HMAC-SHA256, under a key only the server holds,
// of what the Job is for (JobClaims) — its namespace, name and UID among
// them. Labels and other annotations anyone who may create Jobs can
// copy; the signature of one Job does not fit another (its UID differs),
// and no other can be made without the key. The agent guard, the
// in-use check of delete and retention, and the restore listing count
// only Jobs whose signature fits.
const (
	// AnnotationSignature holds a Job's signature (base64url, no padding).
	AnnotationSignature = "etcdbackup.io/signature"
	// SigningKeySecret is the Secret, in the server's namespace, that
	// holds the key (data key SigningKeyField), so that Jobs signed before
	// a restart are recognised after it.
	SigningKeySecret = agentjob.SigningKeySecret
	// SigningKeyField is the Secret's data key.
	SigningKeyField = "key"
	// signingKeySize is the key's length in bytes.
	signingKeySize = 32
	// signatureDomain starts what is signed, so that the key signs
	// nothing else by accident.
	signatureDomain = "etcdbackup.io/agent-job/v1"
)

// Signer signs agent Jobs and checks their signatures. Its key never
// appears in a log, an error or a response.
type Signer struct {
	key []byte
}

// NewSigner returns a Signer with key (at least 32 bytes).
func NewSigner(key []byte) (*Signer, error) {
	if len(key) < signingKeySize {
		return nil, fmt.Errorf("job signing key: %d bytes, at least %d are needed", len(key), signingKeySize)
	}
	return &Signer{key: append([]byte(nil), key...)}, nil
}

// newRandomSigner returns a Signer with a fresh key that lives only in
// memory: Jobs it signs are not recognised by another process.
func newRandomSigner() *Signer {
	key := make([]byte, signingKeySize)
	_, _ = rand.Read(key) // crypto/rand.Read never fails
	return &Signer{key: key}
}

// LoadSigner reads the signing key from Secret SigningKeySecret in
// namespace, creating it with a new random key when it does not exist.
// Two servers starting at once agree: the one whose create loses reads
// the winner's key.
func LoadSigner(ctx context.Context, client kubernetes.Interface, namespace string) (*Signer, error) {
	secrets := client.CoreV1().Secrets(namespace)
	s, err := secrets.Get(ctx, SigningKeySecret, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		fresh := newRandomSigner()
		s, err = secrets.Create(ctx, &corev1.Secret{
			ObjectMeta: metav1.ObjectMeta{Name: SigningKeySecret, Namespace: namespace,
				Labels: map[string]string{LabelManagedBy: managedBy}},
			Type: corev1.SecretTypeOpaque,
			Data: map[string][]byte{SigningKeyField: fresh.key},
		}, metav1.CreateOptions{})
		if apierrors.IsAlreadyExists(err) {
			s, err = secrets.Get(ctx, SigningKeySecret, metav1.GetOptions{})
		}
	}
	if err != nil {
		return nil, fmt.Errorf("job signing key: Secret %s/%s: %w", namespace, SigningKeySecret, err)
	}
	signer, err := NewSigner(s.Data[SigningKeyField])
	if err != nil {
		return nil, fmt.Errorf("job signing key in Secret %s/%s, key %q: %w (delete the Secret to have the server make a new one; running agent Jobs then fail)",
			namespace, SigningKeySecret, SigningKeyField, err)
	}
	return signer, nil
}

// JobClaims is what a Job's signature vouches for.
type JobClaims struct {
	Namespace, Name string
	UID             types.UID
	// Kind is the row of agentjob.Kinds whose component label the Job
	// carries; "" for none.
	Kind                     agentjob.Kind
	Backup, Location, Target string
	// SHA256 is the backup a restore or drill Job reads; "" for backups.
	SHA256 string
	// Scheduled is a backup the server's schedule started.
	Scheduled bool
	// ToRevision and ToTime are a restore to a point's (annotations
	// AnnotationToRevision, AnnotationToTime, as written); Segments is
	// the SHA-256 of its AnnotationDeltaSegments: the segments the Job
	// may download are exactly the ones signed. All "" otherwise.
	ToRevision, ToTime, Segments string
	// ToMinRevision is AnnotationToMinRevision, "" when unset.
	ToMinRevision string
	// FoldInputs is a fold Job's AnnotationFoldInputs: every backup and
	// segment it may download, pinned. "" for other kinds.
	FoldInputs string
}

// ClaimsOf reads what j says it is: its identity, the component label and
// the etcdbackup.io annotations. Whether the server said so too is what
// Verify checks.
func ClaimsOf(j *batchv1.Job) JobClaims {
	c := JobClaims{
		Namespace: j.Namespace, Name: j.Name, UID: j.UID,
		Backup: j.Annotations[AnnotationBackup], Location: j.Annotations[AnnotationLocation],
		Target: j.Annotations[AnnotationTarget], SHA256: j.Annotations[AnnotationSHA256],
		Scheduled:  j.Labels[LabelScheduled] == "true",
		ToRevision: j.Annotations[AnnotationToRevision], ToTime: j.Annotations[AnnotationToTime],
		ToMinRevision: j.Annotations[AnnotationToMinRevision],
	}
	if segs, ok := j.Annotations[AnnotationDeltaSegments]; ok {
		c.Segments = segmentsDigest(segs)
	}
	if k, ok := agentjob.OfComponent(j.Labels[LabelComponent]); ok {
		c.Kind = k.Kind
	}
	if c.Kind == agentjob.Fold {
		c.FoldInputs = j.Annotations[AnnotationFoldInputs]
	}
	return c
}

// canonical is the one encoding of c that is signed: a JSON array of
// strings, whose encoding of each element is unambiguous.
func (c JobClaims) canonical() []byte {
	fields := []string{
		signatureDomain, c.Namespace, c.Name, string(c.UID), string(c.Kind),
		c.Backup, c.Location, c.Target, c.SHA256, strconv.FormatBool(c.Scheduled),
	}
	// Only a restore to a point says more, so that Jobs signed before
	// points existed keep their signatures across an upgrade; the longer
	// array cannot be read as the shorter one.
	if c.ToRevision != "" || c.ToTime != "" || c.Segments != "" {
		fields = append(fields, c.ToRevision, c.ToTime, c.Segments)
		if c.ToMinRevision != "" {
			// Only when set: Jobs signed before it existed keep their
			// signatures.
			fields = append(fields, c.ToMinRevision)
		}
	}
	if c.Kind == agentjob.Fold {
		// Only a fold's: the other kinds' signatures stay what they were.
		fields = append(fields, c.FoldInputs)
	}
	b, _ := json.Marshal(fields)
	return b
}

// Sign returns the signature of c.
func (s *Signer) Sign(c JobClaims) string {
	mac := hmac.New(sha256.New, s.key)
	mac.Write(c.canonical())
	return base64.RawURLEncoding.EncodeToString(mac.Sum(nil))
}

// errUnsigned and errBadSignature are Verify's refusals.
var (
	errUnsigned     = errors.New("the Job carries no " + AnnotationSignature + " annotation: the server did not create it")
	errBadSignature = errors.New("the Job's " + AnnotationSignature + " annotation does not match what the Job says it is (its namespace, name, UID, kind, backup, location, target, SHA-256, point and delta segments): the server did not create it as it is")
)

// Verify checks that j carries the server's signature of what it says
// it is.
func (s *Signer) Verify(j *batchv1.Job) error {
	got := j.Annotations[AnnotationSignature]
	if got == "" {
		return errUnsigned
	}
	sig, err := base64.RawURLEncoding.DecodeString(got)
	if err != nil {
		return errBadSignature
	}
	mac := hmac.New(sha256.New, s.key)
	mac.Write(ClaimsOf(j).canonical())
	if !hmac.Equal(sig, mac.Sum(nil)) {
		return errBadSignature
	}
	return nil
}

// LoadSigningKey makes the Launcher sign and check Jobs with the key in
// Secret SigningKeySecret of the server's namespace, creating it if need
// be (LoadSigner): Jobs signed before a restart keep working after it.
// The server calls it once at start, before it creates or admits any.
func (l *Launcher) LoadSigningKey(ctx context.Context) error {
	s, err := LoadSigner(ctx, l.client, l.namespace)
	if err != nil {
		return err
	}
	l.signer.Store(s)
	return nil
}

// RefreshSigningKey reads the signing key's Secret again and uses what it
// holds from now on: a key rotated by hand, or a new one made here when
// the Secret is gone — deleted to rotate it, or removed by a restore of
// the cluster (snapshot.RevokeServerKeys), since every backup of the
// cluster holds the key. Jobs signed with the old key are refused from
// then on. It says whether the key changed; on an error the key in
// force is kept.
func (l *Launcher) RefreshSigningKey(ctx context.Context) (bool, error) {
	s, err := LoadSigner(ctx, l.client, l.namespace)
	if err != nil {
		return false, err
	}
	if cur := l.signer.Load(); cur != nil && hmac.Equal(cur.key, s.key) {
		return false, nil
	}
	l.signer.Store(s)
	return true, nil
}

// Signer is what signs and checks the Launcher's Jobs.
func (l *Launcher) Signer() *Signer { return l.signer.Load() }

// Verify checks j's signature with the key in force (Signer.Verify).
func (l *Launcher) Verify(j *batchv1.Job) error { return l.Signer().Verify(j) }

// Signed says whether j carries the server's signature (Signer.Verify).
func (l *Launcher) Signed(j *batchv1.Job) bool { return l.Signer().Verify(j) == nil }

// sign annotates made, a Job just created suspended, with its signature
// and lets it run: no pod of it exists before it is signed, so none
// calls the server before the guard can admit it. The patch is bound to
// made's UID. A Job that cannot be signed is deleted, since it could
// never run.
func (l *Launcher) sign(ctx context.Context, made *batchv1.Job) (*batchv1.Job, error) {
	sig := l.Signer().Sign(ClaimsOf(made))
	patch, err := json.Marshal(map[string]any{
		"metadata": map[string]any{"uid": made.UID, "annotations": map[string]string{AnnotationSignature: sig}},
		"spec":     map[string]any{"suspend": false},
	})
	if err != nil {
		return nil, err
	}
	signed, err := l.client.BatchV1().Jobs(made.Namespace).Patch(ctx, made.Name, types.MergePatchType, patch, metav1.PatchOptions{})
	if err != nil {
		derr := l.client.BatchV1().Jobs(made.Namespace).Delete(context.WithoutCancel(ctx), made.Name,
			metav1.DeleteOptions{Preconditions: &metav1.Preconditions{UID: &made.UID}, PropagationPolicy: ptr.To(metav1.DeletePropagationBackground)})
		if derr != nil && !apierrors.IsNotFound(derr) {
			return nil, fmt.Errorf("sign job %s/%s: %w (and deleting the unsigned, suspended Job failed: %v)", made.Namespace, made.Name, err, derr)
		}
		return nil, fmt.Errorf("sign job %s/%s: %w", made.Namespace, made.Name, err)
	}
	return signed, nil
}

// signedVersion is the await condition of signing j: the cache has j
// with its signature.
func signedVersion(j *batchv1.Job) func(*batchv1.Job) bool {
	return func(c *batchv1.Job) bool {
		return c != nil && c.UID == j.UID && c.Annotations[AnnotationSignature] == j.Annotations[AnnotationSignature]
	}
}
