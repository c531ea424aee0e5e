package readpath

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sync"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	ebv1 "github.com/kubectl-etcdbackup/kubectl-etcdbackup/api/etcdbackup/v1"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/crypt"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/internal/ctxio"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/ledger"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/server/config"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/server/rpc/internal/edge"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/snapshot"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/storage"
)

// VerifyBackup implements ebv1.BackupServiceServer. bolt needs random
// access, so the snapshot is unpacked into a scratch file (disk, not
// memory) that is removed afterwards.
func (s *Service) VerifyBackup(ctx context.Context, req *ebv1.VerifyBackupRequest) (*ebv1.VerifyBackupResponse, error) {
	if err := edge.ValidateName("backup", req.GetName()); err != nil {
		return nil, err
	}
	locName, loc, err := s.location(req.GetLocation())
	if err != nil {
		return nil, err
	}
	r, m, err := loc.Open(ctx, req.GetName(), 0, 0)
	if err != nil && readFromCopy(err) {
		// Its bytes are gone: a copy of them verifies as well (the
		// response's backup names the copy's location).
		if cl, _ := s.fromCopy(ctx, locName, req.GetName(), ""); cl != nil {
			s.log.Warn("verify: reading a copy", "location", locName, "backup", req.GetName(), "copy", cl.Name, "error", err)
			locName, loc = cl.Name, cl
			r, m, err = cl.Open(ctx, req.GetName(), 0, 0)
		}
	}
	if err != nil {
		return nil, edge.StorageStatus("verify", locName, req.GetName(), err)
	}
	defer r.Close()
	if who := s.caller(ctx); s.breakGlass && s.reads.first(who, locName, req.GetName(), m.SHA256, s.now()) {
		// In the break-glass process the bytes are read on the operator's
		// machine, not on the server: a read like a download.
		loc.Note(ctx, s.log, ledger.Entry{Action: ledger.ActionBreakGlass, Backup: req.GetName(), SHA256: m.SHA256, Who: who, Detail: "verify"})
	}
	if m.Encryption != "" {
		return s.verifyStored(ctx, locName, m, r)
	}
	need := s.unpackedSize(m)
	release, err := s.verifies.reserve(s.scratchDir, req.GetName(), need)
	if err != nil {
		return nil, err
	}
	defer release()
	dir, err := os.MkdirTemp(s.scratchDir, "verify-")
	if err != nil {
		return nil, ebv1.ServerErrorf(codes.Internal, "verify %q: scratch space: %v", req.GetName(), err)
	}
	defer os.RemoveAll(dir)
	path := filepath.Join(dir, "snapshot.db")
	f, err := os.Create(path)
	if err != nil {
		return nil, ebv1.ServerErrorf(codes.Internal, "verify %q: %v", req.GetName(), err)
	}
	defer f.Close()

	stored := sha256.New()
	// Bounded by the recorded raw size, or limits.maxRawSize for a backup
	// stored without one: a crafted backup must not fill the scratch
	// volume. The reservation bounds the file too: a plain backup that
	// records no raw size may unpack to its recorded size, and a store
	// holding more must not write past what was reserved.
	n, err := snapshot.DecompressBounded(ctx, &reservedWriter{w: f, left: need}, io.TeeReader(r, stored), m.Compression, m.RawSize, s.limits.MaxRawSize)
	corrupt := func(format string, args ...any) error {
		msg := fmt.Sprintf(format, args...)
		s.log.Warn("backup failed verification", "location", locName, "backup", req.GetName(), "reason", msg)
		return status.Errorf(codes.DataLoss, "backup %q in location %q is corrupt: %s; do not restore it", req.GetName(), locName, msg)
	}
	if errors.Is(err, errPastReservation) {
		return nil, corrupt("it unpacks to more than the %d bytes its manifest records", need)
	}
	if errors.Is(err, snapshot.ErrCorrupt) {
		return nil, corrupt("%v", err)
	}
	if err != nil {
		return nil, edge.StorageStatus("verify", locName, req.GetName(), err)
	}
	// Drain what decompression did not need, so the stored hash covers it.
	if _, err := io.Copy(stored, r); err != nil {
		return nil, edge.StorageStatus("verify", locName, req.GetName(), err)
	}
	if got := hex.EncodeToString(stored.Sum(nil)); got != m.SHA256 {
		return nil, corrupt("its data has SHA-256 %s, but %s was recorded when it was stored", got, m.SHA256)
	}
	if m.RawSize != 0 && n != m.RawSize {
		return nil, corrupt("it unpacks to %d bytes, but %d were recorded", n, m.RawSize)
	}
	if err := f.Close(); err != nil {
		return nil, ebv1.ServerErrorf(codes.Internal, "verify %q: %v", req.GetName(), err)
	}
	st, err := snapshot.Check(path)
	if err != nil {
		return nil, corrupt("%v", err)
	}
	return &ebv1.VerifyBackupResponse{
		Backup:   edge.Backup(locName, m),
		Revision: st.Revision, TotalKeys: int64(st.TotalKey), TotalSize: st.TotalSize, Hash: st.Hash, StorageVersion: st.Version,
	}, nil
}

// verifyStored checks what the server can of an encrypted backup, whose
// key it never holds: the SHA-256 of the stored bytes and the syntax of
// the age header. The rest — age's authentication, etcd's trailer, the
// database — needs an identity, on the client.
func (s *Service) verifyStored(ctx context.Context, locName string, m *storage.Manifest, r io.Reader) (*ebv1.VerifyBackupResponse, error) {
	corrupt := func(format string, args ...any) error {
		msg := fmt.Sprintf(format, args...)
		s.log.Warn("backup failed verification", "location", locName, "backup", m.Name, "reason", msg)
		return status.Errorf(codes.DataLoss, "backup %q in location %q is corrupt: %s; do not restore it", m.Name, locName, msg)
	}
	stored := sha256.New()
	tee := io.TeeReader(ctxio.NewReader(ctx, r), stored)
	h, err := crypt.ReadHeader(tee)
	if errors.Is(err, crypt.ErrNotAge) {
		return nil, corrupt("it is recorded as age-encrypted, but %v", err)
	}
	if err != nil {
		return nil, edge.StorageStatus("verify", locName, m.Name, err)
	}
	if _, err := io.Copy(stored, ctxio.NewReader(ctx, r)); err != nil {
		return nil, edge.StorageStatus("verify", locName, m.Name, err)
	}
	if got := hex.EncodeToString(stored.Sum(nil)); got != m.SHA256 {
		return nil, corrupt("its data has SHA-256 %s, but %s was recorded when it was stored", got, m.SHA256)
	}
	return &ebv1.VerifyBackupResponse{
		Backup:     edge.Backup(locName, m),
		StoredOnly: true,
		Message: fmt.Sprintf("the stored bytes match their SHA-256 and start with an age header for %d recipient(s); the content is encrypted and the server holds no key: "+
			"run `kubectl etcdbackup verify %s --identity KEYFILE` to check etcd's trailer and database on your machine", len(h.StanzaTypes), m.Name),
	}, nil
}

const (
	// maxVerifies is how many verifies may unpack into the scratch
	// directory at once. Each also holds a bolt database mapped while it
	// is checked; two let a second user's verify run beside a long one.
	maxVerifies = 2
	// defaultVerifyScratchBytes is limits.verifyScratchBytes's default:
	// statfs(2) in the scratch directory shows the node's disk, not the
	// emptyDir's sizeLimit, past which the kubelet evicts the pod.
	defaultVerifyScratchBytes = config.DefaultVerifyScratchBytes
	// scratchFloorPercent of the scratch file system is left free by
	// every verify: the kubelet's default hard eviction threshold
	// (nodefs.available<10%) evicts pods, the biggest emptyDir users
	// first, when the node's disk gets fuller than that.
	scratchFloorPercent = 10
)

// errPastReservation is a verify's write beyond the scratch bytes it
// reserved.
var errPastReservation = errors.New("more bytes than reserved in the scratch directory")

// verifyGate bounds what VerifyBackup unpacks into the scratch directory
// at once, by count and by bytes: each verify reserves the size its
// snapshot unpacks to before it writes a byte, and one that does not fit
// is refused at once rather than queued, since a queued verify would
// hold its caller and its storage reader for as long as the others run.
// The zero value uses the defaults.
type verifyGate struct {
	// budget (bytes), most (verifies) and free (the scratch file
	// system's state) are the limits; zero is defaultVerifyScratchBytes,
	// maxVerifies and scratchSpace. Tests set them.
	budget int64
	most   int
	free   func(dir string) (available, total int64, err error)

	mu       sync.Mutex
	n        int
	reserved int64
}

// unpackedSize is the most bytes VerifyBackup writes to unpack m: its
// recorded raw size, else its stored size when stored as is, else the
// bound DecompressBounded applies to a compressed backup without one.
func (s *Service) unpackedSize(m *storage.Manifest) int64 {
	switch {
	case m.RawSize > 0:
		return m.RawSize
	case m.Compression == "" || m.Compression == ebv1.CompressionNone:
		return m.Size
	case s.limits.MaxRawSize > 0:
		return s.limits.MaxRawSize
	}
	return snapshot.DefaultMaxRawSize
}

// reserve takes a verify slot and need bytes of the scratch directory
// dir for backup name, or refuses with ResourceExhausted. release gives
// both back.
func (g *verifyGate) reserve(dir, name string, need int64) (release func(), err error) {
	budget, most, free := g.budget, g.most, g.free
	if budget <= 0 {
		budget = defaultVerifyScratchBytes
	}
	if most <= 0 {
		most = maxVerifies
	}
	if free == nil {
		free = scratchSpace
	}
	elsewhere := fmt.Sprintf("check it on your machine instead: `kubectl etcdbackup download %s` checks its SHA-256 and etcd's trailer, "+
		"and `kubectl etcdbackup inspect %s` opens its database", name, name)
	if need > budget {
		return nil, status.Errorf(codes.ResourceExhausted,
			"verify of %q refused: it unpacks to %s, more than the %s of scratch space this server lets verifies use (limits.verifyScratchBytes); %s",
			name, bytesString(need), bytesString(budget), elsewhere)
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.n >= most {
		return nil, status.Errorf(codes.ResourceExhausted,
			"verify of %q refused: this server runs at most %d verifies at once (each unpacks a snapshot into its scratch space), and %d are running; try again when one has finished, or %s",
			name, most, g.n, elsewhere)
	}
	if g.reserved+need > budget {
		return nil, status.Errorf(codes.ResourceExhausted,
			"verify of %q refused: it unpacks to %s, and the verifies running hold %s of the %s of scratch space this server lets verifies use (limits.verifyScratchBytes); try again when one has finished, or %s",
			name, bytesString(need), bytesString(g.reserved), bytesString(budget), elsewhere)
	}
	// What the verifies in flight already wrote is counted twice (gone
	// from available, and still reserved): erring towards refusing.
	if available, total, err := free(scratchDirOrTemp(dir)); err == nil {
		floor := total * scratchFloorPercent / 100
		if need > available-floor-g.reserved {
			held := ""
			if g.reserved > 0 {
				held = fmt.Sprintf(" (verifies running may still write %s of it)", bytesString(g.reserved))
			}
			return nil, status.Errorf(codes.ResourceExhausted,
				"verify of %q refused: it unpacks to %s, and the file system of the server's scratch space has %s available%s, of which %d%% of its size (%s) must stay free; try again later, or %s",
				name, bytesString(need), bytesString(available), held, scratchFloorPercent, bytesString(floor), elsewhere)
		}
	}
	g.n++
	g.reserved += need
	var once sync.Once
	return func() {
		once.Do(func() {
			g.mu.Lock()
			g.n--
			g.reserved -= need
			g.mu.Unlock()
		})
	}, nil
}

// scratchDirOrTemp is where os.MkdirTemp(dir, ...) creates.
func scratchDirOrTemp(dir string) string {
	if dir == "" {
		return os.TempDir()
	}
	return dir
}

// bytesString says a size as people read it, and exactly when that
// rounds.
func bytesString(n int64) string {
	for _, u := range []struct {
		size int64
		name string
	}{{1 << 30, "GiB"}, {1 << 20, "MiB"}, {1 << 10, "KiB"}} {
		switch {
		case n < u.size:
			continue
		case n%u.size == 0:
			return fmt.Sprintf("%d %s", n/u.size, u.name)
		}
		return fmt.Sprintf("%.1f %s (%d bytes)", float64(n)/float64(u.size), u.name, n)
	}
	return fmt.Sprintf("%d bytes", n)
}

// reservedWriter passes at most left bytes to w, then fails with
// errPastReservation.
type reservedWriter struct {
	w    io.Writer
	left int64
}

func (r *reservedWriter) Write(p []byte) (int, error) {
	if int64(len(p)) <= r.left {
		n, err := r.w.Write(p)
		r.left -= int64(n)
		return n, err
	}
	n, err := r.w.Write(p[:r.left])
	r.left -= int64(n)
	if err == nil {
		err = errPastReservation
	}
	return n, err
}
