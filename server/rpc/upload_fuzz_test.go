package rpc_test

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"filippo.io/age"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	ebv1 "github.com/kubectl-etcdbackup/kubectl-etcdbackup/api/etcdbackup/v1"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/client"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/crypt"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/server/rpc"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/server/servertest"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/snapshot"
)

// FuzzUploadStream drives the real UploadBackup stream of an in-process
// server with message sequences decoded from the fuzzer's bytes: header
// fields, chunk sizes, trailers, a second header, a message after the
// trailer, an oversized chunk, a cancellation. Whatever arrives, the
// server does not panic (that would end this process); a refused stream
// leaves nothing listed; an accepted one reads back byte-identical with
// its size and SHA-256, and if it is plain (neither compressed nor
// encrypted) it ends in etcd's trailer, the SHA-256 of whole 512-byte
// pages; and a stream that breaks a rule of the protocol, or whose plain
// data is not a whole etcd snapshot, is refused, a well-formed one
// accepted.
func FuzzUploadStream(f *testing.F) {
	srv := servertest.Start(f, "")
	bs := srv.Client.Backups
	id, err := age.GenerateX25519Identity()
	if err != nil {
		f.Fatal(err)
	}
	recipient := id.Recipient().String()

	// Payloads as real senders make them: a snapshot (whole pages and
	// etcd's trailer), the same zstd-compressed, and age-encrypted.
	db := bytes.Repeat([]byte("etcd bolt page\x00"), 4*512/15+1)[:4*512]
	sum := sha256.Sum256(db)
	plain := append(db, sum[:]...)
	zr, err := snapshot.Compress(context.Background(), bytes.NewReader(plain), ebv1.CompressionZstd)
	if err != nil {
		f.Fatal(err)
	}
	zstdData, err := io.ReadAll(zr)
	zr.Close()
	if err != nil {
		f.Fatal(err)
	}
	rcp, _ := crypt.ParseRecipient(recipient)
	er, err := crypt.Encrypt(context.Background(), bytes.NewReader(zstdData), []age.Recipient{rcp})
	if err != nil {
		f.Fatal(err)
	}
	ageData, err := io.ReadAll(er)
	if err != nil {
		f.Fatal(err)
	}

	bad := append([]byte(nil), plain...)
	bad[100] ^= 1 // in the database: etcd's trailer no longer matches

	// ops: header flags, expected-size delta, SHA mode, labels/no-header/
	// seal (0x40: the payload is padded to whole pages and given etcd's
	// trailer first), then messages (see decodeUpload); a chunk op 0x40
	// sends 9×, 0xF8 32× the next byte's worth of the payload.
	for _, seed := range []struct {
		ops     []byte
		payload []byte
	}{
		{[]byte{0x00, 0, 0, 0, 0x40, 200, 0x40, 255}, plain},          // two chunks, no checks
		{[]byte{0x0c, 0, 1, 1, 0x40, 200, 0x40, 255, 5, 0x01}, plain}, // expected size and SHA, a label, a trailer
		{[]byte{0x10, 0, 0, 0, 0xF8, 255, 5, 0x09}, zstdData},         // zstd, trailer with raw size and SHA
		{[]byte{0x90, 0, 0, 0, 0xF8, 255, 0xF8, 255}, ageData},        // age over zstd
		{[]byte{0x80, 0, 0, 0, 0xF8, 255}, plain},                     // declared age, not age data
		{[]byte{0x04, 3, 0, 0, 0xF8, 255}, plain},                     // expected size off by 3
		{[]byte{0x08, 0, 2, 0, 0xF8, 255}, plain},                     // wrong expected SHA
		{[]byte{0x00, 0, 0, 0, 0xF8, 255, 5, 0x11}, plain},            // trailer of the wrong size
		{[]byte{0x00, 0, 0, 0, 0xF8, 255, 5, 0x41}, plain},            // trailer SHA in upper case
		{[]byte{0x00, 0, 0, 0, 5, 0, 0, 10}, plain},                   // a chunk after the trailer
		{[]byte{0x00, 0, 0, 0, 6, 0, 10}, plain},                      // a second header
		{[]byte{0x00, 0, 0, 0, 7, 0}, plain},                          // a chunk over the limit
		{[]byte{0x00, 0, 0, 0, 0, 100, 7, 1}, plain},                  // cancelled mid-stream
		{[]byte{0x00, 0, 0, 0x80, 0, 100}, plain},                     // no header
		{[]byte{0x03, 0, 0x10, 0, 0, 100}, plain},                     // a bad name
		{[]byte{0x30, 0, 0, 2, 0, 100}, plain},                        // gzip and a bad label
		{[]byte{0x00, 0, 0, 0}, nil},                                  // an empty backup: no snapshot
		{[]byte{0x00, 0, 0, 0, 0xF8, 64}, plain},                      // plain, cut short of etcd's trailer
		{[]byte{0x00, 0, 0, 0, 0xF8, 255}, bad},                       // plain, etcd's trailer does not match
		{[]byte{0x00, 0, 0, 0, 0xF8, 255}, []byte("not a snapshot")},  // plain, no snapshot at all
		{[]byte{0x00, 0, 0, 0x40, 0xF8, 255}, []byte("sealed")},       // sealed: a page and etcd's trailer
		{[]byte{0x10, 0, 0, 0, 0xF8, 255}, []byte("not a snapshot")},  // zstd: the server does not look inside
	} {
		f.Add(seed.ops, seed.payload)
	}

	var seq atomic.Int64
	f.Fuzz(func(t *testing.T, ops, payload []byte) {
		p := decodeUpload(&fuzzOps{b: ops}, payload, fmt.Sprintf("fz-%d", seq.Add(1)), recipient)
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		stream, err := bs.UploadBackup(ctx)
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range p.msgs {
			if m == nil { // cancel: the client goes away mid-stream
				cancel()
				break
			}
			if err := stream.Send(m); err != nil {
				break // the server ended the stream; its status comes below
			}
		}
		resp, err := stream.CloseAndRecv()
		if p.cancelled {
			err = context.Canceled // a reply racing the cancellation is not the client's to see
		}

		if p.mustRefuse != "" && err == nil {
			t.Fatalf("accepted a stream that must be refused (%s)", p.mustRefuse)
		}
		if p.mustAccept && err != nil {
			t.Fatalf("refused a well-formed stream: %v", err)
		}
		if err != nil {
			if c := status.Code(err); !p.cancelled && (c == codes.Internal || c == codes.Unknown) {
				t.Fatalf("refused with %v, not a verdict on the request: %v", c, err)
			}
			if p.header != nil && p.validName {
				// A refusal stores nothing; only an upload still being
				// aborted after a cancellation may not have ended yet, and
				// it can never commit without its end of stream.
				if _, gerr := bs.GetBackup(context.Background(), &ebv1.GetBackupRequest{Name: p.header.GetName()}); status.Code(gerr) != codes.NotFound {
					t.Fatalf("refused (%v), but the backup is there: %v", err, gerr)
				}
			}
			return
		}
		b := resp.GetBackup()
		if b.GetName() != p.header.GetName() || b.GetSize() != int64(len(p.data)) || b.GetSha256() != hexSHA(p.data) {
			t.Fatalf("accepted as %+v; %d bytes with SHA-256 %s were sent", b, len(p.data), hexSHA(p.data))
		}
		if isPlain(p.header) && !etcdTrailerHolds(p.data) {
			t.Fatalf("stored %d bytes of plain data that do not end in etcd's trailer", len(p.data))
		}
		var got bytes.Buffer
		if _, err := srv.Client.Download(context.Background(), &got, client.DownloadRequest{Name: b.GetName()}); err != nil {
			t.Fatalf("download of an accepted backup: %v", err)
		}
		if !bytes.Equal(got.Bytes(), p.data) {
			t.Fatalf("read back %d bytes that differ from the %d sent", got.Len(), len(p.data))
		}
	})
}

// upload is one decoded stream: its messages (nil means cancel there),
// the data its chunks carry, and what the protocol says of it.
type upload struct {
	header     *ebv1.UploadHeader
	validName  bool
	msgs       []*ebv1.UploadBackupRequest
	data       []byte
	cancelled  bool
	mustRefuse string // why, when a rule is broken
	mustAccept bool
}

// fuzzOps hands out the fuzzer's bytes one at a time, then zeros.
type fuzzOps struct{ b []byte }

func (o *fuzzOps) next() byte {
	if len(o.b) == 0 {
		return 0
	}
	c := o.b[0]
	o.b = o.b[1:]
	return c
}

func (o *fuzzOps) more() bool { return len(o.b) > 0 }

func decodeUpload(o *fuzzOps, payload []byte, name, recipient string) *upload {
	u := &upload{}
	refuse := func(why string) {
		if u.mustRefuse == "" {
			u.mustRefuse = why
		}
	}
	flags, delta, shaMode, extra := o.next(), int8(o.next()), o.next(), o.next()
	h := &ebv1.UploadHeader{Name: name}
	u.validName = true
	if flags&3 == 3 {
		bad := []string{"", "Bad_Name", "../x", strings.Repeat("a", rpc.MaxNameLength+1)}
		h.Name = bad[int(shaMode>>4)%len(bad)]
		u.validName = false
		refuse("invalid name")
	}
	switch (flags >> 4) & 3 {
	case 1, 2:
		h.Compression = ebv1.CompressionZstd
	case 3:
		h.Compression = "gzip"
		refuse("unknown compression")
	}
	knownGood := true
	switch flags >> 6 {
	case 2:
		h.Encryption, h.AgeRecipients = ebv1.EncryptionAge, []string{recipient}
	case 3:
		h.Encryption = ebv1.EncryptionAge
		knownGood = false // no recipients: the server's call
	}
	switch extra & 3 {
	case 1:
		h.Labels = map[string]string{"app": "etcd"}
	case 2:
		h.Labels = map[string]string{"bad key!": "x"}
		refuse("invalid label")
	case 3:
		h.Labels = map[string]string{"long": strings.Repeat("v", 64)}
		refuse("label value over 63 characters")
	}
	noHeader := extra&0x80 != 0
	if extra&0x40 != 0 {
		payload = sealSnapshot(payload)
	}

	// Messages; the trailer and sizes are filled in once the data is known.
	type pending struct {
		msg         *ebv1.UploadBackupRequest
		trailerMode byte
	}
	var msgs []pending
	pos := 0
	sawTrailer := false
	add := func(m *ebv1.UploadBackupRequest, mode byte) {
		if sawTrailer {
			refuse("a message after the trailer")
		}
		msgs = append(msgs, pending{m, mode})
	}
	for o.more() && len(msgs) < 64 && !u.cancelled {
		switch op := o.next(); op % 8 {
		case 0, 1, 2, 3: // a chunk of the payload
			n := min(int(o.next())*(int(op>>3)+1), len(payload)-pos)
			chunk := payload[pos : pos+n]
			pos += n
			u.data = append(u.data, chunk...)
			add(&ebv1.UploadBackupRequest{Msg: &ebv1.UploadBackupRequest_Chunk{Chunk: chunk}}, 0)
		case 4:
			add(&ebv1.UploadBackupRequest{Msg: &ebv1.UploadBackupRequest_Chunk{}}, 0)
		case 5:
			mode := o.next()
			add(&ebv1.UploadBackupRequest{Msg: &ebv1.UploadBackupRequest_Trailer{Trailer: &ebv1.UploadTrailer{}}}, mode|0x80)
			sawTrailer = true
		case 6:
			add(&ebv1.UploadBackupRequest{Msg: &ebv1.UploadBackupRequest_Header{Header: &ebv1.UploadHeader{Name: name + "-2"}}}, 0)
			refuse("a second header")
		case 7:
			if o.next()%2 == 0 {
				big := make([]byte, rpc.MaxChunkBytes+1)
				u.data = append(u.data, big...)
				add(&ebv1.UploadBackupRequest{Msg: &ebv1.UploadBackupRequest_Chunk{Chunk: big}}, 0)
				refuse("a chunk over the limit")
			} else {
				msgs = append(msgs, pending{})
				u.cancelled = true
				refuse("cancelled")
			}
		}
	}

	digest := hexSHA(u.data)
	if flags&4 != 0 {
		h.ExpectedSize = new(int64)
		*h.ExpectedSize = max(0, int64(len(u.data))+int64(delta))
		if *h.ExpectedSize != int64(len(u.data)) {
			refuse("expected size differs from what was sent")
		}
	}
	if flags&8 != 0 {
		h.ExpectedSha256 = shaVariant(shaMode, digest, refuse, "expected SHA-256")
	}
	if h.Encryption == ebv1.EncryptionAge && !bytes.HasPrefix(u.data, crypt.Magic) {
		refuse("declared age but the data is not")
	}
	if isPlain(h) && !etcdTrailerHolds(u.data) {
		refuse("plain data that is not a whole etcd snapshot")
	}
	var rawSize int64
	for i := range msgs {
		m := msgs[i]
		if m.trailerMode == 0 {
			continue
		}
		tr := m.msg.GetTrailer()
		tr.Size = int64(len(u.data))
		if m.trailerMode&0x10 != 0 {
			tr.Size += int64(m.trailerMode&0x0f) + 1
			refuse("trailer size differs from what was sent")
		}
		tr.Sha256 = shaVariant(m.trailerMode&0x63, digest, refuse, "trailer SHA-256")
		if m.trailerMode&0x08 != 0 {
			tr.RawSize, tr.RawSha256 = int64(len(u.data))*3, hexSHA([]byte("raw"))
			rawSize = tr.RawSize
		}
	}
	if !isPlain(h) && rawSize == 0 {
		refuse("compressed or encrypted without a raw size")
	}

	u.header = h
	if !noHeader {
		u.msgs = append(u.msgs, &ebv1.UploadBackupRequest{Msg: &ebv1.UploadBackupRequest_Header{Header: h}})
	} else {
		refuse("no header first")
	}
	for _, m := range msgs {
		u.msgs = append(u.msgs, m.msg)
	}
	u.mustAccept = u.mustRefuse == "" && knownGood
	return u
}

// shaVariant is "" (mode 0), the right digest (mode 1), a wrong one (2)
// or a malformed one (3), by mode's low bits; bit 6 upper-cases a right one.
func shaVariant(mode byte, digest string, refuse func(string), what string) string {
	switch mode & 3 {
	case 1:
		if mode&0x40 != 0 {
			refuse(what + " in upper case")
			return strings.ToUpper(digest)
		}
		return digest
	case 2:
		refuse(what + " wrong")
		return hexSHA([]byte("something else"))
	case 3:
		refuse(what + " malformed")
		return "not-a-sha"
	}
	return ""
}

// isPlain says whether h declares the data stored as is: the server then
// holds it to etcd's trailer.
func isPlain(h *ebv1.UploadHeader) bool {
	return h.GetCompression() == ebv1.CompressionNone && h.GetEncryption() == ebv1.EncryptionNone
}

// etcdTrailerHolds says whether data is whole 512-byte pages followed by
// their SHA-256, as etcd ends a snapshot (worked out here, not with the
// server's own check).
func etcdTrailerHolds(data []byte) bool {
	n := len(data) - sha256.Size
	if n < 0 || n%512 != 0 {
		return false
	}
	sum := sha256.Sum256(data[:n])
	return bytes.Equal(data[n:], sum[:])
}

// sealSnapshot pads b with zeros to whole 512-byte pages and appends their
// SHA-256: data that passes etcd's trailer check, whatever b is.
func sealSnapshot(b []byte) []byte {
	db := make([]byte, (len(b)+511)/512*512)
	copy(db, b)
	sum := sha256.Sum256(db)
	return append(db, sum[:]...)
}

func hexSHA(b []byte) string {
	s := sha256.Sum256(b)
	return hex.EncodeToString(s[:])
}
