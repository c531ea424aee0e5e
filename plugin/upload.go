package plugin

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/spf13/cobra"
	"k8s.io/apimachinery/pkg/util/validation"

	ebv1 "github.com/kubectl-etcdbackup/kubectl-etcdbackup/api/etcdbackup/v1"
)

// UploadOptions are the options of `kubectl etcdbackup upload`.
type UploadOptions struct {
	*GlobalOptions
	PrintFlags *PrintFlags
	File       string
	Name       string
	Labels     map[string]string
}

// NewCmdUpload returns the upload command.
func NewCmdUpload(g *GlobalOptions) *cobra.Command {
	o := &UploadOptions{GlobalOptions: g, PrintFlags: newPrintFlags(tableFormats)}
	cmd := &cobra.Command{
		Use:   "upload FILE",
		Short: "Upload an etcd snapshot file as a new backup",
		Long: `Upload streams FILE to the server, hashing it on the way; the server stores it
only if every byte arrived with the same SHA-256. Backups are immutable: a
name that exists is refused.`,
		Example: examples(`
# Upload snapshot.db as the backup "snapshot.db"
kubectl etcdbackup upload snapshot.db

# Upload a snapshot under another name, with a label
kubectl etcdbackup upload /var/backups/etcd.db --name before-upgrade --labels reason=upgrade`),
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := o.Complete(cmd, args); err != nil {
				return err
			}
			if err := o.Validate(); err != nil {
				return usageError(err)
			}
			return o.Run(cmd.Context())
		},
	}
	cmd.Flags().StringVar(&o.Name, "name", "", "name of the backup (default: the file's name, lower-cased)")
	cmd.Flags().StringToStringVar(&o.Labels, "labels", nil, "labels to store with the backup, as key=value pairs")
	o.PrintFlags.AddFlags(cmd, "output format of the stored backup")
	return cmd
}

// Complete fills in the name from the file when not given.
func (o *UploadOptions) Complete(_ *cobra.Command, args []string) error {
	o.File = args[0]
	if o.Name == "" {
		o.Name = strings.ToLower(filepath.Base(o.File))
	}
	return nil
}

// Validate checks the flags before any byte is sent.
func (o *UploadOptions) Validate() error {
	if errs := validation.IsDNS1123Subdomain(o.Name); len(errs) > 0 {
		return fmt.Errorf("backup name %q is invalid (%s); pass a valid one with --name", o.Name, strings.Join(errs, "; "))
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
	h := &ebv1.UploadHeader{
		Name:     o.Name,
		Location: o.Location,
		Labels:   o.Labels,
		Source:   &ebv1.BackupSource{Kind: "upload", Description: truncate(filepath.Base(o.File), 256)},
	}
	if st.Mode().IsRegular() {
		size := st.Size()
		h.ExpectedSize = &size
	}
	conn, err := o.Connect(ctx)
	if err != nil {
		return err
	}
	defer conn.Close()

	bar := newProgress(o.ErrOut, st.Size(), "uploading "+o.Name)
	b, err := conn.Upload(ctx, f, h, bar.Set)
	bar.Finish(err == nil)
	if err != nil {
		if errors.Is(ctx.Err(), context.Canceled) {
			return fmt.Errorf("upload of %q interrupted; nothing was stored", o.Name)
		}
		return conn.explain("upload "+quote(o.Name), err)
	}
	if !o.PrintFlags.Human() {
		return printBackups(o.Out, o.PrintFlags, []*ebv1.Backup{b}, true)
	}
	fmt.Fprintf(o.Out, "backup %q uploaded: %d bytes, sha256 %s\n", b.GetName(), b.GetSize(), b.GetSha256())
	return nil
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n]
}
