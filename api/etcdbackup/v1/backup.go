package etcdbackupv1

import (
	"slices"
	"strings"
	"time"
)

// Source kinds that BackupSource.kind may carry: how a backup arrived.
const (
	// SourceUpload is a file a client uploaded (the default).
	SourceUpload = "upload"
	// SourceAgent is a snapshot a backup agent took of an etcd target.
	SourceAgent = "agent"
	// SourceDelta is a delta segment a delta agent cut from etcd's watch:
	// its manifest is a segment's, not a snapshot's.
	SourceDelta = "delta"
	// SourceKit is a backup's recovery kit, stored beside it by its
	// agent: its manifest is a kit's, not a snapshot's.
	SourceKit = "kit"
)

// OfTarget says whether a backup of source kind kind recorded with
// source target backupTarget is one of target's own backups: one its
// agent took (a snapshot or a fold). An upload never is, whatever its
// header claimed. The server, the plugin and break-glass decide by it.
func OfTarget(kind, backupTarget, target string) bool {
	return kind == SourceAgent && target != "" && backupTarget == target
}

// ReservedLabelPrefix is the prefix of the labels only the server writes
// (it marks scheduled backups with etcdbackup.io/scheduled and
// etcdbackup.io/target): an upload or backup request carrying one is
// refused.
const ReservedLabelPrefix = "etcdbackup.io/"

// ReservedLabel returns the first key of labels, in sorted order, under
// ReservedLabelPrefix, and whether there is one.
func ReservedLabel(labels map[string]string) (string, bool) {
	keys := make([]string, 0, len(labels))
	for k := range labels {
		if strings.HasPrefix(k, ReservedLabelPrefix) {
			keys = append(keys, k)
		}
	}
	if len(keys) == 0 {
		return "", false
	}
	return slices.Min(keys), true
}

// CompareListing is the order of a listing — newest first, then by name —
// as a comparison of a backup created at aTime named aName with one
// created at bTime named bName: negative when a comes first. Names are
// unique in a location, so within one it is total, and a page token (the
// last backup's create time and name) says where the next page starts
// even when backups were added or deleted in between. The server lists,
// pages and prunes in this order, and the plugin merges locations in it.
func CompareListing(aTime time.Time, aName string, bTime time.Time, bName string) int {
	if c := bTime.Compare(aTime); c != 0 {
		return c
	}
	return strings.Compare(aName, bName)
}

// ListedBefore reports whether a is listed before b (CompareListing).
func ListedBefore(a, b *Backup) bool {
	return CompareListing(a.GetCreateTime().AsTime(), a.GetName(), b.GetCreateTime().AsTime(), b.GetName()) < 0
}

// SortBackups sorts bs in listing order (CompareListing); backups of
// several locations that share a create time and a name go by location.
func SortBackups(bs []*Backup) {
	slices.SortStableFunc(bs, func(a, b *Backup) int {
		if c := CompareListing(a.GetCreateTime().AsTime(), a.GetName(), b.GetCreateTime().AsTime(), b.GetName()); c != 0 {
			return c
		}
		return strings.Compare(a.GetLocation(), b.GetLocation())
	})
}
