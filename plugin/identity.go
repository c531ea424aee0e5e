package plugin

import (
	"errors"
	"fmt"
	"os"

	agelib "filippo.io/age"
	"github.com/spf13/cobra"

	ebv1 "github.com/kubectl-etcdbackup/kubectl-etcdbackup/api/etcdbackup/v1"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/crypt"
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

// passIdentity is what to do about an encrypted backup or file without a
// key, the same wherever it is refused.
const passIdentity = "pass --identity KEYFILE, or set " + IdentityEnv + "=KEYFILE, with a secret key of one of its recipients"

// needIdentity is the refusal for an encrypted backup without a key.
func needIdentity(name string, b *ebv1.Backup, alternative string) error {
	return fmt.Errorf("backup %q is age-encrypted (to %d recipient(s)) and no identity was given: %s%s",
		name, len(b.GetAgeRecipients()), passIdentity, alternative)
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
