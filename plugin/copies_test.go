package plugin

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/types/known/timestamppb"

	ebv1 "github.com/kubectl-etcdbackup/kubectl-etcdbackup/api/etcdbackup/v1"
)

// Unit tests of how the plugin shows copies (a location's backups the
// server copied to its copy locations), on constructed backups; the
// tests against a real server are in copies_server_test.go.

var copiesNow = time.Date(2026, 12, 6, 7, 30, 0, 0, time.UTC)

func ts(t time.Time) *timestamppb.Timestamp { return timestamppb.New(t) }

// backupAt is a completed backup called name in location with the
// given SHA-256.
func backupAt(name, location, sum string) *ebv1.Backup {
	return &ebv1.Backup{Name: name, Location: location, Sha256: sum, Phase: ebv1.BackupPhase_BACKUP_PHASE_COMPLETED,
		CreateTime: ts(copiesNow.Add(-time.Hour))}
}

// copyAt is the copy in location of a backup of from.
func copyAt(name, location, sum, from string) *ebv1.Backup {
	b := backupAt(name, location, sum)
	b.CopyOf = &ebv1.BackupCopyOf{Location: from, CopyTime: ts(copiesNow.Add(-30 * time.Minute))}
	return b
}

func copyState(location string, s ebv1.BackupCopyState) *ebv1.BackupCopy {
	return &ebv1.BackupCopy{Location: location, State: s}
}

func TestCopiesColumnStrings(t *testing.T) {
	const (
		copied   = ebv1.BackupCopyState_BACKUP_COPY_STATE_COPIED
		pending  = ebv1.BackupCopyState_BACKUP_COPY_STATE_PENDING
		retrying = ebv1.BackupCopyState_BACKUP_COPY_STATE_RETRYING
	)
	failing := copyState("offsite", retrying)
	failing.FailingSince, failing.NextAttempt = ts(copiesNow.Add(-3*time.Minute)), ts(copiesNow.Add(time.Minute))
	for _, c := range []struct {
		name   string
		copies []*ebv1.BackupCopy
		copyOf string
		folded []*ebv1.Backup
		want   string
	}{
		{name: "no copies", want: "<none>"},
		{name: "copied", copies: []*ebv1.BackupCopy{copyState("offsite", copied)}, want: "2/2"},
		{name: "pending", copies: []*ebv1.BackupCopy{copyState("offsite", pending)}, want: "1/2 offsite: pending"},
		{name: "retrying", copies: []*ebv1.BackupCopy{failing}, want: "1/2 offsite: retrying 3m"},
		{name: "retrying, since unknown", copies: []*ebv1.BackupCopy{copyState("offsite", retrying)}, want: "1/2 offsite: retrying"},
		{name: "conflict", copies: []*ebv1.BackupCopy{copyState("offsite", ebv1.BackupCopyState_BACKUP_COPY_STATE_CONFLICT)}, want: "1/2 offsite: conflict"},
		{name: "skipped", copies: []*ebv1.BackupCopy{copyState("offsite", ebv1.BackupCopyState_BACKUP_COPY_STATE_SKIPPED)}, want: "1/2 offsite: deleted"},
		{name: "unknown", copies: []*ebv1.BackupCopy{copyState("offsite", ebv1.BackupCopyState_BACKUP_COPY_STATE_UNKNOWN)}, want: "1/2 offsite: unknown"},
		{name: "a state this build does not name", copies: []*ebv1.BackupCopy{copyState("offsite", 42)}, want: "1/2 offsite: unknown"},
		{name: "several", copies: []*ebv1.BackupCopy{copyState("offsite", copied), copyState("tape", pending), copyState("dr", ebv1.BackupCopyState_BACKUP_COPY_STATE_CONFLICT)},
			want: "2/4 tape: pending, dr: conflict"},
		{name: "a copy", copyOf: "default", want: "copy of default"},
		// A copy listed beside it that the server's copies do not name
		// (its location no longer a copy location) counts as held.
		{name: "folded, not in copies", folded: []*ebv1.Backup{copyAt("x", "offsite", "s", "default")}, want: "2/2"},
		{name: "folded and in copies", copies: []*ebv1.BackupCopy{copyState("offsite", copied)},
			folded: []*ebv1.Backup{copyAt("x", "offsite", "s", "default"), copyAt("x", "tape", "s", "offsite")}, want: "3/3"},
		// The server's word wins over a listing a moment older.
		{name: "folded but pending", copies: []*ebv1.BackupCopy{copyState("offsite", pending)},
			folded: []*ebv1.Backup{copyAt("x", "offsite", "s", "default")}, want: "1/2 offsite: pending"},
	} {
		b := backupAt("x", "default", "s")
		b.Copies = c.copies
		if c.copyOf != "" {
			b = copyAt("x", "offsite", "s", c.copyOf)
		}
		if got := copiesString(b, c.folded, copiesNow); got != c.want {
			t.Errorf("%s: COPIES %q, want %q", c.name, got, c.want)
		}
	}
}

func TestCopiesColumnShownOnlyWithCopies(t *testing.T) {
	plain := []*ebv1.Backup{backupAt("a", "default", "1"), backupAt("b", "s3", "2")}
	for _, wide := range []bool{false, true} {
		var out bytes.Buffer
		if err := printBackupTable(&out, plain, nil, wide, false, copiesNow); err != nil {
			t.Fatal(err)
		}
		if strings.Contains(out.String(), "COPIES") {
			t.Errorf("wide=%v: COPIES without copies:\n%s", wide, out.String())
		}
	}
	withCopy := append(plain, copyAt("a", "offsite", "1", "default"))
	var out bytes.Buffer
	if err := printBackupTable(&out, withCopy, nil, false, false, copiesNow); err != nil {
		t.Fatal(err)
	}
	header, rows := parseTable(t, out.String())
	if want := "NAME LOCATION PHASE SIZE AGE VERIFIED COPIES"; strings.Join(header, " ") != want {
		t.Fatalf("header %v, want %s", header, want)
	}
	if rows[0]["COPIES"] != "<none>" || rows[2]["COPIES"] != "copy of default" {
		t.Errorf("rows %v", rows)
	}
	out.Reset()
	if err := printBackupTable(&out, withCopy, nil, true, false, copiesNow); err != nil {
		t.Fatal(err)
	}
	header, _ = parseTable(t, out.String())
	if got := strings.Join(header, " "); !strings.HasPrefix(got, "NAME LOCATION PHASE SIZE AGE VERIFIED COPIES SOURCE ") || !strings.HasSuffix(got, " LOCKED-UNTIL SHA256 LABELS") {
		t.Errorf("wide header %s", got)
	}
}

// Listing every location, a copy is folded into its original's row when
// the original is listed with the same bytes; a copy of a copy into the
// first listed backup it comes from.
func TestFoldCopies(t *testing.T) {
	orig := backupAt("x", "default", "s")
	orig.Copies = []*ebv1.BackupCopy{copyState("offsite", ebv1.BackupCopyState_BACKUP_COPY_STATE_COPIED)}
	cp := copyAt("x", "offsite", "s", "default")
	cpOfCp := copyAt("x", "tape", "s", "offsite")
	orphan := copyAt("gone", "offsite", "g", "default")      // its original deleted
	otherBytes := copyAt("y", "offsite", "other", "default") // not the same backup as default's y
	yOrig := backupAt("y", "default", "mine")                // the y otherBytes is not a copy of
	unlisted := copyAt("z", "offsite", "z", "nowhere")       // from a location not listed
	noSum := copyAt("r", "offsite", "", "default")           // no SHA-256 to compare (running)
	rOrig := backupAt("r", "default", "")                    // noSum's original, running too
	bs := []*ebv1.Backup{orig, cp, cpOfCp, orphan, otherBytes, yOrig, unlisted, noSum, rOrig}
	rows, folded := foldCopies(bs)
	var got []string
	for _, b := range rows {
		got = append(got, b.GetName()+"@"+b.GetLocation())
	}
	if want := "x@default gone@offsite y@offsite y@default z@offsite r@offsite r@default"; strings.Join(got, " ") != want {
		t.Errorf("rows %s, want %s", strings.Join(got, " "), want)
	}
	if f := folded[orig]; len(f) != 2 || f[0] != cp || f[1] != cpOfCp {
		t.Errorf("folded into the original: %v", f)
	}
	var out bytes.Buffer
	if err := printBackupTable(&out, rows, folded, false, false, copiesNow); err != nil {
		t.Fatal(err)
	}
	_, table := parseTable(t, out.String())
	if table[0]["COPIES"] != "3/3" || table[1]["COPIES"] != "copy of default" || table[3]["COPIES"] != "<none>" {
		t.Errorf("table:\n%s", out.String())
	}

	// Copies naming each other (a bad answer: the server refuses
	// cycles) are both shown.
	a, b := copyAt("c", "offsite", "c", "tape"), copyAt("c", "tape", "c", "offsite")
	if rows, _ := foldCopies([]*ebv1.Backup{a, b}); len(rows) != 2 {
		t.Errorf("a cycle: rows %v", rows)
	}

	// Without the original listed (list --location offsite), each copy
	// is its own row.
	rows, _ = foldCopies([]*ebv1.Backup{cp, orphan})
	if len(rows) != 2 {
		t.Errorf("copies alone: rows %v", rows)
	}
}

// -o name prints the rows of the table (folded), the documents every
// backup listed, copies with status.copyOf.
func TestListFormatsAndCopies(t *testing.T) {
	orig := backupAt("x", "default", "s")
	bs := []*ebv1.Backup{orig, copyAt("x", "offsite", "s", "default"), backupAt("y", "offsite", "t")}
	format := func(f string, fold bool) string {
		t.Helper()
		pf := newPrintFlags(tableFormats)
		pf.OutputFormat = f
		if err := pf.Validate(); err != nil {
			t.Fatal(err)
		}
		var out bytes.Buffer
		if err := printBackupList(&out, pf, bs, fold); err != nil {
			t.Fatal(err)
		}
		return out.String()
	}
	if got := format("name", true); got != "backup/x\nbackup/y\n" {
		t.Errorf("-o name, folded: %q", got)
	}
	if got := format("name", false); got != "backup/x\nbackup/x\nbackup/y\n" {
		t.Errorf("-o name, one location: %q", got)
	}
	if got := format("jsonpath={range .items[*]}{.metadata.name}@{.spec.location}:{.status.copyOf.location} {end}", true); got != "x@default: x@offsite:default y@offsite: " {
		t.Errorf("-o jsonpath: %q", got)
	}
	if got := format("table", true); strings.Count(got, "\n") != 3 || !strings.Contains(got, "COPIES") {
		t.Errorf("table:\n%s", got)
	}
}

func TestBackupObjectCopies(t *testing.T) {
	b := backupAt("x", "default", "s")
	failing := copyState("tape", ebv1.BackupCopyState_BACKUP_COPY_STATE_RETRYING)
	failing.Message, failing.FailingSince, failing.NextAttempt = "connection refused", ts(copiesNow.Add(-3*time.Minute)), ts(copiesNow.Add(time.Minute))
	copied := copyState("offsite", ebv1.BackupCopyState_BACKUP_COPY_STATE_COPIED)
	copied.Sha256, copied.CopyTime = "s", ts(copiesNow.Add(-time.Minute))
	b.Copies = []*ebv1.BackupCopy{copied, failing}
	j, err := json.Marshal(backupObject(b).Status.Copies)
	if err != nil {
		t.Fatal(err)
	}
	want := `[{"location":"offsite","state":"Copied","copyTime":"2026-12-06T07:29:00Z","sha256":"s"},` +
		`{"location":"tape","state":"Retrying","message":"connection refused","nextAttempt":"2026-12-06T07:31:00Z","failingSince":"2026-12-06T07:27:00Z"}]`
	if string(j) != want {
		t.Errorf("status.copies\n%s\nwant\n%s", j, want)
	}
	if o := backupObject(b); o.Status.CopyOf != nil {
		t.Errorf("an original has status.copyOf %+v", o.Status.CopyOf)
	}
	j, err = json.Marshal(backupObject(copyAt("x", "offsite", "s", "default")).Status.CopyOf)
	if err != nil {
		t.Fatal(err)
	}
	if want := `{"location":"default","copyTime":"2026-12-06T07:00:00Z"}`; string(j) != want {
		t.Errorf("status.copyOf %s, want %s", j, want)
	}
	for s, want := range map[ebv1.BackupCopyState]string{
		ebv1.BackupCopyState_BACKUP_COPY_STATE_PENDING: "Pending", ebv1.BackupCopyState_BACKUP_COPY_STATE_CONFLICT: "Conflict",
		ebv1.BackupCopyState_BACKUP_COPY_STATE_SKIPPED: "Skipped", ebv1.BackupCopyState_BACKUP_COPY_STATE_UNKNOWN: "Unknown",
		ebv1.BackupCopyState_BACKUP_COPY_STATE_UNSPECIFIED: "Unknown",
	} {
		if got := copyStateString(s); got != want {
			t.Errorf("%v: %q, want %q", s, got, want)
		}
	}
}

func TestDescribeCopiesSection(t *testing.T) {
	b := backupAt("x", "default", "s")
	copied := copyState("offsite", ebv1.BackupCopyState_BACKUP_COPY_STATE_COPIED)
	copied.Sha256, copied.CopyTime = "s", ts(copiesNow.Add(-time.Minute))
	bad := copyState("dr", ebv1.BackupCopyState_BACKUP_COPY_STATE_CONFLICT)
	bad.Sha256, bad.Message = "other", `location "dr" holds another backup named "x"`
	failing := copyState("tape", ebv1.BackupCopyState_BACKUP_COPY_STATE_RETRYING)
	failing.Message, failing.FailingSince, failing.NextAttempt = "connection refused", ts(copiesNow.Add(-3*time.Minute)), ts(copiesNow.Add(2*time.Minute))
	b.Copies = []*ebv1.BackupCopy{copied, bad, failing}
	var out bytes.Buffer
	describeBackup(&out, b, copiesNow)
	got := out.String()
	for _, want := range []string{
		"Copies:\n  offsite:\n    State:\tCopied\n    Copied:\t2026-12-06T07:29:00Z (60s ago)\n    SHA256:\ts (the backup's)\n",
		"  dr:\n    State:\tConflict (",
		"    SHA256:\tother (NOT the backup's s)\n    Message:\tlocation \"dr\" holds another backup named \"x\"\n",
		"  tape:\n    State:\tRetrying (failing since 2026-12-06T07:27:00Z, 3m)\n    Message:\tconnection refused\n    Next Attempt:\t2026-12-06T07:32:00Z (in 2m)\n",
	} {
		if !strings.Contains(got, want) {
			t.Errorf("describe does not say %q:\n%s", want, got)
		}
	}
	if strings.Contains(got, "Copy Of:") {
		t.Errorf("an original is described as a copy:\n%s", got)
	}
	out.Reset()
	describeBackup(&out, copyAt("x", "offsite", "s", "default"), copiesNow)
	if want := "Copy Of:\tdefault (copied 2026-12-06T07:00:00Z, 30m ago)\n"; !strings.Contains(out.String(), want) || strings.Contains(out.String(), "Copies:") {
		t.Errorf("describe of a copy does not say %q:\n%s", want, out.String())
	}
}

// A name held by a backup and its copies is the original, or its first
// copy when the original is not found; other sets stay ambiguous.
func TestOriginalOf(t *testing.T) {
	orig := backupAt("x", "default", "s")
	cp := copyAt("x", "offsite", "s", "default")
	cp2 := copyAt("x", "tape", "s", "default")
	cpOfCp := copyAt("x", "tape", "s", "offsite")
	for _, c := range []struct {
		name string
		bs   []*ebv1.Backup
		want *ebv1.Backup // nil: ambiguous
	}{
		{"one", []*ebv1.Backup{cp}, cp},
		{"original and copy", []*ebv1.Backup{orig, cp}, orig},
		{"copy listed first", []*ebv1.Backup{cp, orig}, orig},
		{"original and two copies", []*ebv1.Backup{orig, cp, cp2}, orig},
		{"copy of a copy", []*ebv1.Backup{orig, cp, cpOfCp}, orig},
		{"copies of a missing original", []*ebv1.Backup{cp, cp2}, cp},
		{"a copy and its copy, the original missing", []*ebv1.Backup{cp, cpOfCp}, cp},
		{"a copy's copy first, the original missing", []*ebv1.Backup{cpOfCp, cp}, cp},
		{"two originals", []*ebv1.Backup{orig, backupAt("x", "s3", "s")}, nil},
		{"other bytes", []*ebv1.Backup{orig, copyAt("x", "offsite", "t", "default")}, nil},
		{"no SHA-256", []*ebv1.Backup{backupAt("x", "default", ""), copyAt("x", "offsite", "", "default")}, nil},
		{"a copy of elsewhere", []*ebv1.Backup{orig, copyAt("x", "offsite", "s", "s3")}, nil},
		{"copies of two missing originals", []*ebv1.Backup{copyAt("x", "offsite", "s", "a"), copyAt("x", "tape", "s", "b")}, nil},
		{"a copy of itself", []*ebv1.Backup{orig, copyAt("x", "offsite", "s", "offsite")}, nil},
	} {
		got, ok := originalOf(c.bs)
		if got != c.want || ok != (c.want != nil) {
			t.Errorf("%s: %v %v, want %v", c.name, got, ok, c.want)
		}
	}
}

// --all-copies deletes a backup where it is the same backup: its
// original and copies, following copyOf and the server's copies.
func TestSameBackup(t *testing.T) {
	orig := backupAt("x", "default", "s")
	orig.Copies = []*ebv1.BackupCopy{copyState("s3", ebv1.BackupCopyState_BACKUP_COPY_STATE_COPIED)}
	cp := copyAt("x", "offsite", "s", "default")
	cpOfCp := copyAt("x", "tape", "s", "offsite")
	byCopies := backupAt("x", "s3", "s") // stored there the same, named by the original's copies
	stranger := backupAt("x", "dr", "s") // the same bytes, unrelated
	otherBytes := copyAt("x", "vault", "t", "default")
	all := []*ebv1.Backup{orig, cp, byCopies, cpOfCp, stranger, otherBytes}
	names := func(bs []*ebv1.Backup) string {
		var s []string
		for _, b := range bs {
			s = append(s, b.GetLocation())
		}
		return strings.Join(s, " ")
	}
	if got := names(sameBackup(orig, all)); got != "default offsite s3 tape" {
		t.Errorf("from the original: %s", got)
	}
	if got := names(sameBackup(cpOfCp, all)); got != "default offsite s3 tape" {
		t.Errorf("from a copy of a copy: %s", got)
	}
	if got := names(sameBackup(stranger, all)); got != "dr" {
		t.Errorf("from an unrelated backup: %s", got)
	}
	if got := keptCopies(orig, all); strings.Join(got, " ") != "s3 offsite tape" {
		t.Errorf("kept: %v", got)
	}
}
