package plugin

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"io/fs"
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
		Example: `  kubectl etcdbackup download etcd-2026-01-31
  kubectl etcdbackup download etcd-2026-01-31 -o /tmp/snapshot.db
  kubectl etcdbackup download etcd-2026-01-31 -o - | etcdutl snapshot status /dev/stdin`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			o.Complete(args)
			if err := o.Validate(); err != nil {
				return err
			}
			return o.Run(cmd.Context())
		},
	}
	cmd.Flags().StringVarP(&o.File, "output", "o", "", "file to write, or - for standard output (default: NAME in the current directory)")
	cmd.Flags().BoolVar(&o.Overwrite, "overwrite", false, "replace FILE if it already exists")
	return cmd
}

// Complete defaults the output file to the backup's name.
func (o *DownloadOptions) Complete(args []string) {
	o.Name = args[0]
	if o.File == "" {
		o.File = o.Name
	}
}

// Validate refuses to replace an existing file unless asked.
func (o *DownloadOptions) Validate() error {
	if o.File == "-" || o.Overwrite {
		return nil
	}
	if _, err := os.Stat(o.File); err == nil {
		return fmt.Errorf("%s already exists; pass --overwrite to replace it or -o to choose another file", o.File)
	}
	return nil
}

// Run downloads the backup.
func (o *DownloadOptions) Run(ctx context.Context) error {
	conn, err := o.Connect(ctx)
	if err != nil {
		return err
	}
	defer conn.Close()
	if o.File == "-" {
		_, err := conn.Download(ctx, o.Out, client.DownloadRequest{Name: o.Name, Location: o.Location})
		return conn.explain("download "+quote(o.Name), err)
	}
	return o.toFile(ctx, conn)
}

func (o *DownloadOptions) toFile(ctx context.Context, conn *Connection) error {
	part := o.File + ".part"
	f, err := os.OpenFile(part, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return fmt.Errorf("download %q: %w", o.Name, err)
	}
	defer f.Close()
	// Resume: hash what an earlier attempt wrote, continue after it.
	prefix := sha256.New()
	offset, err := io.Copy(prefix, f)
	if err != nil {
		return fmt.Errorf("download %q: read %s: %w", o.Name, part, err)
	}
	if offset > 0 {
		fmt.Fprintf(o.ErrOut, "resuming %s from byte %d\n", part, offset)
	}
	var bar *progress
	b, err := conn.Download(ctx, f, client.DownloadRequest{
		Name: o.Name, Location: o.Location, Offset: offset, Prefix: prefix,
		OnHeader: func(b *ebv1.Backup) error {
			bar = newProgress(o.ErrOut, b.GetSize(), "downloading "+o.Name)
			bar.Set(offset)
			return nil
		},
		Progress: func(n int64) { bar.Set(n) },
	})
	if bar != nil {
		bar.Finish(err == nil)
	}
	if errors.Is(err, client.ErrCorrupt) {
		// The bytes on disk are proven wrong: resuming from them again
		// cannot help.
		f.Close()
		os.Remove(part)
		return fmt.Errorf("%w; %s was removed, run the download again (if it fails again the stored backup is corrupt: check it with `kubectl etcdbackup get %s`)", err, part, o.Name)
	}
	if err != nil && partSize(part) == 0 {
		// Nothing was written: leave no empty .part behind.
		f.Close()
		os.Remove(part)
	}
	if err != nil {
		if ctx.Err() != nil {
			return fmt.Errorf("download of %q interrupted at byte %d; run the same command again to resume from %s", o.Name, partSize(part), part)
		}
		return conn.explain("download "+quote(o.Name), err)
	}
	if err := f.Sync(); err != nil {
		return fmt.Errorf("download %q: sync %s: %w", o.Name, part, err)
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("download %q: close %s: %w", o.Name, part, err)
	}
	if !o.Overwrite {
		if _, err := os.Stat(o.File); !errors.Is(err, fs.ErrNotExist) {
			return fmt.Errorf("%s appeared while downloading; the download is complete in %s", o.File, part)
		}
	}
	if err := os.Rename(part, o.File); err != nil {
		return fmt.Errorf("download %q: %w", o.Name, err)
	}
	fmt.Fprintf(o.ErrOut, "backup %q downloaded to %s (%d bytes, sha256 %s verified)\n", o.Name, o.File, b.GetSize(), b.GetSha256())
	return nil
}

func partSize(path string) int64 {
	st, err := os.Stat(path)
	if err != nil {
		return 0
	}
	return st.Size()
}
