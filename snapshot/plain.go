package snapshot

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"

	"filippo.io/age"

	ebv1 "github.com/kubectl-etcdbackup/kubectl-etcdbackup/api/etcdbackup/v1"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/crypt"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/internal/ctxio"
)

// Form is how a backup's stored bytes were made from its etcd snapshot —
// compressed, then encrypted — and what the snapshot must be once both
// are undone.
type Form struct {
	Compression string
	Encryption  string
	// RawSize and RawSHA256, when set, are the plain snapshot's.
	RawSize   int64
	RawSHA256 string
	// MaxRawSize bounds the snapshot when no RawSize is recorded;
	// 0 is DefaultMaxRawSize.
	MaxRawSize int64
}

// FormOf is the form a backup's record declares.
func FormOf(b *ebv1.Backup) Form {
	return Form{Compression: b.GetCompression(), Encryption: b.GetEncryption(), RawSize: b.GetRawSize(), RawSHA256: b.GetRawSha256()}
}

// Plain is what WritePlain checked.
type Plain struct {
	Size   int64
	SHA256 string
}

// WritePlain writes the etcd snapshot held in stored (a backup's bytes as
// stored, in form f) to w: it decrypts with ids, decompresses, and checks
// etcd's SHA-256 trailer and f's raw size and SHA-256, streaming, in
// bounded memory; a snapshot that would pass f's raw size fails with a
// *TooLargeError as soon as it does, without writing the excess. Bytes reach w before the end is verified: on error the
// caller must discard what it wrote. A snapshot that fails a check — or
// ciphertext that fails age's authentication — wraps ErrCorrupt; a missing
// or wrong identity is crypt.ErrIdentityRequired or
// crypt.ErrNoMatchingIdentity, before any byte is written; an error of
// stored itself is returned as is.
func WritePlain(ctx context.Context, w io.Writer, stored io.Reader, f Form, ids []age.Identity, progress func(plain int64)) (Plain, error) {
	if err := ebv1.ValidateCompression(f.Compression); err != nil {
		return Plain{}, err
	}
	if err := ebv1.ValidateEncryption(f.Encryption); err != nil {
		return Plain{}, err
	}
	src := &ctxio.Recorder{R: ctxio.NewReader(ctx, stored)}
	var r io.Reader = src
	if f.Encryption == ebv1.EncryptionAge {
		dr, err := crypt.Decrypt(r, ids)
		if err != nil {
			return Plain{}, plainError(ctx, src, err)
		}
		r = dr
	}
	if f.Compression == ebv1.CompressionZstd {
		dec, err := newZstdReader(r)
		if err != nil {
			return Plain{}, err
		}
		defer dec.Close()
		r = dec
	}
	// A stream that expands past its recorded size (or, with none
	// recorded, f.MaxRawSize) is refused before the excess reaches w (a
	// crafted zstd stream could fill the disk).
	r = limitRaw(r, f.RawSize, f.MaxRawSize)
	v := NewVerifier(r, VerifierOptions{HashWhole: true, Progress: progress})
	if _, err := io.Copy(w, v); err != nil {
		if v.Err() != nil {
			// The verifier saw a read error or a bad snapshot; classify
			// what lay under it.
			return Plain{}, plainError(ctx, src, v.Err())
		}
		return Plain{}, err // w's own error
	}
	p := Plain{Size: v.Size(), SHA256: v.SHA256()}
	if f.RawSize != 0 && p.Size != f.RawSize {
		return p, fmt.Errorf("%w: the snapshot is %d bytes, but %d were recorded when it was stored", ErrCorrupt, p.Size, f.RawSize)
	}
	if f.RawSHA256 != "" && p.SHA256 != f.RawSHA256 {
		return p, fmt.Errorf("%w: the snapshot has SHA-256 %s, but %s was recorded when it was stored", ErrCorrupt, p.SHA256, f.RawSHA256)
	}
	return p, nil
}

// plainError tells the source's failures (a broken download, a cancelled
// context) from verdicts on the data.
func plainError(ctx context.Context, src *ctxio.Recorder, err error) error {
	if cerr := ctx.Err(); cerr != nil {
		return cerr
	}
	// Unpack hands WritePlain an already decrypted stream: age's verdicts
	// come through the source there.
	if src.Err != nil && !errors.Is(src.Err, io.EOF) && !errors.Is(src.Err, crypt.ErrTampered) {
		return src.Err
	}
	switch {
	case errors.Is(err, ErrCorrupt), errors.Is(err, crypt.ErrIdentityRequired), errors.Is(err, crypt.ErrNoMatchingIdentity):
		return err
	case errors.Is(err, crypt.ErrTampered), errors.Is(err, crypt.ErrNotAge):
		return fmt.Errorf("%w: %w", ErrCorrupt, err)
	}
	// zstd's verdicts.
	return fmt.Errorf("%w: %v", ErrCorrupt, err)
}

// WritePlainFile writes the snapshot in stored to dst (created or
// truncated, fsynced), as WritePlain does; on any error dst is removed.
func WritePlainFile(ctx context.Context, dst string, stored io.Reader, f Form, ids []age.Identity, progress func(int64)) (Plain, error) {
	out, err := os.OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o600)
	if err != nil {
		return Plain{}, err
	}
	p, err := WritePlain(ctx, out, stored, f, ids, progress)
	if err == nil {
		err = out.Sync()
	}
	if cerr := out.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		os.Remove(dst)
		return Plain{}, err
	}
	return p, nil
}

// SniffForm reads the start of a file and says how it is stored: age
// encryption is recognised by its header; compression under encryption
// can only be seen after decrypting, so it is reported for plain files
// only, and WritePlain's caller must pass an encrypted file through
// Unpack.
func SniffForm(path string) (Form, error) {
	f, err := os.Open(path)
	if err != nil {
		return Form{}, err
	}
	defer f.Close()
	head := make([]byte, len(crypt.Magic))
	n, _ := io.ReadFull(f, head)
	head = head[:n]
	switch {
	case bytes.HasPrefix(head, crypt.Magic):
		return Form{Encryption: ebv1.EncryptionAge}, nil
	case bytes.HasPrefix(head, zstdMagic):
		return Form{Compression: ebv1.CompressionZstd}, nil
	}
	return Form{}, nil
}

// Unpack returns the path of the etcd snapshot in file: file itself when
// it is a plain snapshot, or, when it is zstd-compressed (a stored backup
// downloaded with --raw), a plain copy in dir, whose trailer is checked on
// the way. An encrypted file needs UnpackWith.
func Unpack(ctx context.Context, file, dir string) (string, error) {
	return UnpackWith(ctx, file, dir, nil)
}

// UnpackWith is Unpack that also decrypts an age-encrypted file with ids.
func UnpackWith(ctx context.Context, file, dir string, ids []age.Identity) (string, error) {
	form, err := SniffForm(file)
	if err != nil {
		return "", err
	}
	if form == (Form{}) {
		return file, nil
	}
	in, err := os.Open(file)
	if err != nil {
		return "", err
	}
	defer in.Close()
	var r io.Reader = in
	if form.Encryption != "" {
		// What is under the encryption decides the compression.
		pr, err := crypt.Decrypt(in, ids)
		if err != nil {
			return "", plainError(ctx, &ctxio.Recorder{}, err)
		}
		br := bufio.NewReader(pr)
		if head, _ := br.Peek(len(zstdMagic)); bytes.Equal(head, zstdMagic) {
			form.Compression = ebv1.CompressionZstd
		}
		r = br
		form.Encryption = "" // already undone
	}
	out := filepath.Join(dir, filepath.Base(file)+".db")
	if _, err := WritePlainFile(ctx, out, r, form, nil, nil); err != nil {
		return "", err
	}
	return out, nil
}
