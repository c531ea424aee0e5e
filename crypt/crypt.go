// Package crypt encrypts and decrypts backup streams with age
// (filippo.io/age, the age v1 file format): it parses recipients (public
// keys, which may be written anywhere) and identities (secret keys, which
// are only ever read from files), seals a stream to recipients and opens
// it with identities. age works in 64 KiB authenticated chunks, so memory
// stays flat whatever the stream's size, and a damaged or altered chunk
// is an error, never wrong plaintext. Errors name files and line numbers,
// never key material.
package crypt

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"

	"filippo.io/age"

	ebv1 "github.com/kubectl-etcdbackup/kubectl-etcdbackup/api/etcdbackup/v1"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/internal/ctxio"
)

// Errors callers act on.
var (
	// ErrIdentityRequired: the data is encrypted and no identity was given.
	ErrIdentityRequired = errors.New("the backup is encrypted: an age identity (secret key) is needed to read it")
	// ErrNoMatchingIdentity: none of the identities given is one the data
	// was encrypted to.
	ErrNoMatchingIdentity = errors.New("none of the age identities given can decrypt this backup")
	// ErrTampered: the encrypted data is damaged, truncated or was altered.
	ErrTampered = errors.New("the encrypted data is damaged or was altered (age authentication failed)")
	// ErrNotAge: the data does not start with an age header.
	ErrNotAge = errors.New("the data is not an age-encrypted file")
)

// Magic starts every age v1 file.
var Magic = []byte("age-encryption.org/v1\n")

// secretPrefix starts every native age identity; a value with it given as
// a recipient is a secret key in the wrong place and is never echoed.
const secretPrefix = "AGE-SECRET-KEY-"

// ParseRecipient parses one recipient: a native X25519 ("age1...") or
// hybrid post-quantum ("age1pq1...") public key. The error never repeats
// a value that looks like a secret key.
func ParseRecipient(s string) (age.Recipient, error) {
	s = strings.TrimSpace(s)
	switch {
	case strings.HasPrefix(strings.ToUpper(s), secretPrefix):
		return nil, errors.New("this is an age identity (a secret key), not a recipient: give its public key, which `age-keygen -y KEYFILE` prints; the secret key must never be in a configuration or on a command line")
	case s == "":
		return nil, errors.New("empty recipient")
	case len(s) > ebv1.MaxAgeRecipientLength:
		return nil, fmt.Errorf("recipient of %d characters is longer than %d", len(s), ebv1.MaxAgeRecipientLength)
	case strings.HasPrefix(s, "age1pq1"):
		r, err := age.ParseHybridRecipient(s)
		if err != nil {
			return nil, fmt.Errorf("recipient %q: %v", s, err)
		}
		return r, nil
	case strings.HasPrefix(s, "age1"):
		r, err := age.ParseX25519Recipient(s)
		if err != nil {
			return nil, fmt.Errorf("recipient %q: %v", s, err)
		}
		return r, nil
	}
	return nil, fmt.Errorf("recipient %q is not an age public key (age1...); make one with age-keygen", truncate(s, 16))
}

// ParseRecipients parses keys (see ParseRecipient) and checks they can be
// used together: age refuses to mix post-quantum and classic recipients.
func ParseRecipients(keys []string) ([]age.Recipient, error) {
	if len(keys) == 0 {
		return nil, errors.New("no age recipients given")
	}
	if len(keys) > ebv1.MaxAgeRecipients {
		return nil, fmt.Errorf("%d age recipients given, at most %d are allowed", len(keys), ebv1.MaxAgeRecipients)
	}
	out := make([]age.Recipient, 0, len(keys))
	for _, k := range keys {
		r, err := ParseRecipient(k)
		if err != nil {
			return nil, err
		}
		out = append(out, r)
	}
	// age.Encrypt checks compatibility while writing the header; writing
	// one to nowhere costs microseconds.
	if _, err := age.Encrypt(io.Discard, out...); err != nil {
		return nil, err
	}
	return out, nil
}

// ReadRecipientsFile reads the public keys in a file, one per line, with
// empty lines and lines starting with # ignored (age's -R format).
func ReadRecipientsFile(path string) ([]string, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var keys []string
	sc := bufio.NewScanner(io.LimitReader(f, 1<<20))
	line := 0
	for sc.Scan() {
		line++
		s := strings.TrimSpace(sc.Text())
		if s == "" || strings.HasPrefix(s, "#") {
			continue
		}
		if _, err := ParseRecipient(s); err != nil {
			return nil, fmt.Errorf("%s line %d: %w", path, line, err)
		}
		keys = append(keys, s)
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("read %s: %w", path, err)
	}
	if len(keys) == 0 {
		return nil, fmt.Errorf("%s holds no age recipient", path)
	}
	return keys, nil
}

// ReadIdentityFiles reads age identity files (age-keygen's output: secret
// keys, one per line, # comments). Errors name the file, never its content.
func ReadIdentityFiles(paths ...string) ([]age.Identity, error) {
	var ids []age.Identity
	for _, p := range paths {
		f, err := os.Open(p)
		if err != nil {
			return nil, fmt.Errorf("age identity file: %w", err)
		}
		got, err := age.ParseIdentities(f)
		f.Close()
		if err != nil {
			// age's parse errors give line numbers and never the key.
			return nil, fmt.Errorf("age identity file %s: %v (it must hold AGE-SECRET-KEY-... lines, as age-keygen writes)", p, err)
		}
		ids = append(ids, got...)
	}
	return ids, nil
}

// ReadIdentityDir reads every file in dir as an identity file, skipping
// names that start with a dot: a mounted Secret's keys, whatever they are
// called (the volume's own ..data links are dotted).
func ReadIdentityDir(dir string) ([]age.Identity, error) {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil, fmt.Errorf("age identities: %w", err)
	}
	var paths []string
	for _, e := range entries {
		if strings.HasPrefix(e.Name(), ".") {
			continue
		}
		p := filepath.Join(dir, e.Name())
		if st, err := os.Stat(p); err == nil && st.Mode().IsRegular() {
			paths = append(paths, p)
		}
	}
	if len(paths) == 0 {
		return nil, fmt.Errorf("age identities: %s holds no file", dir)
	}
	return ReadIdentityFiles(paths...)
}

// Encrypt returns a reader of r's bytes as an age file to recipients. It
// reads r as it is read, in age's 64 KiB chunks, and stops when ctx is
// done.
func Encrypt(ctx context.Context, r io.Reader, recipients []age.Recipient) (io.Reader, error) {
	if len(recipients) == 0 {
		return nil, errors.New("encrypt: no age recipients")
	}
	return age.EncryptReader(ctxio.NewReader(ctx, r), recipients...)
}

// Decrypt returns a reader of the plaintext of the age file r. It fails
// at once, before any plaintext, with ErrIdentityRequired,
// ErrNoMatchingIdentity, ErrNotAge or ErrTampered (a header whose MAC does
// not verify); reading fails with ErrTampered at the first chunk that does
// not authenticate, including a truncated end. An error of r itself is
// passed on unchanged.
func Decrypt(r io.Reader, ids []age.Identity) (io.Reader, error) {
	if len(ids) == 0 {
		return nil, ErrIdentityRequired
	}
	src := &ctxio.Recorder{R: r}
	// A damaged header after age's first line is tampering; without that
	// line the data was never age-encrypted.
	br := bufio.NewReader(src)
	intro, _ := br.Peek(len(ageIntro))
	notAge := string(intro) != ageIntro // before Decrypt reads on: Peek's bytes are only valid until then
	pr, err := age.Decrypt(br, ids...)
	if err != nil {
		return nil, classify(src, err, notAge)
	}
	return &plainReader{src: src, r: pr}, nil
}

// ageIntro is the first line of every age file (the age format's version
// line).
const ageIntro = "age-encryption.org/v1\n"

// classify tells r's own failures from age's verdicts on the data;
// notAge says the data does not start as an age file.
func classify(src *ctxio.Recorder, err error, notAge bool) error {
	if src.Err != nil && !errors.Is(src.Err, io.EOF) {
		return src.Err
	}
	var nm *age.NoIdentityMatchError
	switch {
	case errors.As(err, &nm):
		return fmt.Errorf("%w (it is encrypted to other keys: see the backup's recipients)", ErrNoMatchingIdentity)
	case notAge && strings.Contains(err.Error(), "failed to read header"):
		return fmt.Errorf("%w: %v", ErrNotAge, err)
	}
	return fmt.Errorf("%w: %v", ErrTampered, err)
}

type plainReader struct {
	src *ctxio.Recorder
	r   io.Reader
}

func (p *plainReader) Read(b []byte) (int, error) {
	n, err := p.r.Read(b)
	if err != nil && !errors.Is(err, io.EOF) {
		err = classify(p.src, err, false)
	}
	return n, err
}

// Header is what can be read from an age file without a key.
type Header struct {
	// StanzaTypes are the recipient stanzas' types ("X25519",
	// "mlkem768x25519", ...), one per recipient the file is encrypted to.
	StanzaTypes []string
}

// ReadHeader reads and checks the syntax of the age header at the start of
// r (its MAC can only be checked with a key). It reads no further than the
// header, but through a buffer: the caller should not use r afterwards.
func ReadHeader(r io.Reader) (Header, error) {
	src := &ctxio.Recorder{R: r}
	hdr, err := age.ExtractHeader(src)
	if err != nil {
		if src.Err != nil && !errors.Is(src.Err, io.EOF) {
			return Header{}, src.Err
		}
		return Header{}, fmt.Errorf("%w: %v", ErrNotAge, err)
	}
	var h Header
	for _, line := range bytes.Split(hdr, []byte("\n")) {
		if rest, ok := bytes.CutPrefix(line, []byte("-> ")); ok {
			typ, _, _ := bytes.Cut(rest, []byte(" "))
			h.StanzaTypes = append(h.StanzaTypes, string(typ))
		}
	}
	return h, nil
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "…"
}
