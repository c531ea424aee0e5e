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
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/client"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/crypt"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/snapshot"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/snapshot/kube"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/snapshot/kube/atrest"
)

// backupSource is where inspect and extract read a snapshot from: a
// backup downloaded through the server (or, with --storage-config, read
// from its storage location) into a temporary file, or --from-file. The
// download is download's own (fetchToFile: decryption with
// --identity, decompression, etcd's trailer and the stored and plain
// SHA-256 checked as it streams), then bolt's check; a file is unpacked
// and checked as restore --from-file does.
type backupSource struct {
	FromFile      string
	IdentityFiles []string
	WorkDir       string
	EtcdPrefix    string
	// EncryptionConfig is the API server's EncryptionConfiguration,
	// whose keys open the objects it encrypted at rest.
	EncryptionConfig string
}

func (s *backupSource) addFlags(cmd *cobra.Command, g *GlobalOptions) {
	f := cmd.Flags()
	f.StringVar(&s.FromFile, "from-file", "", "read the snapshot in `FILE` (written by download, plain, compressed or encrypted) instead of a backup of the server; NAME is then only a label")
	f.StringVar(&s.WorkDir, "work-dir", "", "`DIR` for the downloaded snapshot while it is read, removed afterwards (default: the system's temporary directory); it holds the cluster's Secrets meanwhile")
	f.StringVar(&s.EtcdPrefix, "etcd-prefix", kube.DefaultPrefix, "the prefix kube-apiserver keeps its objects under (its --etcd-prefix)")
	addIdentityFlag(cmd, &s.IdentityFiles, "an encrypted backup")
	f.StringVar(&s.EncryptionConfig, "encryption-config", "", "the API server's EncryptionConfiguration (the `FILE` its --encryption-provider-config names, as it was when the backup was taken): its aescbc, aesgcm and secretbox keys open the objects it encrypted at rest (KMS keys stay in the KMS)")
	addStorageConfigFlag(cmd, g)
}

func (s *backupSource) validate(g *GlobalOptions) error {
	if s.FromFile != "" && g != nil && (g.StorageConfig != "" || g.ServerAddress != "") {
		return errors.New("--from-file reads a snapshot on this machine: it does not go with --storage-config or --server-address")
	}
	return nil
}

// openedBackup is a verified snapshot, opened, with the catalog of its
// resources.
type openedBackup struct {
	*kube.Snapshot
	Catalog *kube.Catalog
	// CatalogErrors are the CustomResourceDefinitions that could not be
	// read.
	CatalogErrors []error
	// Status is what etcd says of the snapshot.
	Status snapshot.Status
	// Backup is the server's record (nil with --from-file).
	Backup *ebv1.Backup
	dir    string
}

func (b *openedBackup) Close() {
	b.Snapshot.Close()
	os.RemoveAll(b.dir)
}

// open fetches and checks the snapshot of backup name (op names the
// command in messages) and opens it.
func (s *backupSource) open(ctx context.Context, g *GlobalOptions, op, name string) (*openedBackup, error) {
	ids, err := loadIdentities(s.IdentityFiles)
	if err != nil {
		return nil, err
	}
	var atRest *atrest.Keys
	if s.EncryptionConfig != "" {
		if atRest, err = atrest.Load(s.EncryptionConfig); err != nil {
			return nil, fmt.Errorf("--encryption-config: %w", err)
		}
	}
	dir, err := os.MkdirTemp(s.WorkDir, "etcdbackup-"+op+"-")
	if err != nil {
		return nil, fmt.Errorf("%s: %w", op, err)
	}
	ob := &openedBackup{dir: dir}
	ok := false
	defer func() {
		if !ok {
			os.RemoveAll(dir)
		}
	}()
	var path string
	if s.FromFile != "" {
		if path, err = snapshot.UnpackWith(ctx, s.FromFile, dir, ids); err != nil {
			switch {
			case errors.Is(err, crypt.ErrIdentityRequired):
				return nil, fmt.Errorf("%s is age-encrypted and no identity was given: %s", s.FromFile, passIdentity)
			case errors.Is(err, crypt.ErrNoMatchingIdentity):
				return nil, fmt.Errorf("none of the identities given can decrypt %s: pass the right --identity", s.FromFile)
			}
			return nil, fmt.Errorf("%s: %w", s.FromFile, err)
		}
		if ob.Status, err = snapshot.Check(path); err != nil {
			return nil, fmt.Errorf("%s is not a usable etcd snapshot: %w", s.FromFile, err)
		}
	} else {
		var kitKeys *atrest.Keys
		if path, ob.Backup, ob.Status, kitKeys, err = s.download(ctx, g, op, name, dir, ids); err != nil {
			return nil, err
		}
		if atRest == nil {
			atRest = kitKeys
		}
	}
	if ob.Snapshot, err = kube.Open(path, s.EtcdPrefix); err != nil {
		return nil, err
	}
	if atRest != nil {
		ob.Snapshot.OpenEncryptedWith(atRest)
	}
	ob.Catalog, ob.CatalogErrors = ob.Snapshot.Catalog()
	ok = true
	return ob, nil
}

// download writes backup name's plain snapshot into dir, as download
// does, and checks its database. Without --encryption-config, the keys
// of an EncryptionConfiguration the backup's recovery kit holds are
// returned too, when the identities given open the kit.
func (s *backupSource) download(ctx context.Context, g *GlobalOptions, op, name, dir string, ids []agelib.Identity) (string, *ebv1.Backup, snapshot.Status, *atrest.Keys, error) {
	path, b, st, conn, err := s.downloadSnapshot(ctx, g, op, name, dir, ids)
	if conn != nil {
		defer conn.Close()
	}
	if err != nil || s.EncryptionConfig != "" || b.GetKit() == nil || len(ids) == 0 {
		return path, b, st, nil, err
	}
	c, err := fetchKit(ctx, conn, b, ids)
	if err != nil {
		fmt.Fprintf(g.ErrOut, "the recovery kit of %q does not open (%v): objects encrypted at rest stay closed unless --encryption-config names their keys\n", name, err)
		return path, b, st, nil, nil
	}
	file, keys := kitEncryptionConfig(c)
	if keys != nil {
		fmt.Fprintf(g.ErrOut, "objects encrypted at rest are opened with the EncryptionConfiguration of the backup's recovery kit (%s)\n", file)
	}
	return path, b, st, keys, nil
}

// downloadSnapshot is download's snapshot, and the connection it came
// through (for the kit), which the caller closes.
func (s *backupSource) downloadSnapshot(ctx context.Context, g *GlobalOptions, op, name, dir string, ids []agelib.Identity) (string, *ebv1.Backup, snapshot.Status, *Connection, error) {
	what := op + " " + quote(name)
	conn, err := g.Connect(ctx)
	if err != nil {
		return "", nil, snapshot.Status{}, nil, err
	}
	fail := func(err error) (string, *ebv1.Backup, snapshot.Status, *Connection, error) {
		return "", nil, snapshot.Status{}, conn, err
	}
	location, err := g.resolveLocation(ctx, conn, what, name)
	if err != nil {
		return fail(err)
	}
	resp, err := conn.Backups.GetBackup(ctx, &ebv1.GetBackupRequest{Name: name, Location: location})
	if err != nil {
		return fail(conn.explain(what, err))
	}
	b := resp.GetBackup()
	if b.GetPhase() != ebv1.BackupPhase_BACKUP_PHASE_COMPLETED {
		// The download itself says why (still running, failed).
		_, err := conn.Download(ctx, io.Discard, client.DownloadRequest{Name: name, Location: b.GetLocation()})
		if err == nil {
			err = fmt.Errorf("backup %q is %s", name, phaseString(b.GetPhase()))
		}
		return fail(conn.explain(what, err))
	}
	if b.GetEncryption() != ebv1.EncryptionNone && len(ids) == 0 {
		return fail(needIdentity(name, b, ""))
	}
	path := filepath.Join(dir, "snapshot.db")
	if err := fetchToFile(ctx, conn, b, path, ids, g.ErrOut, "downloading"); err != nil {
		if ctx.Err() != nil {
			return fail(fmt.Errorf("%s interrupted; nothing was kept", what))
		}
		return fail(err)
	}
	// fetchToFile verified etcd's trailer and the SHA-256s as the file
	// was written; the database's consistency is left.
	st, err := snapshot.CheckDatabase(path)
	if err != nil {
		return fail(withCode(ExitFailed, fmt.Errorf("%s: backup %q is corrupt: %w", what, name, err)))
	}
	return path, b, st, conn, nil
}
