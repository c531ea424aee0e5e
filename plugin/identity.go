package plugin

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"

	agelib "filippo.io/age"
	"github.com/spf13/cobra"

	ebv1 "github.com/kubectl-etcdbackup/kubectl-etcdbackup/api/etcdbackup/v1"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/client"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/crypt"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/snapshot"
)

// IdentityEnv names an age identity file used when no --identity is given.
const IdentityEnv = "ETCDBACKUP_AGE_IDENTITY"

// addIdentityFlag adds the repeatable --identity flag. Identities are
// only ever read from files: a secret key on a command line would end up
// in shell history and process listings.
func addIdentityFlag(cmd *cobra.Command, files *[]string, what string) {
	cmd.Flags().StringArrayVar(files, "identity", nil,
		"age identity `FILE` (secret key, as age-keygen writes it) to decrypt "+what+"; repeatable; default $"+IdentityEnv)
}

// loadIdentities reads the identity files, or the one $ETCDBACKUP_AGE_IDENTITY
// names; none is not an error (an unencrypted backup needs none).
func loadIdentities(files []string) ([]agelib.Identity, error) {
	if len(files) == 0 {
		if f := os.Getenv(IdentityEnv); f != "" {
			ids, err := crypt.ReadIdentityFiles(f)
			if err != nil {
				return nil, fmt.Errorf("$%s: %w", IdentityEnv, err)
			}
			return ids, nil
		}
		return nil, nil
	}
	ids, err := crypt.ReadIdentityFiles(files...)
	if err != nil {
		return nil, fmt.Errorf("--identity: %w", err)
	}
	return ids, nil
}

// needIdentity is the refusal for an encrypted backup without a key.
func needIdentity(name string, b *ebv1.Backup, alternative string) error {
	return fmt.Errorf("backup %q is age-encrypted (to %d recipient(s)) and no identity was given: pass --identity KEYFILE, or set %s=KEYFILE, with a secret key of one of its recipients%s",
		name, len(b.GetAgeRecipients()), IdentityEnv, alternative)
}

// identityError turns the decryption refusals into sentences that say
// what to do.
func identityError(name string, b *ebv1.Backup, err error) error {
	switch {
	case errors.Is(err, crypt.ErrIdentityRequired):
		return needIdentity(name, b, "")
	case errors.Is(err, crypt.ErrNoMatchingIdentity):
		return fmt.Errorf("backup %q: none of the identities given is one of its recipients (%d: see `kubectl etcdbackup get %s -o yaml`); pass the right --identity", name, len(b.GetAgeRecipients()), name)
	}
	return err
}

// errPlainStopped ends the download goroutine when the plain side stops.
var errPlainStopped = errors.New("the plain snapshot stopped being written")

// downloadPlain streams backup b through conn and writes its plain etcd
// snapshot to w (snapshot.WritePlain: decrypt, decompress, etcd's trailer
// and the plain SHA-256), while client.Download verifies the stored
// SHA-256 and re-opens a broken stream from where it was. Both checks must
// pass. Nothing is buffered beyond a pipe and the decoders' windows.
func downloadPlain(ctx context.Context, conn *Connection, b *ebv1.Backup, w io.Writer, ids []agelib.Identity, progress func(int64)) (snapshot.Plain, error) {
	if b.GetCompression() == ebv1.CompressionNone && b.GetEncryption() == ebv1.EncryptionNone {
		return downloadSnapshot(ctx, conn, b, w, progress)
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	pr, pw := io.Pipe()
	done := make(chan error, 1)
	go func() {
		_, err := conn.Download(ctx, pw, client.DownloadRequest{
			Name: b.GetName(), Location: b.GetLocation(),
			OnHeader: func(h *ebv1.Backup) error {
				if h.GetSha256() != b.GetSha256() {
					return fmt.Errorf("backup %q changed on the server since it was looked up; download it again", b.GetName())
				}
				return nil
			},
			Progress: progress,
		})
		pw.CloseWithError(err) // nil: io.EOF for the reader
		done <- err
	}()
	p, err := snapshot.WritePlain(ctx, w, pr, snapshot.FormOf(b), ids, nil)
	switch {
	case err == nil:
		// The decoders may stop before the last stored byte; the stored
		// SHA-256 covers them all.
		_, err = io.Copy(io.Discard, pr)
	case errors.Is(err, snapshot.ErrCorrupt):
		// Read the rest: a stored SHA-256 that does not match either says
		// more precisely what broke (storage or transfer, not the content).
		_, _ = io.Copy(io.Discard, pr)
	}
	pr.CloseWithError(errPlainStopped)
	dlErr := <-done
	switch {
	case errors.Is(dlErr, client.ErrCorrupt):
		return p, fmt.Errorf("%w; nothing was kept (if it fails again the stored backup is damaged: `kubectl etcdbackup verify %s`)", dlErr, b.GetName())
	case dlErr != nil && !errors.Is(dlErr, errPlainStopped) && !errors.Is(dlErr, io.ErrClosedPipe):
		// The transfer's own failure explains the rest.
		return p, conn.explain("download "+quote(b.GetName()), dlErr)
	case errors.Is(err, snapshot.ErrCorrupt):
		return p, fmt.Errorf("backup %q: %w; do not restore it", b.GetName(), err)
	case err != nil:
		return p, identityError(b.GetName(), b, err)
	}
	return p, nil
}
