package plugin

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"

	agelib "filippo.io/age"
	"github.com/spf13/cobra"

	ebv1 "github.com/kubectl-etcdbackup/kubectl-etcdbackup/api/etcdbackup/v1"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/snapshot"
)

// VerifyOptions are the options of `kubectl etcdbackup verify`.
type VerifyOptions struct {
	*GlobalOptions
	PrintFlags *PrintFlags
	Name       string
	// IdentityFiles let an encrypted backup be checked on this machine.
	IdentityFiles []string
}

// NewCmdVerify returns the verify command.
func NewCmdVerify(g *GlobalOptions) *cobra.Command {
	o := &VerifyOptions{GlobalOptions: g, PrintFlags: newPrintFlags(plainFormats)}
	cmd := &cobra.Command{
		Use:   "verify NAME",
		Short: "Check a stored backup end to end on the server, without downloading it",
		Long: `verify has the server re-read a backup and check its stored SHA-256, etcd's own
SHA-256 trailer and the consistency of the etcd database inside, then prints
the revision, key count and size etcd reports. A corrupt backup is an error.

The server holds no key to an age-encrypted backup: it checks the stored
SHA-256 and the age header, and says so. With --identity the whole check runs
on this machine instead: the backup streams through the tunnel, is decrypted,
decompressed and checked (etcd's trailer, the recorded SHA-256, bolt's
consistency) in a temporary file that is removed afterwards.`,
		Example: examples(`
# Check a backup on the server: SHA-256, etcd's trailer and database
kubectl etcdbackup verify etcd-2026-01-31

# The same, with etcd's figures as JSON for a script
kubectl etcdbackup verify etcd-2026-01-31 -o json

# Check an encrypted backup end to end, decrypting it on this machine
kubectl etcdbackup verify etcd-2026-01-31 --identity ~/.config/etcdbackup/key.txt`),
		Args:              cobra.ExactArgs(1),
		ValidArgsFunction: completeBackupNames(g, 1),
		RunE:              runE(o),
	}
	o.PrintFlags.AddFlags(cmd, "output format")
	addIdentityFlag(cmd, &o.IdentityFiles, "an encrypted backup and check it here")
	addStorageConfigFlag(cmd, g)
	return cmd
}

// Complete takes the backup's name from the arguments.
func (o *VerifyOptions) Complete(_ *cobra.Command, args []string) error {
	o.Name = backupName(args[0])
	return nil
}

// Validate checks the flags.
func (o *VerifyOptions) Validate() error { return o.PrintFlags.Validate() }

// Run verifies the backup.
func (o *VerifyOptions) Run(ctx context.Context) error {
	ids, err := loadIdentities(o.IdentityFiles)
	if err != nil {
		return err
	}
	conn, err := o.Connect(ctx)
	if err != nil {
		return err
	}
	defer conn.Close()
	location, err := o.resolveLocation(ctx, conn, "verify "+quote(o.Name), o.Name)
	if err != nil {
		return err
	}
	r, err := conn.Backups.VerifyBackup(ctx, &ebv1.VerifyBackupRequest{Name: o.Name, Location: location})
	if err != nil {
		return conn.explain("verify "+quote(o.Name), err)
	}
	if r.GetStoredOnly() && len(ids) > 0 {
		if r, err = o.verifyHere(ctx, conn, r.GetBackup(), ids); err != nil {
			return err
		}
	}
	kv, err := o.verifyKit(ctx, conn, location, ids)
	if err != nil {
		return err
	}
	obj := &VerifyResult{
		TypeMeta: typeMeta("BackupVerification"),
		Metadata: ObjectMeta{Name: o.Name},
		Status: VerifyResultStatus{
			Intact: !r.GetStoredOnly(), StoredOnly: r.GetStoredOnly(), Message: r.GetMessage(),
			Location: r.GetBackup().GetLocation(), SHA256: r.GetBackup().GetSha256(),
			Revision: r.GetRevision(), TotalKeys: r.GetTotalKeys(), TotalSizeBytes: r.GetTotalSize(),
			Hash: r.GetHash(), StorageVersion: r.GetStorageVersion(), Kit: kv,
		},
	}
	return o.PrintFlags.Print(o.Out, obj, func(w io.Writer) error {
		if kv != nil {
			fmt.Fprintf(w, "recovery kit %q: %s\n", kv.Name, kv.Message)
		}
		if r.GetStoredOnly() {
			fmt.Fprintf(w, "backup %q: stored bytes intact (sha256 %s), age-encrypted\n", o.Name, r.GetBackup().GetSha256())
			_, err := fmt.Fprintf(w, "%s\n", r.GetMessage())
			return err
		}
		fmt.Fprintf(w, "backup %q is intact: sha256 %s, etcd trailer and database consistent\n", o.Name, r.GetBackup().GetSha256())
		_, err := fmt.Fprintf(w, "revision %d, %d keys, database %d bytes, etcd hash %d\n", r.GetRevision(), r.GetTotalKeys(), r.GetTotalSize(), r.GetHash())
		return err
	})
}

// verifyKit checks the backup's recovery kit, if it has one: its stored
// bytes and age header on the server, and with identities, every file
// against the index sealed with it, here.
func (o *VerifyOptions) verifyKit(ctx context.Context, conn *Connection, location string, ids []agelib.Identity) (*KitVerification, error) {
	got, err := conn.Backups.GetBackup(ctx, &ebv1.GetBackupRequest{Name: o.Name, Location: location})
	if err != nil {
		return nil, conn.explain("verify "+quote(o.Name), err)
	}
	b := got.GetBackup()
	k := b.GetKit()
	if k == nil {
		return nil, nil
	}
	kr, err := conn.Backups.VerifyBackup(ctx, &ebv1.VerifyBackupRequest{Name: k.GetName(), Location: location})
	if err != nil {
		return nil, conn.explain("verify the recovery kit of "+quote(o.Name), err)
	}
	if kr.GetBackup().GetSha256() != k.GetSha256() {
		return nil, withCode(ExitFailed, fmt.Errorf("verify %q: the stored recovery kit is not the one the backup records (sha256 %s, recorded %s)", o.Name, kr.GetBackup().GetSha256(), k.GetSha256()))
	}
	v := &KitVerification{Name: k.GetName(), SHA256: k.GetSha256(), Entries: k.GetEntries(), StoredOnly: true,
		Message: fmt.Sprintf("stored bytes intact (sha256 %s), age-encrypted to %d recipient(s); pass --identity to open it here and check every file", k.GetSha256(), len(k.GetAgeRecipients()))}
	if len(ids) == 0 {
		return v, nil
	}
	c, err := fetchKit(ctx, conn, b, ids)
	if err != nil {
		return nil, err
	}
	v.StoredOnly, v.Opened = false, true
	v.Message = fmt.Sprintf("opened here: %d entries, every file as collected on %s (etcd %s, Kubernetes %s)",
		len(c.Index.Files), orNone(c.Index.Node), orNone(c.Index.Versions.Etcd), orNone(c.Index.Versions.Kubernetes))
	return v, nil
}

// verifyHere checks an encrypted backup on this machine: bolt needs random
// access, so the plain snapshot goes to a temporary file, removed at the end.
func (o *VerifyOptions) verifyHere(ctx context.Context, conn *Connection, b *ebv1.Backup, ids []agelib.Identity) (*ebv1.VerifyBackupResponse, error) {
	dir, err := os.MkdirTemp("", "etcdbackup-verify-")
	if err != nil {
		return nil, fmt.Errorf("verify: %w", err)
	}
	defer os.RemoveAll(dir)
	path := filepath.Join(dir, "snapshot.db")
	err = fetchToFile(ctx, conn, b, path, ids, o.ErrOut, "verifying")
	if errors.Is(err, snapshot.ErrCorrupt) {
		return nil, withCode(ExitFailed, fmt.Errorf("verify %q: backup %q is corrupt: %w; do not restore it", o.Name, o.Name, err))
	}
	if err != nil {
		return nil, err
	}
	// fetchToFile verified etcd's trailer as the file was written.
	st, err := snapshot.CheckDatabase(path)
	if err != nil {
		return nil, withCode(ExitFailed, fmt.Errorf("verify %q: backup %q is corrupt: %w; do not restore it", o.Name, o.Name, err))
	}
	return &ebv1.VerifyBackupResponse{
		Backup: b, Revision: st.Revision, TotalKeys: int64(st.TotalKey), TotalSize: st.TotalSize, Hash: st.Hash, StorageVersion: st.Version,
	}, nil
}
