package jobs

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
)

// ErrIdentitySecret marks an identity Secret a drill or fold Job would
// mount that does not exist or holds no age identity: a problem of the
// configuration, not of any backup.
var ErrIdentitySecret = errors.New("identity Secret unusable")

// ageKeyPrefix starts every native age identity (age-keygen's
// AGE-SECRET-KEY-1… lines).
const ageKeyPrefix = "AGE-SECRET-KEY-"

// CheckIdentitySecret verifies that Secret name in the server's
// namespace, which a drill or fold Job would mount as its age identity
// (use says whose: "drill" or "deltas"), exists and has a key the agent
// reads (not dot-prefixed) holding an age identity. Errors that say
// what to fix wrap ErrIdentitySecret. Whether the identity matches the
// backups' recipients only the agent finds out: the server never
// decrypts. When the server's Role does not let it get the Secret (the
// shipped one does not: the identities need reach no one but the agent),
// nothing is checked and the agent reports a missing identity itself.
func (l *Launcher) CheckIdentitySecret(ctx context.Context, name, use string) error {
	s, err := l.client.CoreV1().Secrets(l.namespace).Get(ctx, name, metav1.GetOptions{})
	switch {
	case apierrors.IsForbidden(err):
		return nil
	case apierrors.IsNotFound(err):
		return fmt.Errorf("%w: the %s identity Secret %s/%s does not exist: create it with the age identity file that decrypts the target's backups "+
			"(kubectl -n %s create secret generic %s --from-file=identity.txt=KEYFILE), or correct the target's %s.identitySecret",
			ErrIdentitySecret, use, l.namespace, name, l.namespace, name, use)
	case err != nil:
		return fmt.Errorf("check the %s identity Secret %s/%s: %w", use, l.namespace, name, err)
	}
	var keys []string
	for k, v := range s.Data {
		if strings.HasPrefix(k, ".") {
			continue // the agent skips dotted names (a Secret volume's own)
		}
		if strings.Contains(string(v), ageKeyPrefix) {
			return nil
		}
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return fmt.Errorf("%w: the %s identity Secret %s/%s holds no age identity (keys read: %s): each key must be an age identity file "+
		"(%s1… lines, as age-keygen writes); recreate it with kubectl -n %s create secret generic %s --from-file=identity.txt=KEYFILE",
		ErrIdentitySecret, use, l.namespace, name, cmpOrNone(strings.Join(keys, ", ")), ageKeyPrefix, l.namespace, name)
}

func cmpOrNone(s string) string {
	if s == "" {
		return "none"
	}
	return s
}

// identityVolume is the age identity Secret's volume and mount of a
// drill or fold Job. The volume is optional: when the Secret is missing
// (deleted after the launch check, or not checked) the pod still starts,
// with an empty directory, and the agent reports that it has no identity
// rather than the pod waiting in ContainerCreating until its deadline.
func identityVolume(secret string) (corev1.Volume, corev1.VolumeMount) {
	return corev1.Volume{Name: "age-identity", VolumeSource: corev1.VolumeSource{
			// Readable by the agent's group (fsGroup) only.
			Secret: &corev1.SecretVolumeSource{SecretName: secret, DefaultMode: ptr.To[int32](0o440), Optional: ptr.To(true)},
		}},
		corev1.VolumeMount{Name: "age-identity", MountPath: identityMountPath, ReadOnly: true}
}
