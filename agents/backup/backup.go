// Package backup is the backup agent: it streams Maintenance.Snapshot from
// one etcd member through optional zstd compression into the data server's
// upload RPC, checking etcd's own SHA-256 trailer on the way. Nothing is
// written to disk and nothing holds the whole snapshot: memory stays flat
// whatever the database size. If the stream is short, the trailer wrong or
// etcd goes away, the upload is aborted and the server stores nothing.
package backup

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"hash"
	"io"
	"time"

	"github.com/klauspost/compress/zstd"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/protobuf/types/known/timestamppb"

	ebv1 "github.com/kubectl-etcdbackup/kubectl-etcdbackup/api/etcdbackup/v1"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/client"
)

// ErrCorruptSnapshot reports a snapshot stream whose trailing SHA-256 does
// not match its data (truncated or damaged).
var ErrCorruptSnapshot = errors.New("etcd snapshot stream failed its SHA-256 check")

// Options say what to back up and where to.
type Options struct {
	// Endpoint is the one etcd member to snapshot.
	Endpoint string
	// Name, Location and Labels of the backup on the server.
	Name     string
	Location string
	Labels   map[string]string
	// Target is the name of the etcd target in the server's config, recorded
	// in the backup's source.
	Target string
	// Compression is "" or "zstd".
	Compression string
	// Progress, if set, is called with the raw snapshot bytes read so far.
	Progress func(n int64)
}

// Run snapshots the member at opts.Endpoint through etcd and uploads it
// through up. etcd must be a client connected to that endpoint only.
func Run(ctx context.Context, etcd *clientv3.Client, up *client.Client, opts Options) (*ebv1.Backup, error) {
	switch opts.Compression {
	case "", "zstd":
	default:
		return nil, fmt.Errorf("compression %q is not supported; use zstd or none", opts.Compression)
	}
	start := time.Now()
	st, err := etcd.Status(ctx, opts.Endpoint)
	if err != nil {
		return nil, fmt.Errorf("status of etcd member %s: %w", opts.Endpoint, err)
	}
	info := &ebv1.EtcdInfo{
		// etcd does not say which revision a snapshot holds; the member's
		// revision just before it is the best lower bound there is.
		Revision:  st.Header.GetRevision(),
		ClusterId: st.Header.GetClusterId(),
		MemberId:  st.Header.GetMemberId(),
		Version:   st.Version,
		DbSize:    st.DbSize,
	}
	if members, err := etcd.MemberList(ctx); err == nil {
		for _, m := range members.Members {
			if m.ID == info.MemberId {
				info.MemberName = m.Name
			}
		}
	}

	// The snapshot stream and the upload share ctx: when either fails, the
	// other is cancelled.
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	snap, err := etcd.SnapshotWithVersion(ctx)
	if err != nil {
		return nil, fmt.Errorf("start snapshot of etcd member %s: %w", opts.Endpoint, err)
	}
	defer snap.Snapshot.Close()
	if snap.Version != "" {
		info.Version = snap.Version
	}

	// Uncompressed, the stored bytes are the raw bytes: the upload's own
	// hash covers them, so the verifier need not hash them a second time.
	raw := newVerifier(snap.Snapshot, opts.Progress, opts.Compression != "")
	var body io.Reader = raw
	if opts.Compression == "zstd" {
		pr := compress(ctx, raw)
		// Unblocks the encoder goroutine if the upload stops reading.
		defer pr.Close()
		body = pr
	}
	h := &ebv1.UploadHeader{
		Name:        opts.Name,
		Location:    opts.Location,
		Labels:      opts.Labels,
		Compression: opts.Compression,
		Etcd:        info,
		Source: &ebv1.BackupSource{
			Kind:      "agent",
			Target:    opts.Target,
			StartTime: timestamppb.New(start),
		},
	}
	b, err := up.UploadWith(ctx, body, client.UploadRequest{
		Header: h,
		Raw: func() (int64, string) {
			if raw.whole == nil {
				return 0, "" // the server records raw = stored
			}
			return raw.size, raw.digest
		},
	})
	if err != nil {
		if verr := raw.err; verr != nil {
			return nil, fmt.Errorf("snapshot of etcd member %s: %w (nothing was stored)", opts.Endpoint, verr)
		}
		return nil, fmt.Errorf("upload snapshot %q: %w", opts.Name, err)
	}
	return b, nil
}

// verifier passes a snapshot stream through unchanged and checks, at its
// end, that the last 32 bytes are the SHA-256 of everything before them —
// the trailer etcd appends. It returns io.EOF only if they are: a short or
// damaged stream ends in an error, so the upload is never committed.
type verifier struct {
	r        io.Reader
	progress func(int64)
	sum      hash.Hash // of the database bytes (all but the trailer)
	whole    hash.Hash // of everything, trailer included (nil: not needed)
	tail     []byte    // the last up-to-32 bytes seen, not yet in sum
	size     int64
	digest   string
	err      error
}

func newVerifier(r io.Reader, progress func(int64), hashWhole bool) *verifier {
	v := &verifier{r: r, progress: progress, sum: sha256.New(), tail: make([]byte, 0, 2*sha256.Size)}
	if hashWhole {
		v.whole = sha256.New()
	}
	return v
}

func (v *verifier) Read(p []byte) (int, error) {
	if v.err != nil {
		return 0, v.err
	}
	n, err := v.r.Read(p)
	if n > 0 {
		if v.whole != nil {
			v.whole.Write(p[:n])
		}
		v.size += int64(n)
		// Hash all but the last 32 bytes seen so far.
		v.tail = append(v.tail, p[:n]...)
		if over := len(v.tail) - sha256.Size; over > 0 {
			v.sum.Write(v.tail[:over])
			v.tail = append(v.tail[:0], v.tail[over:]...)
		}
		if v.progress != nil {
			v.progress(v.size)
		}
	}
	if errors.Is(err, io.EOF) {
		if len(v.tail) < sha256.Size || (v.size-sha256.Size)%512 != 0 {
			v.err = fmt.Errorf("%w: stream ended after %d bytes, not a whole database plus its 32-byte hash", ErrCorruptSnapshot, v.size)
			return n, v.err
		}
		if !bytes.Equal(v.sum.Sum(nil), v.tail) {
			v.err = fmt.Errorf("%w: the trailer does not match the data", ErrCorruptSnapshot)
			return n, v.err
		}
		if v.whole != nil {
			v.digest = hex.EncodeToString(v.whole.Sum(nil))
		}
		return n, io.EOF
	}
	if err != nil {
		v.err = fmt.Errorf("reading the snapshot stream after %d bytes: %w", v.size, err)
		return n, v.err
	}
	return n, nil
}

// compress returns a reader of r's bytes zstd-compressed. The encoder runs
// in a goroutine that ends when r ends, fails, or ctx is done.
func compress(ctx context.Context, r io.Reader) *io.PipeReader {
	pr, pw := io.Pipe()
	go func() {
		enc, err := zstd.NewWriter(pw, zstd.WithEncoderConcurrency(1))
		if err != nil {
			pw.CloseWithError(err)
			return
		}
		_, err = io.Copy(enc, readerCtx{ctx, r})
		if cerr := enc.Close(); err == nil {
			err = cerr
		}
		pw.CloseWithError(err) // nil closes with io.EOF
	}()
	return pr
}

type readerCtx struct {
	ctx context.Context
	r   io.Reader
}

func (r readerCtx) Read(p []byte) (int, error) {
	if err := r.ctx.Err(); err != nil {
		return 0, err
	}
	return r.r.Read(p)
}
