// Package kitagent is the kit agent: on a control-plane node it reads
// the directories its target's recovery kit names (package kit), waits
// until the backup the kit goes with is stored, seals the kit there to
// the kit's age recipients — the server never sees a plaintext byte —
// and stores it beside the backup. A backup that fails takes its kit
// with it: nothing is stored.
package kitagent

import (
	"bytes"
	"cmp"
	"context"
	"errors"
	"fmt"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/timestamppb"
	"k8s.io/apimachinery/pkg/util/wait"

	ebv1 "github.com/kubectl-etcdbackup/kubectl-etcdbackup/api/etcdbackup/v1"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/client"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/crypt"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/kit"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/storage"
)

// Options say which kit to collect and for which backup.
type Options struct {
	// Name and Location of the backup the kit goes with; Target its
	// target's name.
	Name, Location, Target string
	// Paths are the host directories to collect, seen under HostRoot.
	Paths    []string
	HostRoot string
	// Recipients are the age public keys the kit is sealed to.
	Recipients []string
	// Node and KubeVersion are recorded with the kit.
	Node, KubeVersion string
	// Poll is how often the backup's record is read while it is taken
	// (0: every 2 s).
	Poll time.Duration
}

// ErrBackupFailed is a backup that failed: its kit is not stored.
var ErrBackupFailed = errors.New("the backup failed")

// Run collects the kit, waits for its backup and stores the kit. It
// returns the kit as the server recorded it.
func Run(ctx context.Context, c *client.Client, o Options) (*ebv1.Backup, error) {
	recipients, err := crypt.ParseRecipients(o.Recipients)
	if err != nil {
		return nil, fmt.Errorf("recovery kit recipients: %w", err)
	}
	// Read now, while the backup is taken: the files of that moment.
	contents, err := kit.Collect(ctx, o.HostRoot, o.Paths, kit.Index{Backup: o.Name, Node: o.Node, Time: time.Now().UTC()})
	if err != nil {
		return nil, err
	}
	b, err := waitStored(ctx, c, o)
	if err != nil {
		return nil, err
	}
	contents.Index.Versions = kit.Versions{Etcd: b.GetEtcd().GetVersion(), Kubernetes: o.KubeVersion}
	sealed, err := contents.Seal(ctx, recipients)
	if err != nil {
		return nil, fmt.Errorf("seal the recovery kit: %w", err)
	}
	h := &ebv1.UploadHeader{
		Name: storage.KitName(o.Name), Location: o.Location,
		ExpectedSize: new(int64(len(sealed.Data))), ExpectedSha256: sealed.SHA256(),
		RawSize: sealed.PlainSize, RawSha256: sealed.PlainSHA256,
		Encryption: ebv1.EncryptionAge, AgeRecipients: o.Recipients,
		Source: &ebv1.BackupSource{Kind: ebv1.SourceKit, Target: o.Target, StartTime: timestamppb.New(contents.Index.Time)},
		Kit:    Describe(contents.Index),
	}
	k, err := c.Upload(ctx, bytes.NewReader(sealed.Data), h, nil)
	if status.Code(err) == codes.AlreadyExists {
		// Only this Job may store it: an earlier attempt of its pod did
		// (disrupted after storing it).
		if got, gerr := c.Backups.GetBackup(ctx, &ebv1.GetBackupRequest{Name: o.Name, Location: o.Location}); gerr == nil && got.GetBackup().GetKit() != nil {
			sk := got.GetBackup().GetKit()
			return &ebv1.Backup{Name: sk.GetName(), Location: o.Location, Size: sk.GetSize(), Sha256: sk.GetSha256(), Kit: sk}, nil
		}
	}
	if err != nil {
		return nil, fmt.Errorf("store the recovery kit of %q: %w", o.Name, err)
	}
	return k, nil
}

// waitStored reads backup o.Name's record until it is stored, or failed.
func waitStored(ctx context.Context, c *client.Client, o Options) (*ebv1.Backup, error) {
	var b *ebv1.Backup
	err := wait.PollUntilContextCancel(ctx, cmp.Or(o.Poll, 2*time.Second), true, func(ctx context.Context) (bool, error) {
		resp, err := c.Backups.GetBackup(ctx, &ebv1.GetBackupRequest{Name: o.Name, Location: o.Location})
		switch status.Code(err) {
		case codes.OK:
		case codes.NotFound, codes.Unavailable, codes.DeadlineExceeded:
			// Not started yet, or the server is being replaced.
			return false, nil
		default:
			return false, fmt.Errorf("read backup %q: %w", o.Name, err)
		}
		switch resp.GetBackup().GetPhase() {
		case ebv1.BackupPhase_BACKUP_PHASE_COMPLETED:
			b = resp.GetBackup()
			return true, nil
		case ebv1.BackupPhase_BACKUP_PHASE_FAILED:
			return false, fmt.Errorf("%w: %s; its recovery kit was not stored", ErrBackupFailed, resp.GetBackup().GetMessage())
		}
		return false, nil
	})
	if err != nil && b == nil && ctx.Err() != nil {
		return nil, fmt.Errorf("waiting for backup %q to be stored: %w", o.Name, err)
	}
	return b, err
}

// Describe is what the server may know of a kit: its index without the
// files' hashes and owners.
func Describe(idx kit.Index) *ebv1.Kit {
	k := &ebv1.Kit{Node: idx.Node, Paths: idx.Paths, Versions: &ebv1.KitVersions{Etcd: idx.Versions.Etcd, Kubernetes: idx.Versions.Kubernetes}}
	for _, f := range idx.Files {
		k.Files = append(k.Files, &ebv1.KitFile{Path: f.Path, Mode: uint32(f.Mode), Size: f.Size, Link: f.Link})
	}
	return k
}
