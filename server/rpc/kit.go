package rpc

import (
	"context"
	"slices"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/api/agentjob"
	ebv1 "github.com/kubectl-etcdbackup/kubectl-etcdbackup/api/etcdbackup/v1"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/kit"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/server/auth"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/server/rpc/internal/edge"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/storage"
)

// admitKit holds a recovery kit's upload to its rules: only the kit
// agent of the backup, running on the kit's node, under the backup's kit
// name, sealed to the
// target's kit recipients (the server cannot open it; it can see to whom
// it is sealed), and only once the backup is stored, so that no kit is
// ever stored without its backup.
func (s *Service) admitKit(ctx context.Context, a *auth.Agent, h *ebv1.UploadHeader, locName string, loc storage.Location) error {
	if a.Kind != agentjob.Kit || h.GetKit() == nil {
		return status.Errorf(codes.PermissionDenied, "%s may not store a recovery kit: only a backup's kit agent may, with its kit's description", a)
	}
	if want := storage.KitName(a.Backup); h.GetName() != want || locName != a.Location {
		return status.Errorf(codes.PermissionDenied, "%s may store only %q in location %q, not %q in location %q", a, want, a.Location, h.GetName(), locName)
	}
	t, err := s.targets.Get(a.Target)
	if err != nil || a.Target == "" || t.Kit == nil {
		return status.Errorf(codes.FailedPrecondition, "target %q has no recovery kit configured (kit:); nothing was stored", a.Target)
	}
	k := t.Kit
	if a.Node != k.NodeName {
		return status.Errorf(codes.PermissionDenied, "%s runs on node %q, not on node %q whose files target %q's kit holds; nothing was stored", a, a.Node, k.NodeName, a.Target)
	}
	recipients := k.AgeRecipients
	if h.GetEncryption() != ebv1.EncryptionAge || h.GetCompression() != ebv1.CompressionNone || !sameKeys(h.GetAgeRecipients(), recipients) {
		return status.Errorf(codes.InvalidArgument,
			"the recovery kit of %q must be age-encrypted, uncompressed, to exactly target %q's kit recipients (kit.ageRecipients); nothing was stored", a.Backup, a.Target)
	}
	hk := h.GetKit()
	if n := len(hk.GetFiles()); n > kit.MaxFiles {
		return status.Errorf(codes.InvalidArgument, "the recovery kit of %q lists %d entries; a kit holds at most %d", a.Backup, n, kit.MaxFiles)
	}
	fields := append([]string{hk.GetNode(), hk.GetVersions().GetEtcd(), hk.GetVersions().GetKubernetes()}, hk.GetPaths()...)
	for _, f := range hk.GetFiles() {
		fields = append(fields, f.GetPath(), f.GetLink())
	}
	for _, f := range fields {
		if err := validateField("a kit's entry", f, s.limits); err != nil {
			return err
		}
	}
	if _, err := loc.Stat(ctx, a.Backup); err != nil {
		return edge.StorageStatus("store the recovery kit of", locName, a.Backup, err)
	}
	return nil
}

func sameKeys(a, b []string) bool {
	a, b = slices.Clone(a), slices.Clone(b)
	slices.Sort(a)
	slices.Sort(b)
	return slices.Equal(a, b)
}

// kitFromHeader is what a manifest records of a kit's header, for backup.
func kitFromHeader(k *ebv1.Kit, backup string) *storage.Kit {
	out := &storage.Kit{
		Backup: backup, Node: k.GetNode(), Paths: k.GetPaths(),
		Versions: storage.KitVersions{Etcd: k.GetVersions().GetEtcd(), Kubernetes: k.GetVersions().GetKubernetes()},
	}
	for _, f := range k.GetFiles() {
		out.Files = append(out.Files, storage.KitFile{Path: f.GetPath(), Mode: f.GetMode(), Size: f.GetSize(), Link: f.GetLink()})
	}
	return out
}
