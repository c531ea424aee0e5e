package plugin

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"

	agelib "filippo.io/age"
	"github.com/spf13/cobra"
	"google.golang.org/grpc"

	ebv1 "github.com/kubectl-etcdbackup/kubectl-etcdbackup/api/etcdbackup/v1"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/client"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/fetch"
)

// DownloadOptions are the options of `kubectl etcdbackup download`.
type DownloadOptions struct {
	*GlobalOptions
	Name      string
	File      string
	Overwrite bool
	// Raw writes the stored bytes unchanged (resumable).
	Raw bool
	// IdentityFiles decrypt an encrypted backup.
	IdentityFiles []string
	// Parallel is how many ranges are fetched at once, each over its own
	// port-forward; 0 chooses by size (client.AutoParallel).
	Parallel int
}

// NewCmdDownload returns the download command.
func NewCmdDownload(g *GlobalOptions) *cobra.Command {
	o := &DownloadOptions{GlobalOptions: g}
	cmd := &cobra.Command{
		Use:   "download NAME",
		Short: "Download a backup to a file or to standard output",
		Long: `Download writes the backup as a plain etcd snapshot, the file etcdutl and
etcd's restore read: it decrypts an age-encrypted backup with --identity,
undoes compression, and checks etcd's own SHA-256 trailer and the snapshot's
recorded SHA-256, streaming, into FILE.part; only a snapshot that passed every
check is renamed to FILE. A failed or refused download leaves no file. A
dropped connection (a tunnel broken, the server pod replaced) is re-opened
from the byte it reached, for up to --retry-timeout without a byte arriving;
a plain download that is interrupted starts over when run again.

With --raw the backup is written as stored (compressed and encrypted as it
is), resuming from an existing FILE.part, and checked against the stored
SHA-256 only: for copying backups elsewhere, or for the age CLI
(docs/encryption.md).

A large backup is fetched over --parallel port-forwards at once, each taking
32 MiB pieces in turn, written in place into FILE.part and still checked
against the whole backup's SHA-256 as the pieces arrive (by default one
stream up to 64 MiB, four above; --parallel 1 forces one stream; where one
link limits every stream, one stream is as fast). Parallel ranges need the stored bytes
to be the plain snapshot (--raw, or a backup neither compressed nor
encrypted); an interrupted --raw download records its ranges in
FILE.part.ranges and the next run continues them.

With -o - the snapshot is written to standard output as it is checked (a
re-opened connection continues at the byte it reached, so nothing is written
twice): a failed check exits non-zero after part of it was written.`,
		Example: examples(`
# Download a backup to the file etcd-2026-01-31 in the current directory
kubectl etcdbackup download etcd-2026-01-31

# Download a backup as a plain etcd snapshot and show what etcd sees in it
kubectl etcdbackup download etcd-2026-01-31 -o /tmp/snapshot.db
etcdutl snapshot status /tmp/snapshot.db

# Decrypt an encrypted backup with your age key while downloading
kubectl etcdbackup download etcd-2026-01-31 -o /tmp/snapshot.db --identity ~/.config/etcdbackup/key.txt

# Copy the stored (compressed, encrypted) bytes unchanged, resumably
kubectl etcdbackup download etcd-2026-01-31 -o etcd-2026-01-31.age --raw

# Download a large backup over 8 port-forwards at once
kubectl etcdbackup download etcd-2026-01-31 --parallel 8

# Stream the plain snapshot to standard output, here into a checksum
kubectl etcdbackup download etcd-2026-01-31 -o - | sha256sum`),
		Args:              cobra.ExactArgs(1),
		ValidArgsFunction: completeBackupNames(g, 1),
		RunE:              runE(o),
	}
	cmd.Flags().StringVarP(&o.File, "output", "o", "", "file to write, or - for standard output (default: NAME in the current directory)")
	cmd.Flags().BoolVar(&o.Overwrite, "overwrite", false, "replace FILE if it already exists")
	cmd.Flags().BoolVar(&o.Raw, "raw", false, "write the stored bytes unchanged (compressed, encrypted), resuming an interrupted download")
	addStorageConfigFlag(cmd, g)
	cmd.Flags().IntVar(&o.Parallel, "parallel", 0, "ranges to download at once, each over its own port-forward (default: 1 up to 64 MiB, 4 above; not with -o -)")
	addIdentityFlag(cmd, &o.IdentityFiles, "an encrypted backup")
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

// Validate checks that the flags go together; whether FILE exists is
// asked in Run, just before the download.
func (o *DownloadOptions) Validate() error {
	if o.Raw && len(o.IdentityFiles) > 0 {
		return errors.New("--raw writes the stored bytes unchanged, so --identity has nothing to decrypt: drop one of them")
	}
	if o.Parallel < 0 {
		return fmt.Errorf("--parallel %d: must be 1 or more (or 0 to choose by size)", o.Parallel)
	}
	if o.Parallel > 1 && o.File == "-" {
		return fmt.Errorf("--parallel %d: standard output (-o -) is written in order, by one stream; drop --parallel or write to a file", o.Parallel)
	}
	return nil
}

// Run downloads the backup. An existing FILE is refused, unless
// --overwrite, before the server is contacted.
func (o *DownloadOptions) Run(ctx context.Context) error {
	if o.File != "-" && !o.Overwrite {
		if _, err := os.Stat(o.File); err == nil {
			return fmt.Errorf("%s already exists; pass --overwrite to replace it or -o to choose another file", o.File)
		}
	}
	var ids []agelib.Identity
	if !o.Raw {
		var err error
		if ids, err = loadIdentities(o.IdentityFiles); err != nil {
			return err
		}
		if o.File != "-" {
			if _, err := os.Stat(o.File + ".part"); err == nil {
				return fmt.Errorf("%s.part exists, from an earlier --raw download or a killed one; a plain download cannot resume it: pass --raw to resume it, or remove it", o.File)
			}
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
	if o.Raw {
		if o.File == "-" {
			_, err := conn.Download(ctx, o.Out, client.DownloadRequest{Name: o.Name, Location: o.Location})
			return conn.explain("download "+quote(o.Name), err)
		}
		return o.toFile(ctx, conn)
	}
	return o.plain(ctx, conn, ids)
}

// plain writes the plain etcd snapshot to -o, through FILE.part renamed
// once every check passed (fetch.Snapshot), in parallel ranges when the
// stored bytes are the snapshot. An encrypted backup without an identity
// is refused before anything is created or written; a failed download
// keeps nothing.
func (o *DownloadOptions) plain(ctx context.Context, conn *Connection, ids []agelib.Identity) error {
	resp, err := conn.Backups.GetBackup(ctx, &ebv1.GetBackupRequest{Name: o.Name, Location: o.Location})
	if err != nil {
		return conn.explain("download "+quote(o.Name), err)
	}
	b := resp.GetBackup()
	if b.GetPhase() != ebv1.BackupPhase_BACKUP_PHASE_COMPLETED {
		// The download itself says why (still running, failed).
		_, err := conn.Download(ctx, io.Discard, client.DownloadRequest{Name: o.Name, Location: o.Location})
		return conn.explain("download "+quote(o.Name), err)
	}
	if b.GetEncryption() != ebv1.EncryptionNone && len(ids) == 0 {
		return needIdentity(o.Name, b, ", or --raw to download the encrypted bytes as stored")
	}
	if o.File == "-" {
		_, err := fetchPlain(ctx, conn, b, o.Out, ids, nil)
		return err
	}
	n := o.parallel(b.GetSize())
	if n > 1 && (b.GetCompression() != ebv1.CompressionNone || b.GetEncryption() != ebv1.EncryptionNone) {
		if o.Parallel > 1 {
			return fmt.Errorf("--parallel %d: backup %q is stored compressed or encrypted, so its ranges are not the snapshot's; download it with --raw --parallel, or drop --parallel", o.Parallel, o.Name)
		}
		n = 1
	}
	bar := newProgress(o.ErrOut, b.GetSize(), "downloading "+o.Name)
	f, err := fetch.Snapshot(ctx, conn.Client, fetch.Request{
		Name: o.Name, Location: o.Location, Record: b, Identities: ids, Progress: progressOf(bar.Set),
		Path: o.File, Replace: o.Overwrite, Parallel: n, Connect: o.connector(n),
	})
	bar.Finish(err == nil)
	switch {
	case err == nil:
	case ctx.Err() != nil:
		return fmt.Errorf("download of %q interrupted; nothing was kept, run the same command again (or use --raw to download resumably)", o.Name)
	case errors.Is(err, client.ErrExists):
		return fmt.Errorf("%s appeared while downloading; run again with --overwrite or another -o", o.File)
	default:
		return explainFetch(conn, b, err)
	}
	noteCopyRead(o.ErrOut, b, f.Backup)
	fmt.Fprintf(o.ErrOut, "backup %q downloaded to %s as a plain etcd snapshot (%d bytes, sha256 %s; etcd trailer and stored sha256 %s verified)\n",
		o.Name, o.File, f.Plain.Size, f.Plain.SHA256, b.GetSha256())
	return nil
}

// noteCopyRead says so when the server read a backup from a copy
// because the location asked could not serve it (its bytes gone, the
// location unavailable): asked is the backup as looked up, got as the
// download's header named it.
func noteCopyRead(w io.Writer, asked, got *ebv1.Backup) {
	if got == nil || asked == nil || got.GetLocation() == "" || got.GetLocation() == asked.GetLocation() {
		return
	}
	fmt.Fprintf(w, "Note: storage location %q could not serve backup %q (its bytes are gone or the location is unavailable); the server read its copy in location %q instead\n",
		asked.GetLocation(), asked.GetName(), got.GetLocation())
}

// parallel is the number of ranges for a backup of size bytes (-1:
// unknown, as for a resumed download, whose record decides).
func (o *DownloadOptions) parallel(size int64) int {
	if o.Parallel > 0 {
		return o.Parallel
	}
	return client.AutoParallel(size)
}

// connector opens one more connection (another port-forward) per range,
// for a download over n of them. They share one connection's
// flow-control window (client.WindowBytes), so that what the server may
// have sent ahead, and the plugin buffers when the file's disk stalls,
// does not grow with --parallel: four connections of 16 MiB windows
// held 76 MiB, of 4 MiB 33 MiB, for the same throughput on loopback.
func (o *DownloadOptions) connector(n int) client.Connector {
	window := int32(client.WindowBytes / max(n, 1))
	window = max(window, minParallelWindow)
	return func(ctx context.Context) (*client.Client, func(), error) {
		c, err := o.connectWith(ctx, grpc.WithInitialWindowSize(window), grpc.WithInitialConnWindowSize(window))
		if err != nil {
			return nil, nil, err
		}
		return c.Client, func() { c.Close() }, nil
	}
}

// minParallelWindow is the least window a parallel download's connection
// gets, however many there are: below it, the round trips of its
// acknowledgements would slow each stream.
const minParallelWindow = 1 << 20

func (o *DownloadOptions) toFile(ctx context.Context, conn *Connection) error {
	// The size decides how many ranges; a backup not yet complete is left
	// to the download to explain.
	var size int64
	if o.Parallel == 0 {
		if resp, err := conn.Backups.GetBackup(ctx, &ebv1.GetBackupRequest{Name: o.Name, Location: o.Location}); err == nil {
			size = resp.GetBackup().GetSize()
		}
	}
	var bar *progress
	n := o.parallel(size)
	b, err := conn.DownloadFile(ctx, client.FileDownload{
		Path:     o.File,
		Replace:  o.Overwrite,
		Parallel: n,
		Connect:  o.connector(n),
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
		if o.Location != "" {
			noteCopyRead(o.ErrOut, &ebv1.Backup{Name: o.Name, Location: o.Location}, b)
		}
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
