package storage

import (
	"slices"
	"strings"

	ebv1 "github.com/kubectl-etcdbackup/kubectl-etcdbackup/api/etcdbackup/v1"
)

// KitSuffix makes a backup's name its recovery kit's: the kit of backup
// B is stored as B.kit (package kit's Suffix).
const KitSuffix = ".kit"

// Kit is set on a backup's recovery kit (Source.Kind ebv1.SourceKit): an
// age file of the files an agent read on a control-plane node. What is
// here is what the server may know; the files' SHA-256 are inside the
// encryption.
type Kit struct {
	// Backup is the backup the kit was taken with.
	Backup   string      `json:"backup"`
	Node     string      `json:"node,omitempty"`
	Paths    []string    `json:"paths"`
	Files    []KitFile   `json:"files,omitempty"`
	Versions KitVersions `json:"versions"`
}

// KitFile is one entry of a kit.
type KitFile struct {
	Path string `json:"path"`
	Mode uint32 `json:"mode"`
	Size int64  `json:"size,omitempty"`
	Link string `json:"link,omitempty"`
}

// KitVersions are the component versions a kit was taken with.
type KitVersions struct {
	Etcd       string `json:"etcd,omitempty"`
	Kubernetes string `json:"kubernetes,omitempty"`
}

// IsKit says whether m is a recovery kit rather than a backup.
func (m *Manifest) IsKit() bool { return m.Kit != nil || m.Source.Kind == ebv1.SourceKit }

// Kits are a listing's kits by the backup they belong to.
func Kits(parts []*Manifest) map[string]*Manifest {
	out := map[string]*Manifest{}
	for _, m := range parts {
		if m.Kit != nil && m.Name == m.Kit.Backup+KitSuffix {
			out[m.Kit.Backup] = m
		}
	}
	return out
}

// KitName is the stored name of backup's kit.
func KitName(backup string) string { return backup + KitSuffix }

// KitOf returns the backup a kit's name belongs to, if name is one.
func KitOf(name string) (string, bool) {
	b, ok := strings.CutSuffix(name, KitSuffix)
	return b, ok && b != ""
}

func (k *Kit) clone() *Kit {
	if k == nil {
		return nil
	}
	c := *k
	c.Paths, c.Files = slices.Clone(k.Paths), slices.Clone(k.Files)
	return &c
}
