package plugin

import (
	"context"
	"errors"
	"fmt"
	"os"

	"github.com/spf13/cobra"

	ebv1 "github.com/kubectl-etcdbackup/kubectl-etcdbackup/api/etcdbackup/v1"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/client"
)

// DownloadOptions are the options of `kubectl etcdbackup download`.
type DownloadOptions struct {
	*GlobalOptions
	Name      string
	File      string
	Overwrite bool
}

// NewCmdDownload returns the download command.
func NewCmdDownload(g *GlobalOptions) *cobra.Command {
	o := &DownloadOptions{GlobalOptions: g}
	cmd := &cobra.Command{
		Use:   "download NAME",
		Short: "Download a backup to a file or to standard output",
		Long: `Download writes the backup to FILE.part, resuming from an existing FILE.part
(an earlier interrupted download) and re-connecting when the connection
breaks; once the whole file matches the backup's SHA-256 it is renamed to
FILE. With -o - the backup is written to standard output.`,
		Example: examples(`
# Download a backup to the file etcd-2026-01-31 in the current directory
kubectl etcdbackup download etcd-2026-01-31

# Download a backup to /tmp/snapshot.db
kubectl etcdbackup download etcd-2026-01-31 -o /tmp/snapshot.db

# Stream a backup to standard output, here into etcdutl
kubectl etcdbackup download etcd-2026-01-31 -o - | etcdutl snapshot status /dev/stdin`),
		Args:              cobra.ExactArgs(1),
		ValidArgsFunction: completeBackupNames(g, 1),
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
	cmd.Flags().StringVarP(&o.File, "output", "o", "", "file to write, or - for standard output (default: NAME in the current directory)")
	cmd.Flags().BoolVar(&o.Overwrite, "overwrite", false, "replace FILE if it already exists")
	return cmd
}

// Complete defaults the output file to the backup's name.
func (o *DownloadOptions) Complete(_ *cobra.Command, args []string) error {
	o.Name = backupName(args[0])
	if o.File == "" {
		o.File = o.Name
	}
	return nil
}

// Validate has nothing to check without I/O: whether FILE exists is
// asked in Run, just before the download.
func (o *DownloadOptions) Validate() error { return nil }

// Run downloads the backup. An existing FILE is refused, unless
// --overwrite, before the server is contacted.
func (o *DownloadOptions) Run(ctx context.Context) error {
	if o.File != "-" && !o.Overwrite {
		if _, err := os.Stat(o.File); err == nil {
			return fmt.Errorf("%s already exists; pass --overwrite to replace it or -o to choose another file", o.File)
		}
	}
	conn, err := o.Connect(ctx)
	if err != nil {
		return err
	}
	defer conn.Close()
	// Everything below names the location that holds the backup.
	if o.Location, err = o.resolveLocation(ctx, conn, "download "+quote(o.Name), o.Name); err != nil {
		return err
	}
	if o.File == "-" {
		_, err := conn.Download(ctx, o.Out, client.DownloadRequest{Name: o.Name, Location: o.Location})
		return conn.explain("download "+quote(o.Name), err)
	}
	return o.toFile(ctx, conn)
}

func (o *DownloadOptions) toFile(ctx context.Context, conn *Connection) error {
	var bar *progress
	b, err := conn.DownloadFile(ctx, client.FileDownload{
		Path:    o.File,
		Replace: o.Overwrite,
		OnResume: func(part string, offset int64) {
			fmt.Fprintf(o.ErrOut, "resuming %s from byte %d\n", part, offset)
		},
		DownloadRequest: client.DownloadRequest{
			Name: o.Name, Location: o.Location,
			OnHeader: func(b *ebv1.Backup) error {
				bar = newProgress(o.ErrOut, b.GetSize(), "downloading "+o.Name)
				return nil
			},
			Progress: func(n int64) { bar.Set(n) },
		},
	})
	if bar != nil {
		bar.Finish(err == nil)
	}
	part := o.File + ".part"
	switch {
	case err == nil:
		fmt.Fprintf(o.ErrOut, "backup %q downloaded to %s (%d bytes, sha256 %s verified)\n", o.Name, o.File, b.GetSize(), b.GetSha256())
		return nil
	case errors.Is(err, client.ErrCorrupt):
		return fmt.Errorf("%w; %s was removed, run the download again (if it fails again the stored backup is corrupt: check it with `kubectl etcdbackup get %s`)", err, part, o.Name)
	case errors.Is(err, client.ErrExists):
		return fmt.Errorf("%s appeared while downloading; the download is complete in %s", o.File, part)
	case ctx.Err() != nil:
		return fmt.Errorf("download of %q interrupted at byte %d; run the same command again to resume from %s", o.Name, partSize(part), part)
	}
	return conn.explain("download "+quote(o.Name), err)
}

func partSize(path string) int64 {
	st, err := os.Stat(path)
	if err != nil {
		return 0
	}
	return st.Size()
}
