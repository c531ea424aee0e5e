package plugin

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"path"
	"strings"

	agelib "filippo.io/age"

	ebv1 "github.com/kubectl-etcdbackup/kubectl-etcdbackup/api/etcdbackup/v1"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/client"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/crypt"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/kit"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/snapshot/kube/atrest"
)

// fetchKit downloads backup b's recovery kit, pinned to the SHA-256 b
// records for it, and opens it with ids on this machine: the only place
// its plaintext ever is. Every refusal says what to do.
func fetchKit(ctx context.Context, conn *Connection, b *ebv1.Backup, ids []agelib.Identity) (*kit.Contents, error) {
	k := b.GetKit()
	if k == nil {
		return nil, withCode(ExitRefused, fmt.Errorf("backup %q has no recovery kit: its target names no kit: in the server's configuration, or its kit agent did not store one (its log: kubectl -n etcdbackup-restore logs -l app.kubernetes.io/component=kit-agent, in the server's agents.restoreNamespace)", b.GetName()))
	}
	if len(ids) == 0 {
		return nil, withCode(ExitUsage, fmt.Errorf("the recovery kit of %q is age-encrypted to %s: %s", b.GetName(), strings.Join(k.GetAgeRecipients(), ", "), passIdentity))
	}
	var buf bytes.Buffer
	_, err := conn.Client.Download(ctx, &limitedBuffer{b: &buf, left: 2 * kit.MaxBytes}, client.DownloadRequest{
		Name: k.GetName(), Location: b.GetLocation(),
		OnHeader: func(got *ebv1.Backup) error {
			if got.GetSha256() != k.GetSha256() {
				return fmt.Errorf("the stored kit %q is not the one backup %q records (sha256 %s, recorded %s)", k.GetName(), b.GetName(), got.GetSha256(), k.GetSha256())
			}
			return nil
		},
	})
	if errors.Is(err, client.ErrCorrupt) {
		return nil, withCode(ExitFailed, fmt.Errorf("the recovery kit of %q fails its SHA-256: its stored bytes changed; do not use it, take a new backup", b.GetName()))
	}
	if err != nil {
		return nil, conn.explain("download the recovery kit of "+quote(b.GetName()), err)
	}
	c, err := kit.Open(&buf, ids)
	switch {
	case errors.Is(err, crypt.ErrNoMatchingIdentity):
		return nil, withCode(ExitRefused, fmt.Errorf("none of the identities given opens the recovery kit of %q: it is sealed to %s; pass the identity of one of these", b.GetName(), strings.Join(k.GetAgeRecipients(), ", ")))
	case errors.Is(err, crypt.ErrTampered), errors.Is(err, kit.ErrDamaged):
		return nil, withCode(ExitFailed, fmt.Errorf("the recovery kit of %q is damaged: %w; do not use it, take a new backup", b.GetName(), err))
	case err != nil:
		return nil, fmt.Errorf("open the recovery kit of %q: %w", b.GetName(), err)
	}
	if c.Index.Backup != b.GetName() {
		return nil, withCode(ExitFailed, fmt.Errorf("the recovery kit stored with %q was sealed for backup %q: do not use it", b.GetName(), c.Index.Backup))
	}
	return c, nil
}

// limitedBuffer holds at most left bytes: a kit is small, and a store
// that sends more is not sending a kit.
type limitedBuffer struct {
	b    *bytes.Buffer
	left int64
}

func (l *limitedBuffer) Write(p []byte) (int, error) {
	if int64(len(p)) > l.left {
		return 0, fmt.Errorf("more than %d bytes: not a recovery kit", 2*kit.MaxBytes)
	}
	l.left -= int64(len(p))
	return l.b.Write(p)
}

// kitEncryptionConfig is the EncryptionConfiguration a kit holds, with
// its keys: the file the kit's kube-apiserver manifest names in
// --encryption-provider-config, else the one file of the kit that parses
// as one. Nil when there is none.
func kitEncryptionConfig(c *kit.Contents) (string, *atrest.Keys) {
	var named []string
	for p, b := range c.Data {
		if path.Base(p) != "kube-apiserver.yaml" {
			continue
		}
		if _, _, flags, err := staticPod(b, "kube-apiserver"); err == nil && flags["encryption-provider-config"] != "" {
			named = append(named, flags["encryption-provider-config"])
		}
	}
	for _, p := range named {
		if keys, err := atrest.Parse(c.Data[p]); err == nil {
			return p, keys
		}
	}
	var found []string
	var keys *atrest.Keys
	for p, b := range c.Data {
		if !bytes.Contains(b, []byte("EncryptionConfiguration")) {
			continue
		}
		if k, err := atrest.Parse(b); err == nil {
			found, keys = append(found, p), k
		}
	}
	if len(found) != 1 {
		return "", nil
	}
	return found[0], keys
}
