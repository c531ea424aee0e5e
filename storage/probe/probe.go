// Package probe checks a storage location before the day a backup needs
// it: a round trip with probe objects of its own — write, multipart
// write, ranged read, listing, conditional create, checksums, object
// lock, delete — through the same storage.Location calls backups take,
// each step reported with what the store does not support and the
// setting that works around it.
//
// Probes are named storage.ProbePrefix and a random suffix, which no
// backup name can be and no listing of the server's shows (see
// storage.ProbePrefix); every check removes what it wrote, even after a
// failed step, and removes the probes an interrupted check left (older
// than an hour) when it finds them in its listing.
package probe

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"regexp"
	"time"

	"github.com/dustin/go-humanize"

	ebv1 "github.com/kubectl-etcdbackup/kubectl-etcdbackup/api/etcdbackup/v1"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/storage"
)

// Results of a step.
const (
	ResultOK     = "ok"
	ResultFailed = "failed"
	// ResultSkipped: the store or its configuration has no such thing,
	// or an earlier step it needs failed.
	ResultSkipped = "skipped"
)

// The steps, in the order they run.
const (
	StepWrite             = "write"
	StepMultipartWrite    = "multipart write"
	StepRangedRead        = "ranged read"
	StepList              = "list"
	StepConditionalCreate = "conditional create"
	StepChecksums         = "checksums"
	StepObjectLock        = "object lock"
	StepDelete            = "delete"
)

const (
	// DefaultStepTimeout bounds each step when Options.StepTimeout is
	// zero; the storage calls within have their own, shorter bounds.
	DefaultStepTimeout = time.Minute
	// maxMultipartBytes bounds the multipart probe: with a larger part
	// size the step is skipped rather than write that much.
	maxMultipartBytes = 64 << 20
	// smallSize is the size of the write step's probe.
	smallSize = 16 << 10
	// leftoverAge is how old a probe in a listing must be to be taken
	// for an interrupted check's: no check runs that long.
	leftoverAge = time.Hour
	// cleanupTimeout bounds the removal of what a check wrote once it
	// ended, whatever ended it.
	cleanupTimeout = 10 * time.Second
	// maxDetail bounds a step's detail: a store's error can be long.
	maxDetail = 1024
)

// Step is one step of a check.
type Step struct {
	// Name is one of the Step* constants.
	Name string
	// Result is ResultOK, ResultFailed or ResultSkipped.
	Result string
	// Detail says what happened; for a failure, the store's error,
	// without any secret.
	Detail string
	// Advice is what to do about a failure: the setting or permission
	// that works around it.
	Advice   string
	Duration time.Duration
}

// Result is a check's steps, in the order they ran.
type Result struct {
	Steps []Step
}

// Failed are the steps that failed.
func (r Result) Failed() []Step {
	var out []Step
	for _, s := range r.Steps {
		if s.Result == ResultFailed {
			out = append(out, s)
		}
	}
	return out
}

// OK reports whether no step failed.
func (r Result) OK() bool { return len(r.Failed()) == 0 }

// Options tune Run.
type Options struct {
	// StepTimeout bounds each step; DefaultStepTimeout when zero.
	StepTimeout time.Duration
	// Now is the clock; nil is time.Now.
	Now func() time.Time
}

// Run checks loc, step by step, within ctx. A store with features of
// its own (storage.Prober, found through the server's wrappers with
// storage.As) also has those tried; for others those steps are skipped.
// It never touches a backup. What it wrote is removed before it returns,
// even when a step failed or ctx ended (then within a short bound of its
// own).
func Run(ctx context.Context, loc storage.Location, opts Options) Result {
	if opts.StepTimeout <= 0 {
		opts.StepTimeout = DefaultStepTimeout
	}
	if opts.Now == nil {
		opts.Now = time.Now
	}
	c := &check{loc: loc, opts: opts, stored: map[string]bool{}, written: map[string]bool{}}
	c.prober, _ = storage.As[storage.Prober](loc)
	c.name = storage.ProbePrefix + randomHex()
	c.bigName = c.name + "-multipart"
	c.secondName = c.name + "-second"
	defer c.cleanup(ctx)
	for _, s := range []struct {
		name string
		fn   func(context.Context) outcome
	}{
		{StepWrite, c.write},
		{StepMultipartWrite, c.multipartWrite},
		{StepRangedRead, c.rangedRead},
		{StepList, c.list},
		{StepConditionalCreate, c.conditionalCreate},
		{StepChecksums, c.checksums},
		{StepObjectLock, c.objectLock},
		{StepDelete, c.delete},
	} {
		c.run(ctx, s.name, s.fn)
	}
	return Result{Steps: c.steps}
}

// check is one Run.
type check struct {
	loc    storage.Location
	prober storage.Prober // nil: the store has nothing of its own to try
	opts   Options

	// name is the probe's; bigName the multipart write's, secondName the
	// conditional create's.
	name, bigName, secondName string
	small, big                []byte
	partSize                  int64
	// stored are the names whose upload was committed; written those
	// that may be stored (a commit that failed may have stored a part),
	// which the check removes.
	stored, written map[string]bool
	steps           []Step
}

// outcome is what a step's function found.
type outcome struct {
	result, detail, advice string
}

func ok(format string, args ...any) outcome {
	return outcome{result: ResultOK, detail: fmt.Sprintf(format, args...)}
}

func skipped(format string, args ...any) outcome {
	return outcome{result: ResultSkipped, detail: fmt.Sprintf(format, args...)}
}

// failed is a step that failed with err in the storage call op
// ("create", "write", "commit", "open", "read", "list", "delete"; "" when
// no call failed): its advice is the store's, else advice.
func (c *check) failed(op string, err error, advice string) outcome {
	if a := c.adviceFor(op, err); a != "" {
		advice = a
	}
	return outcome{result: ResultFailed, detail: err.Error(), advice: advice}
}

// run runs one step within its bound and records it.
func (c *check) run(ctx context.Context, name string, fn func(context.Context) outcome) {
	start := c.opts.Now()
	var o outcome
	if err := context.Cause(ctx); err != nil {
		o = skipped("the check ended before this step: %v", err)
	} else {
		sctx, cancel := context.WithTimeout(ctx, c.opts.StepTimeout)
		o = fn(sctx)
		cancel()
	}
	c.steps = append(c.steps, Step{
		Name: name, Result: o.result, Detail: clip(scrub(o.detail)), Advice: scrub(o.advice),
		Duration: c.opts.Now().Sub(start),
	})
}

// passed reports whether the step called name passed.
func (c *check) passed(name string) bool {
	for _, s := range c.steps {
		if s.Name == name {
			return s.Result == ResultOK
		}
	}
	return false
}

// write stores a small probe, as an upload does, and reads it back whole.
func (c *check) write(ctx context.Context) outcome {
	var err error
	if c.small, err = randomBytes(smallSize); err != nil {
		return c.failed("", err, "")
	}
	if op, err := c.put(ctx, c.name, c.small); err != nil {
		return c.failed(op, err, "")
	}
	if op, err := c.readBack(ctx, c.name, c.small, 0, 0); err != nil {
		return c.failed(op, err, "")
	}
	return ok("%s stored with its manifest and read back whole", humanize.IBytes(smallSize))
}

// multipartWrite stores a probe larger than one part: an S3 multipart
// upload of two parts, as every backup larger than a part is.
func (c *check) multipartWrite(ctx context.Context) outcome {
	if c.prober == nil {
		return skipped("a %s location stores every backup in one piece", c.loc.Type())
	}
	c.partSize = c.prober.ProbePartSize()
	if c.partSize <= 0 {
		return skipped("the location does not cut uploads into parts")
	}
	if c.partSize > maxMultipartBytes {
		return skipped("the part size is %s: the check writes at most %s", humanize.IBytes(uint64(c.partSize)), humanize.IBytes(maxMultipartBytes))
	}
	var err error
	if c.big, err = randomBytes(int(c.partSize) + smallSize); err != nil {
		return c.failed("", err, "")
	}
	if op, err := c.put(ctx, c.bigName, c.big); err != nil {
		return c.failed(op, err, "")
	}
	return ok("%s stored in 2 parts of at most %s", humanize.IBytes(uint64(len(c.big))), humanize.IBytes(uint64(c.partSize)))
}

// rangedRead reads a range of a probe as a resumed or parallel download
// does: across the part boundary of the multipart probe when there is one.
func (c *check) rangedRead(ctx context.Context) outcome {
	name, data, off, length := c.name, c.small, int64(smallSize/4), int64(smallSize/2)
	if c.passed(StepMultipartWrite) {
		name, data, off, length = c.bigName, c.big, c.partSize-smallSize/2, smallSize
	} else if !c.passed(StepWrite) {
		return skipped("nothing to read: the write step failed")
	}
	if op, err := c.readBack(ctx, name, data, off, length); err != nil {
		return c.failed(op, err, "")
	}
	return ok("bytes %d-%d of %s read back as written", off, off+length-1, humanize.IBytes(uint64(len(data))))
}

// list lists the location as every listing of backups does and finds the
// probes there; probes an interrupted check left are removed.
func (c *check) list(ctx context.Context) outcome {
	ms, err := c.loc.List(ctx)
	if err != nil {
		return c.failed("list", err, "")
	}
	listed := map[string]bool{}
	var leftovers []string
	for _, m := range ms {
		listed[m.Name] = true
		if storage.IsProbe(m.Name) && !c.stored[m.Name] && c.opts.Now().Sub(m.CreateTime) > leftoverAge {
			leftovers = append(leftovers, m.Name)
		}
	}
	for _, name := range []string{c.name, c.bigName} {
		if c.stored[name] && !listed[name] {
			return c.failed("", fmt.Errorf("the probe %q, stored, is not in the location's listing of %d", name, len(ms)), "")
		}
	}
	removed := 0
	for _, name := range leftovers {
		if err := c.loc.Delete(ctx, name); err == nil {
			removed++
		}
	}
	detail := fmt.Sprintf("the probe is in the listing (%d entries)", len(ms))
	if !c.stored[c.name] {
		detail = fmt.Sprintf("the location lists (%d entries); no probe was stored to look for", len(ms))
	}
	if removed > 0 {
		detail += fmt.Sprintf("; removed %d probe(s) an interrupted check left", removed)
	}
	return ok("%s", detail)
}

// conditionalCreate has two uploads of one name race, as two writers of
// a backup would: exactly one may publish it, and a later upload of it
// is refused. A store with create-only writes of its own has them tried.
func (c *check) conditionalCreate(ctx context.Context) outcome {
	data := c.small
	if data == nil {
		var err error
		if data, err = randomBytes(smallSize); err != nil {
			return c.failed("", err, "")
		}
	}
	first, err := c.loc.Create(ctx, c.secondName)
	if err != nil {
		return c.failed("create", err, "")
	}
	second, err := c.loc.Create(ctx, c.secondName)
	if err != nil {
		_ = first.Abort()
		return c.failed("create", fmt.Errorf("a second upload of a name not yet published: %w", err), "")
	}
	for _, u := range []storage.Upload{first, second} {
		if _, err := u.Write(data); err != nil {
			_, _ = first.Abort(), second.Abort()
			return c.failed("write", err, "")
		}
	}
	c.written[c.secondName] = true
	if err := first.Commit(ctx, c.manifest(c.secondName, data)); err != nil {
		_, _ = first.Abort(), second.Abort()
		return c.failed("commit", err, "")
	}
	c.stored[c.secondName] = true
	err = second.Commit(ctx, c.manifest(c.secondName, data))
	if err != nil {
		_ = second.Abort()
	}
	switch {
	case err == nil:
		return c.failed("", errors.New("both of two uploads of one name were published: the second replaced the first"), "")
	case !errors.Is(err, storage.ErrAlreadyExists):
		return c.failed("commit", fmt.Errorf("the second of two uploads of one name: %w", err), "")
	}
	if u, err := c.loc.Create(ctx, c.secondName); err == nil {
		_ = u.Abort()
		return c.failed("", errors.New("an upload of a published name was accepted"), "")
	} else if !errors.Is(err, storage.ErrAlreadyExists) {
		return c.failed("create", err, "")
	}
	detail := "of two uploads of one name the second was refused, and so was a later one"
	if c.prober != nil {
		r := c.prober.ProbeConditionalWrite(ctx, c.name)
		if r.Err != nil {
			return c.failed("", r.Err, r.Advice)
		}
		detail += "; " + orSkipped(r)
	}
	return ok("%s", detail)
}

// checksums has the store's request checksums tried.
func (c *check) checksums(ctx context.Context) outcome {
	if c.prober == nil {
		return skipped("a %s location sends no request checksums; the SHA-256 each backup's manifest records is checked on every read", c.loc.Type())
	}
	return c.tried(c.prober.ProbeChecksums(ctx, c.name))
}

// objectLock tries the object lock a location asks for (the store
// keeping backups from deletion until their retention passes): the
// Prober writes a probe with a retention of seconds in the configured
// mode, reads it back, is refused its deletion, and removes it once the
// retention passed.
func (c *check) objectLock(ctx context.Context) outcome {
	if c.prober == nil {
		return skipped("the location does not ask for object lock")
	}
	return c.tried(c.prober.ProbeObjectLock(ctx, c.name))
}

// tried is the outcome of one of the Prober's own tries.
func (c *check) tried(r storage.ProbeResult) outcome {
	switch {
	case r.Err != nil:
		return c.failed("", r.Err, r.Advice)
	case r.Skipped != "":
		return skipped("%s", r.Skipped)
	}
	return ok("%s", r.Detail)
}

// delete removes the probes as delete and retention remove backups, and
// finds them gone.
func (c *check) delete(ctx context.Context) outcome {
	stored := c.names(c.stored)
	for _, name := range c.names(c.written) {
		err := c.loc.Delete(ctx, name)
		if err != nil && !errors.Is(err, storage.ErrNotFound) && c.stored[name] {
			return c.failed("delete", err, "")
		}
		if err == nil || errors.Is(err, storage.ErrNotFound) {
			delete(c.written, name)
		}
	}
	if len(stored) == 0 {
		return skipped("no probe was stored to delete")
	}
	for _, name := range stored {
		if _, err := c.loc.Stat(ctx, name); err == nil {
			return c.failed("", fmt.Errorf("the probe %q is still there once deleted", name), "")
		} else if !errors.Is(err, storage.ErrNotFound) {
			return c.failed("open", err, "")
		}
	}
	return ok("%d probe(s) deleted and gone", len(stored))
}

// cleanup removes whatever the steps may have left, even after ctx
// ended.
func (c *check) cleanup(ctx context.Context) {
	names := c.names(c.written)
	if len(names) == 0 {
		return
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cleanupTimeout)
	defer cancel()
	for _, name := range names {
		_ = c.loc.Delete(ctx, name)
	}
}

// names are the check's names in set, in the order they are written.
func (c *check) names(set map[string]bool) []string {
	var out []string
	for _, name := range []string{c.name, c.bigName, c.secondName} {
		if set[name] {
			out = append(out, name)
		}
	}
	return out
}

// put stores data as a backup called name is stored; op names the call
// that failed.
func (c *check) put(ctx context.Context, name string, data []byte) (op string, err error) {
	u, err := c.loc.Create(ctx, name)
	if err != nil {
		return "create", err
	}
	if _, err := u.Write(data); err != nil {
		_ = u.Abort()
		return "write", err
	}
	c.written[name] = true
	if err := u.Commit(ctx, c.manifest(name, data)); err != nil {
		_ = u.Abort()
		return "commit", err
	}
	c.stored[name] = true
	return "", nil
}

// readBack reads length bytes (0: to the end) of name from off and
// compares them with data's.
func (c *check) readBack(ctx context.Context, name string, data []byte, off, length int64) (op string, err error) {
	r, m, err := c.loc.Open(ctx, name, off, length)
	if err != nil {
		return "open", err
	}
	defer r.Close()
	want := data[off:]
	if length > 0 {
		want = want[:length]
	}
	got, err := io.ReadAll(io.LimitReader(r, int64(len(want))+1))
	if err != nil {
		return "read", err
	}
	switch {
	case m.Size != int64(len(data)):
		return "", fmt.Errorf("the manifest read back says %d bytes, %d were stored", m.Size, len(data))
	case !bytes.Equal(got, want):
		return "", fmt.Errorf("bytes %d-%d read back (%d) are not those written (%d)", off, off+int64(len(want))-1, len(got), len(want))
	}
	return "", nil
}

// manifest is the manifest of a probe holding data.
func (c *check) manifest(name string, data []byte) *storage.Manifest {
	sum := sha256.Sum256(data)
	return &storage.Manifest{
		Name: name, Size: int64(len(data)), SHA256: hex.EncodeToString(sum[:]), CreateTime: c.opts.Now().UTC(),
		Source: storage.Source{Kind: ebv1.SourceUpload, Description: "location check"},
	}
}

// adviceFor is the advice for err of op: the store's, else what any
// location's errors say.
func (c *check) adviceFor(op string, err error) string {
	if c.prober != nil && op != "" {
		if a := c.prober.ProbeAdvice(op, err); a != "" {
			return a
		}
	}
	switch {
	case errors.Is(err, storage.ErrNoSpace):
		return "the location is full: free space in it or make its volume larger"
	case errors.Is(err, storage.ErrReadOnly):
		return "the location was opened read-only: check it where it is written, on the server"
	case errors.Is(err, fs.ErrPermission):
		return fmt.Sprintf("the server may not change files under %s: give the user it runs as write access there (the volume's owner or fsGroup)", c.loc.Describe())
	}
	return ""
}

// orSkipped is what a store's try found: its detail, or why it did not run.
func orSkipped(r storage.ProbeResult) string {
	if r.Skipped != "" {
		return r.Skipped
	}
	return r.Detail
}

func randomBytes(n int) ([]byte, error) {
	b := make([]byte, n)
	if _, err := rand.Read(b); err != nil {
		return nil, fmt.Errorf("make the probe's data: %w", err)
	}
	return b, nil
}

func randomHex() string {
	b := make([]byte, 8)
	_, _ = rand.Read(b) // never fails (crypto/rand)
	return hex.EncodeToString(b)
}

var (
	// signedParts are the parts of a signed request that are secrets or
	// open doors: presigned URLs' query parameters, an Authorization
	// header's credential and signature.
	signedParts = regexp.MustCompile(`(?i)\b((?:x-amz-)?(?:signature|credential|security-token))=[^&,\s"']+`)
	// userInfo is a URL's user:password@.
	userInfo = regexp.MustCompile(`://[^/\s@]+@`)
	// accessKeyIDs are AWS access key IDs (long-term and temporary).
	accessKeyIDs = regexp.MustCompile(`\b(?:AKIA|ASIA)[A-Z0-9]{16}\b`)
)

// scrub removes from a store's message whatever could be a credential.
// The backends put none in their errors; this holds for what a store
// or a proxy in front of it echoes back.
func scrub(s string) string {
	s = signedParts.ReplaceAllString(s, "$1=REDACTED")
	s = userInfo.ReplaceAllString(s, "://REDACTED@")
	return accessKeyIDs.ReplaceAllString(s, "REDACTED")
}

// clip bounds a detail to maxDetail bytes.
func clip(s string) string {
	if len(s) <= maxDetail {
		return s
	}
	return s[:maxDetail] + "…"
}
