package snapshot

import (
	"errors"
	"fmt"
	"os"
	"strings"
	"time"

	etcdutl "go.etcd.io/etcd/etcdutl/v3/snapshot"
	"go.uber.org/zap"
)

// Member is the layout of the member a data directory is rebuilt for.
type Member struct {
	Name                     string
	InitialCluster           string
	InitialAdvertisePeerURLs []string
	// InitialClusterToken is the restored cluster's token; "" is etcd's
	// own default, "etcd-cluster".
	InitialClusterToken string
	// DataDir is the member's --data-dir.
	DataDir string
	// MoveAside lets Restore rename a non-empty DataDir to
	// DataDir.before-restore-TIMESTAMP instead of refusing.
	MoveAside bool
}

// Validate checks the layout before anything is touched; it does no I/O.
func (m Member) Validate() error {
	var missing []string
	if m.Name == "" {
		missing = append(missing, "member name")
	}
	if m.InitialCluster == "" {
		missing = append(missing, "initial cluster")
	}
	if len(m.InitialAdvertisePeerURLs) == 0 {
		missing = append(missing, "initial advertise peer URLs")
	}
	if m.DataDir == "" {
		missing = append(missing, "data dir")
	}
	if len(missing) > 0 {
		return fmt.Errorf("restore needs the %s", strings.Join(missing, ", "))
	}
	if !strings.Contains(m.InitialCluster, m.Name+"=") {
		return fmt.Errorf("initial cluster %q does not name member %q", m.InitialCluster, m.Name)
	}
	return nil
}

// ErrDataDirNotEmpty is returned when the data directory holds data and
// MoveAside was not asked for.
var ErrDataDirNotEmpty = errors.New("the data directory is not empty")

// CheckDataDir fails early, before any download, when Restore would
// refuse m.DataDir.
func CheckDataDir(m Member) error {
	if err := m.Validate(); err != nil {
		return err
	}
	entries, err := os.ReadDir(m.DataDir)
	if err == nil && len(entries) > 0 && !m.MoveAside {
		return fmt.Errorf("%w: %s holds %d entries; stop the member and pass the move-aside option to keep them next to it, or choose an empty directory",
			ErrDataDirNotEmpty, m.DataDir, len(entries))
	}
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	return nil
}

// Restore rebuilds m's data directory from the snapshot at path with etcd's
// own restore code (which checks the SHA-256 trailer again). A non-empty
// data directory is refused, or with MoveAside renamed — never deleted. It
// returns where the old data went, if anywhere.
func Restore(path string, m Member) (movedTo string, err error) {
	if err := CheckDataDir(m); err != nil {
		return "", err
	}
	entries, err := os.ReadDir(m.DataDir)
	switch {
	case errors.Is(err, os.ErrNotExist):
	case err != nil:
		return "", err
	case len(entries) > 0:
		movedTo = fmt.Sprintf("%s.before-restore-%s", strings.TrimRight(m.DataDir, "/"), time.Now().UTC().Format("20060102-150405"))
		if err := os.Rename(m.DataDir, movedTo); err != nil {
			return "", fmt.Errorf("move %s aside: %w", m.DataDir, err)
		}
	default:
		// An empty directory (a fresh volume's mount point, which cannot
		// be removed) is used as is: etcdutl refuses only non-empty ones.
	}
	token := m.InitialClusterToken
	if token == "" {
		token = "etcd-cluster" // etcd's own default
	}
	err = etcdutl.NewV3(zap.NewNop()).Restore(etcdutl.RestoreConfig{
		SnapshotPath:        path,
		Name:                m.Name,
		OutputDataDir:       m.DataDir,
		PeerURLs:            m.InitialAdvertisePeerURLs,
		InitialCluster:      m.InitialCluster,
		InitialClusterToken: token,
	})
	if err != nil {
		return movedTo, fmt.Errorf("etcd restore into %s: %w", m.DataDir, err)
	}
	return movedTo, nil
}
