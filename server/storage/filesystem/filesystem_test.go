package filesystem_test

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/server/storage"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/server/storage/filesystem"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/server/storage/storagetest"
)

func TestConformance(t *testing.T) {
	storagetest.Run(t, storagetest.Suite{
		New: func(t *testing.T) storage.Location {
			l, err := filesystem.New(t.TempDir())
			if err != nil {
				t.Fatal(err)
			}
			return l
		},
		BigSize: 16<<20 + 5,
		CheckClean: func(t *testing.T, loc storage.Location) {
			tmp := filepath.Join(loc.Describe(), ".tmp")
			entries, err := os.ReadDir(tmp)
			if err != nil {
				t.Fatal(err)
			}
			if len(entries) > 0 {
				t.Errorf("%s holds %d files after aborted uploads", tmp, len(entries))
			}
		},
	})
}
