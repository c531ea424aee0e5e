package plugin

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"

	"github.com/spf13/cobra"
	"k8s.io/apimachinery/pkg/util/validation"

	ebv1 "github.com/kubectl-etcdbackup/kubectl-etcdbackup/api/etcdbackup/v1"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/client"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/crypt"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/snapshot"
)

// UploadOptions are the options of `kubectl etcdbackup upload`.
type UploadOptions struct {
	*GlobalOptions
	PrintFlags *PrintFlags
	File       string
	Name       string
	Labels     map[string]string
	// EncryptTo and EncryptToFiles name the age recipients to encrypt to.
	EncryptTo      []string
	EncryptToFiles []string
}

// NewCmdUpload returns the upload command.
func NewCmdUpload(g *GlobalOptions) *cobra.Command {
	o := &UploadOptions{GlobalOptions: g, PrintFlags: newPrintFlags(tableFormats)}
	cmd := &cobra.Command{
		Use:   "upload FILE",
		Short: "Upload an etcd snapshot file as a new backup",
		Long: `Upload first checks that FILE is an etcd snapshot, as etcdutl does: etcd's
SHA-256 trailer must match and the database must pass bolt's consistency
check. Anything else is refused before a byte is sent. The backup records the
snapshot's revision, key count and hash (list -o wide, describe).

It then streams FILE to the server, hashing it on the way; the server checks
etcd's trailer again and stores it only if every byte arrived with the same
SHA-256. Backups are immutable: a
name that exists is refused. When the connection breaks before the server
stored the backup (it keeps nothing then), the upload starts again from the
beginning, for up to --retry-timeout without getting further.

With --encrypt-to (or --encrypt-to-file) FILE must be a plain etcd snapshot:
it is checked (etcd's trailer) and encrypted with age on this machine, so the
server and the storage only ever see ciphertext; download and restore it
with --identity and a secret key of one of the recipients.`,
		Example: examples(`
# Upload snapshot.db as the backup "snapshot.db"
kubectl etcdbackup upload snapshot.db

# Upload a snapshot under another name, with a label
kubectl etcdbackup upload /var/backups/etcd.db --name before-upgrade --labels reason=upgrade

# Encrypt a snapshot to the team's key and an offline break-glass key
kubectl etcdbackup upload snapshot.db --encrypt-to age1ql3z7hjy54pw3hyww5ayyfg7zqgvc7w3j2elw8zmrj2kg5sfn9aqmcac8p --encrypt-to-file break-glass.pub`),
		Args: cobra.ExactArgs(1),
		RunE: runE(o),
	}
	cmd.Flags().StringVar(&o.Name, "name", "", "name of the backup (default: the file's name, lower-cased)")
	cmd.Flags().StringToStringVar(&o.Labels, "labels", nil, "labels to store with the backup, as key=value pairs")
	cmd.Flags().StringArrayVar(&o.EncryptTo, "encrypt-to", nil, "age public key (age1...) to encrypt the snapshot to before it leaves this machine; repeatable")
	cmd.Flags().StringArrayVar(&o.EncryptToFiles, "encrypt-to-file", nil, "`FILE` of age public keys, one per line (# comments), to encrypt to; repeatable")
	o.PrintFlags.AddFlags(cmd, "output format of the stored backup")
	return cmd
}

// Complete fills in the name from the file when not given.
func (o *UploadOptions) Complete(_ *cobra.Command, args []string) error {
	o.File = args[0]
	if o.Name == "" {
		o.Name = strings.ToLower(filepath.Base(o.File))
	}
	for _, f := range o.EncryptToFiles {
		keys, err := crypt.ReadRecipientsFile(f)
		if err != nil {
			return fmt.Errorf("--encrypt-to-file: %w", err)
		}
		o.EncryptTo = append(o.EncryptTo, keys...)
	}
	return nil
}

// Validate checks the flags before any byte is sent.
func (o *UploadOptions) Validate() error {
	if errs := validation.IsDNS1123Subdomain(o.Name); len(errs) > 0 {
		return fmt.Errorf("backup name %q is invalid (%s); pass a valid one with --name", o.Name, strings.Join(errs, "; "))
	}
	if k, ok := ebv1.ReservedLabel(o.Labels); ok {
		return fmt.Errorf("--labels: %q is under %s, which only the server writes (it marks scheduled backups); choose another key", k, ebv1.ReservedLabelPrefix)
	}
	if len(o.EncryptTo) > 0 {
		if _, err := crypt.ParseRecipients(o.EncryptTo); err != nil {
			return fmt.Errorf("--encrypt-to: %w", err)
		}
	}
	return o.PrintFlags.Validate()
}

// Run uploads the file.
func (o *UploadOptions) Run(ctx context.Context) error {
	f, err := os.Open(o.File)
	if err != nil {
		return fmt.Errorf("upload: %w", err)
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return fmt.Errorf("upload: %w", err)
	}
	if st.IsDir() {
		return fmt.Errorf("upload: %s is a directory; give the snapshot file", o.File)
	}
	if !st.Mode().IsRegular() {
		return fmt.Errorf("upload: %s is not a regular file; upload checks the snapshot's database before sending it, which needs a file (save the stream to one first)", o.File)
	}
	status, err := checkUploadFile(o.File)
	if err != nil {
		return err
	}
	size := st.Size()
	facts := snapshot.Facts(status)
	facts.Version, facts.DbSize = status.Version, status.TotalSize
	ks, err := snapshot.ReadKeyspace(o.File, "", true)
	if err != nil {
		return fmt.Errorf("upload: %s: %w; nothing was sent", o.File, err)
	}
	facts.KeyspaceKeys, facts.HashKv, facts.CompactRevision, facts.Keyspace = ks.Keys, ks.HashKV, ks.CompactRevision, true
	h := &ebv1.UploadHeader{
		Name:         o.Name,
		Location:     o.Location,
		Labels:       o.Labels,
		Source:       &ebv1.BackupSource{Kind: ebv1.SourceUpload, Description: truncate(filepath.Base(o.File), 256)},
		ExpectedSize: &size,
		Etcd:         facts,
	}
	conn, err := o.Connect(ctx)
	if err != nil {
		return err
	}
	defer conn.Close()

	bar := newProgress(o.ErrOut, st.Size(), "uploading "+o.Name)
	var b *ebv1.Backup
	if len(o.EncryptTo) > 0 {
		b, err = o.uploadEncrypted(ctx, conn, f, h, bar.Set)
	} else {
		b, err = conn.Upload(ctx, f, h, bar.Set)
	}
	bar.Finish(err == nil)
	var encErr *encryptInputError
	if errors.As(err, &encErr) {
		return encErr.err
	}
	if err != nil {
		if errors.Is(ctx.Err(), context.Canceled) {
			return fmt.Errorf("upload of %q interrupted; nothing was stored", o.Name)
		}
		return conn.explain("upload "+quote(o.Name), err)
	}
	if !o.PrintFlags.Human() {
		return printBackups(o.Out, o.PrintFlags, []*ebv1.Backup{b}, true)
	}
	if b.GetEncryption() != ebv1.EncryptionNone {
		fmt.Fprintf(o.Out, "backup %q uploaded: %d bytes, sha256 %s, age-encrypted to %d recipient(s) (plain snapshot %d bytes, sha256 %s)\n",
			b.GetName(), b.GetSize(), b.GetSha256(), len(b.GetAgeRecipients()), b.GetRawSize(), b.GetRawSha256())
		return nil
	}
	fmt.Fprintf(o.Out, "backup %q uploaded: %d bytes, sha256 %s\n", b.GetName(), b.GetSize(), b.GetSha256())
	return nil
}

// checkUploadFile refuses, before anything is sent, a file that is not a
// plain etcd snapshot: etcd's SHA-256 trailer must match and bolt must
// open the database. Its status (revision, keys, hash) is what the backup
// records. A backup that cannot be restored is found out now, not on the
// day it is needed.
func checkUploadFile(path string) (snapshot.Status, error) {
	form, err := snapshot.SniffForm(path)
	if err != nil {
		return snapshot.Status{}, fmt.Errorf("upload: %w", err)
	}
	switch {
	case form.Encryption != ebv1.EncryptionNone:
		return snapshot.Status{}, fmt.Errorf("upload: %s is age-encrypted, not a plain etcd snapshot; nothing was sent. Decrypt it first (`age -d -i KEY`), then upload the plain snapshot, with --encrypt-to to store it encrypted", path)
	case form.Compression != ebv1.CompressionNone:
		return snapshot.Status{}, fmt.Errorf("upload: %s is %s-compressed (a `download --raw` file?), not a plain etcd snapshot; nothing was sent. Decompress it first (`zstd -d`), or download the backup without --raw", path, form.Compression)
	}
	st, err := snapshot.Check(path)
	if err != nil {
		return snapshot.Status{}, fmt.Errorf("upload: %s is not an etcd snapshot: %w; nothing was sent. Upload the file `etcdutl snapshot save` or `kubectl etcdbackup download` writes", path, err)
	}
	return st, nil
}

// encryptInputError is a refusal of the file to encrypt, not the server's.
type encryptInputError struct{ err error }

func (e *encryptInputError) Error() string { return e.err.Error() }

// uploadEncrypted checks that f is a plain etcd snapshot while it streams
// (its size and SHA-256 become the backup's raw ones, checked again after
// every decryption) and encrypts it to o.EncryptTo on the way out.
func (o *UploadOptions) uploadEncrypted(ctx context.Context, conn *Connection, f *os.File, h *ebv1.UploadHeader, progress func(int64)) (*ebv1.Backup, error) {
	recipients, err := crypt.ParseRecipients(o.EncryptTo)
	if err != nil {
		return nil, err
	}
	// open reads the file from its start, again for each retry after
	// the connection broke; each attempt is a new encryption.
	var plain *snapshot.Verifier
	open := func() (io.Reader, error) {
		if _, err := f.Seek(0, io.SeekStart); err != nil {
			return nil, fmt.Errorf("read %s again: %w", o.File, err)
		}
		plain = snapshot.NewVerifier(f, snapshot.VerifierOptions{HashWhole: true, Progress: progress})
		return crypt.Encrypt(ctx, plain, recipients)
	}
	body, err := open()
	if err != nil {
		return nil, err
	}
	h.ExpectedSize = nil // the ciphertext is longer than the file
	h.Encryption = ebv1.EncryptionAge
	h.AgeRecipients = o.EncryptTo
	b, err := conn.UploadWith(ctx, body, client.UploadRequest{
		Header: h,
		Raw:    func() (int64, string) { return plain.Size(), plain.SHA256() },
		Rewind: open,
	})
	if verr := plain.Err(); verr != nil && ctx.Err() == nil {
		return nil, &encryptInputError{fmt.Errorf("upload: %s is not a whole etcd snapshot, nothing was stored: %w", o.File, verr)}
	}
	return b, err
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n]
}
