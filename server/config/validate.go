package config

import (
	"fmt"
	"maps"
	"net/url"
	"path"
	"slices"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/sets"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/apimachinery/pkg/util/validation/field"

	ebv1 "github.com/kubectl-etcdbackup/kubectl-etcdbackup/api/etcdbackup/v1"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/crypt"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/kit"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/server/schedule"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/storage"
)

var pullPolicies = []corev1.PullPolicy{"", corev1.PullAlways, corev1.PullIfNotPresent, corev1.PullNever}

// Validate checks f and returns every problem, each naming the field's
// path (targets[0].members[1].volume).
func Validate(f *File) field.ErrorList {
	var errs field.ErrorList
	locs := field.NewPath("locations")
	errs = append(errs, storage.ValidateLocations(f.Locations, locs)...)
	errs = append(errs, validateReplicas(f.Replicas, f.Locations, field.NewPath("replicas"), locs)...)
	names := make([]string, 0, len(f.Locations))
	for _, l := range f.Locations {
		names = append(names, l.Name)
	}
	errs = append(errs, ValidateTargets(f.Targets, names, field.NewPath("targets"))...)
	for i, t := range f.Targets {
		loc := t.Location
		if loc == "" && len(names) > 0 {
			loc = names[0]
		}
		copies := storage.CopiesOf(f.Locations, loc)
		for _, name := range slices.Sorted(maps.Keys(t.CopyRetention)) {
			if slices.Contains(names, name) && !slices.Contains(copies, name) {
				errs = append(errs, field.Invalid(field.NewPath("targets").Index(i).Child("copyRetention").Key(name), name,
					fmt.Sprintf("is not a copy location of the target's location %q (its copies: %v): name one of them, or add {to: %s} to that location's copies", loc, copies, name)))
			}
		}
	}
	errs = append(errs, validateAgents(f.Agents, field.NewPath("agents"))...)
	errs = append(errs, ValidateLimits(f.Limits, field.NewPath("limits"))...)
	if m := f.Authorization.Mode; m != "" && m != AuthorizationPortForward && m != AuthorizationSubjectAccessReview {
		errs = append(errs, field.NotSupported(field.NewPath("authorization", "mode"), m, []string{AuthorizationPortForward, AuthorizationSubjectAccessReview}))
	}
	return errs
}

// validateReplicas refuses more than one server replica with a
// filesystem location that is not on a volume they all share.
func validateReplicas(replicas int, locations []storage.LocationConfig, p, locs *field.Path) field.ErrorList {
	if replicas < 0 {
		return field.ErrorList{field.Invalid(p, replicas, "must not be negative (0 or unset is 1)")}
	}
	if replicas <= 1 {
		return nil
	}
	var errs field.ErrorList
	for i, l := range locations {
		if l.Filesystem == nil || l.Filesystem.SharedVolume {
			continue
		}
		errs = append(errs, field.Invalid(locs.Index(i).Child("filesystem", "sharedVolume"), false, fmt.Sprintf(
			"replicas is %d, but this location is not marked as shared: a ReadWriteOnce volume mounts on one node only, "+
				"so a replica on another node never starts, and upload names are claimed in each server's memory, which the other "+
				"replicas do not see; use an s3 location, or a ReadWriteMany volume that every replica mounts with sharedVolume: true "+
				"(or replicas: 1)", replicas)))
	}
	return errs
}

// ValidateTargets checks the targets at fldPath; locations are the names
// of the configured storage locations, which a target may name.
func ValidateTargets(targets []Target, locations []string, fldPath *field.Path) field.ErrorList {
	var errs field.ErrorList
	seen := sets.New[string]()
	known := sets.New(locations...)
	for i, t := range targets {
		p := fldPath.Index(i)
		errs = append(errs, validateName(t.Name, p.Child("name"))...)
		if t.Name != "" && seen.Has(t.Name) {
			errs = append(errs, field.Duplicate(p.Child("name"), t.Name))
		}
		seen.Insert(t.Name)
		if len(t.Endpoints) == 0 {
			errs = append(errs, field.Required(p.Child("endpoints"), "the etcd client URLs to back up from"))
		}
		if t.TLSSecret != "" {
			errs = append(errs, validateDNS(t.TLSSecret, p.Child("tlsSecret"), validation.IsDNS1123Subdomain)...)
		}
		if t.Location != "" && !known.Has(t.Location) {
			errs = append(errs, field.NotFound(p.Child("location"), t.Location))
		}
		if !sets.New(ebv1.Compressions...).Has(ebv1.CompressionFromName(t.Compression)) {
			errs = append(errs, field.NotSupported(p.Child("compression"), t.Compression, []string{ebv1.CompressionNoneName, ebv1.CompressionZstd}))
		}
		if t.Encryption != nil {
			errs = append(errs, validateEncryption(*t.Encryption, p.Child("encryption"))...)
		}
		if t.Namespace != "" {
			errs = append(errs, validateDNS(t.Namespace, p.Child("namespace"), validation.IsDNS1123Label)...)
		}
		errs = append(errs, validateID(t.RestoreRunAsUser, p.Child("restoreRunAsUser"))...)
		errs = append(errs, validateID(t.RestoreRunAsGroup, p.Child("restoreRunAsGroup"))...)
		errs = append(errs, validateMembers(t.Members, p.Child("members"))...)
		errs = append(errs, validateSchedule(t, locations, p)...)
		errs = append(errs, validateDrill(t.Drill, p.Child("drill"))...)
		errs = append(errs, validateDeltas(t.Deltas, len(t.AgeRecipients()) > 0, p.Child("deltas"))...)
		if t.Kit != nil {
			errs = append(errs, validateKit(*t.Kit, p.Child("kit"))...)
			if len(t.Members) > 0 && t.Members[0].Volume.HostPath == nil {
				errs = append(errs, field.Invalid(p.Child("kit"), field.OmitValueType{},
					"a recovery kit holds a control-plane node's files; this target's members keep their data in PersistentVolumeClaims, so it runs in pods a kit cannot rebuild: remove kit"))
			}
		}
	}
	return errs
}

// validateDeltas checks a target's delta capture.
func validateDeltas(d *Deltas, encrypted bool, p *field.Path) field.ErrorList {
	if d == nil {
		return nil
	}
	var errs field.ErrorList
	if v := d.PeriodOrDefault(); v < time.Second || v > 10*time.Minute {
		errs = append(errs, field.Invalid(p.Child("period"), v.String(), "must be between 1s and 10m"))
	}
	if v := d.MaxBytesOrDefault(); v < 64<<10 || v > 64<<20 {
		errs = append(errs, field.Invalid(p.Child("maxBytes"), v, "must be between 65536 (64 KiB) and 67108864 (64 MiB)"))
	}
	switch v := d.CompactAfterRevisions; {
	case v < 0 || v > 0 && v < MinCompactAfterRevisions:
		errs = append(errs, field.Invalid(p.Child("compactAfterRevisions"), v,
			fmt.Sprintf("must be 0 (never fold chains) or at least %d", MinCompactAfterRevisions)))
	case v > 0 && encrypted && d.IdentitySecret == "":
		errs = append(errs, field.Required(p.Child("identitySecret"),
			"the target encrypts its backups: a fold Job needs an age identity to decrypt the chain (a Secret in the server's namespace holding an identity file)"))
	}
	if d.IdentitySecret != "" {
		errs = append(errs, validateDNS(d.IdentitySecret, p.Child("identitySecret"), validation.IsDNS1123Subdomain)...)
	}
	return errs
}

// validateDrill checks a target's drill schedule.
func validateDrill(d *Drill, p *field.Path) field.ErrorList {
	if d == nil {
		return nil
	}
	var errs field.ErrorList
	if d.Schedule == "" {
		errs = append(errs, field.Required(p.Child("schedule"), "when to drill the target's newest backup, e.g. \"@daily\""))
	} else if _, err := schedule.Parse(d.Schedule, d.TimeZone); err != nil {
		errs = append(errs, field.Invalid(p.Child("schedule"), d.Schedule, err.Error()))
	}
	if d.IdentitySecret != "" {
		errs = append(errs, validateDNS(d.IdentitySecret, p.Child("identitySecret"), validation.IsDNS1123Subdomain)...)
	}
	if v := d.VerifiedWithin; v != nil && v.Duration <= 0 {
		errs = append(errs, field.Invalid(p.Child("verifiedWithin"), v.Duration.String(), "must be positive"))
	}
	return errs
}

// validateSchedule checks a target's schedule, time zone and retention.
func validateSchedule(t Target, locations []string, p *field.Path) field.ErrorList {
	var errs field.ErrorList
	if t.Schedule != "" {
		if _, err := schedule.Parse(t.Schedule, ""); err != nil {
			errs = append(errs, field.Invalid(p.Child("schedule"), t.Schedule, err.Error()))
		}
		// Backup names are at most 200 characters (rpc.MaxNameLength).
		if n := len(schedule.Name(t.Name, time.Time{})); n > 200 {
			errs = append(errs, field.TooLong(p.Child("name"), t.Name, 200-(n-len(t.Name))))
		}
	} else {
		if t.TimeZone != "" && (t.Retention == nil || !t.Retention.Calendar()) {
			errs = append(errs, field.Invalid(p.Child("timeZone"), t.TimeZone, "needs a schedule, or a retention that counts hours, days, weeks, months or years"))
		}
		if t.StartingDeadline != nil {
			errs = append(errs, field.Invalid(p.Child("startingDeadline"), t.StartingDeadline.Duration.String(), "needs a schedule"))
		}
	}
	if t.TimeZone != "" {
		if _, err := schedule.Parse("@daily", t.TimeZone); err != nil {
			errs = append(errs, field.Invalid(p.Child("timeZone"), t.TimeZone, err.Error()))
		}
	}
	if d := t.StartingDeadline; d != nil && d.Duration <= 0 {
		errs = append(errs, field.Invalid(p.Child("startingDeadline"), d.Duration.String(), "must be positive"))
	}
	if r := t.Retention; r != nil {
		errs = append(errs, validateRetention(*r, p.Child("retention"))...)
	}
	for _, name := range slices.Sorted(maps.Keys(t.CopyRetention)) {
		cp := p.Child("copyRetention").Key(name)
		if !slices.Contains(locations, name) {
			errs = append(errs, field.NotFound(cp, name))
			continue
		}
		errs = append(errs, validateRetention(t.CopyRetention[name], cp)...)
	}
	return errs
}

// validateRetention checks retention rules at rp.
func validateRetention(r Retention, rp *field.Path) field.ErrorList {
	var errs field.ErrorList
	{
		for _, c := range []struct {
			name string
			n    int
		}{{"keepLast", r.KeepLast}, {"keepHourly", r.KeepHourly}, {"keepDaily", r.KeepDaily}, {"keepWeekly", r.KeepWeekly}, {"keepMonthly", r.KeepMonthly}, {"keepYearly", r.KeepYearly}} {
			if c.n < 0 {
				errs = append(errs, field.Invalid(rp.Child(c.name), c.n, "must not be negative"))
			}
		}
		if r.MaxAge.Duration < 0 {
			errs = append(errs, field.Invalid(rp.Child("maxAge"), r.MaxAge.Duration.String(), "must not be negative"))
		}
		if !r.Counts() && r.MaxAge.Duration <= 0 {
			errs = append(errs, field.Required(rp, "at least one of keepLast, keepHourly, keepDaily, keepWeekly, keepMonthly, keepYearly or maxAge"))
		}
	}
	return errs
}

// validateMembers checks the restore layout of a target.
func validateMembers(members []Member, fldPath *field.Path) field.ErrorList {
	var errs field.ErrorList
	seen := sets.New[string]()
	for i, m := range members {
		p := fldPath.Index(i)
		switch {
		case m.Name == "":
			errs = append(errs, field.Required(p.Child("name"), "the member's etcd --name"))
		case seen.Has(m.Name):
			errs = append(errs, field.Duplicate(p.Child("name"), m.Name))
		}
		seen.Insert(m.Name)
		errs = append(errs, validateURL(m.PeerURL, p.Child("peerURL"))...)
		if m.ClientURL != "" {
			errs = append(errs, validateURL(m.ClientURL, p.Child("clientURL"))...)
		}
		if d := m.DataDir; d != "" && (path.IsAbs(d) || path.Clean(d) != d || d == ".." || strings.HasPrefix(d, "../")) {
			errs = append(errs, field.Invalid(p.Child("dataDir"), d, "must be a clean path relative to the volume's root"))
		}
		v, vp := m.Volume, p.Child("volume")
		switch {
		case (v.PersistentVolumeClaim == nil) == (v.HostPath == nil):
			errs = append(errs, field.Invalid(vp, field.OmitValueType{}, "must have exactly one of persistentVolumeClaim, hostPath"))
		case v.PersistentVolumeClaim != nil:
			if v.PersistentVolumeClaim.ClaimName == "" {
				errs = append(errs, field.Required(vp.Child("persistentVolumeClaim", "claimName"), ""))
			}
			if m.NodeName != "" {
				errs = append(errs, field.Forbidden(p.Child("nodeName"), "goes with hostPath volumes only"))
			}
		case v.HostPath != nil:
			if !path.IsAbs(v.HostPath.Path) {
				errs = append(errs, field.Invalid(vp.Child("hostPath", "path"), v.HostPath.Path, "must be an absolute path"))
			}
			if m.NodeName == "" {
				errs = append(errs, field.Required(p.Child("nodeName"), "a hostPath volume needs the member's node"))
			}
		}
		// One target's restore Jobs share a namespace: a claim's, or
		// agents.restoreNamespace for hostPath volumes.
		if i > 0 && (v.HostPath != nil) != (members[0].Volume.HostPath != nil) && (v.PersistentVolumeClaim == nil) != (v.HostPath == nil) {
			errs = append(errs, field.Invalid(vp, field.OmitValueType{}, "every member of a target uses persistentVolumeClaim, or every member hostPath: their restore Jobs run in one namespace"))
		}
	}
	return errs
}

// validateEncryption checks a target's age recipients: public keys that
// age parses and can use together. A secret key put there by mistake is
// never repeated in the error.
func validateEncryption(e Encryption, p *field.Path) field.ErrorList {
	return validateRecipients(e.AgeRecipients, p.Child("ageRecipients"),
		"the age public keys (age1...) backups are encrypted to; remove encryption to store backups unencrypted")
}

// validateKit checks a target's recovery kit: the node it is read on,
// directories that can be mounted, and recipients, which it cannot go
// without (it holds the cluster's CA key).
func validateKit(k Kit, p *field.Path) field.ErrorList {
	var errs field.ErrorList
	if k.NodeName == "" {
		errs = append(errs, field.Required(p.Child("nodeName"), "the control-plane node whose files the kit holds: the backup agent runs there to read them"))
	} else {
		errs = append(errs, validateDNS(k.NodeName, p.Child("nodeName"), validation.IsDNS1123Subdomain)...)
	}
	for i, d := range k.Paths {
		if err := kit.CheckPaths([]string{d}); err != nil {
			errs = append(errs, field.Invalid(p.Child("paths").Index(i), d, err.Error()))
		}
	}
	return append(errs, validateRecipients(k.AgeRecipients, p.Child("ageRecipients"),
		"the age public keys (age1...) the kit is encrypted to: it holds the cluster's CA and encryption keys, which are never stored unencrypted; keep one identity offline, away from the cluster")...)
}

// validateRecipients checks age public keys; required says what they
// are for when none is given.
func validateRecipients(keys []string, rp *field.Path, required string) field.ErrorList {
	if len(keys) == 0 {
		return field.ErrorList{field.Required(rp, required)}
	}
	if len(keys) > ebv1.MaxAgeRecipients {
		return field.ErrorList{field.TooMany(rp, len(keys), ebv1.MaxAgeRecipients)}
	}
	var errs field.ErrorList
	for i, r := range keys {
		if _, err := crypt.ParseRecipient(r); err != nil {
			errs = append(errs, field.Invalid(rp.Index(i), field.OmitValueType{}, err.Error()))
		}
	}
	if len(errs) == 0 {
		if _, err := crypt.ParseRecipients(keys); err != nil {
			errs = append(errs, field.Invalid(rp, field.OmitValueType{}, err.Error()))
		}
	}
	return errs
}

func validateAgents(a Agents, p *field.Path) field.ErrorList {
	var errs field.ErrorList
	if !sets.New(pullPolicies...).Has(a.ImagePullPolicy) {
		errs = append(errs, field.NotSupported(p.Child("imagePullPolicy"), a.ImagePullPolicy, pullPolicies[1:]))
	}
	if a.ServiceAccount != "" {
		errs = append(errs, validateDNS(a.ServiceAccount, p.Child("serviceAccount"), validation.IsDNS1123Subdomain)...)
	}
	if a.TTLAfterFinished.Duration < 0 {
		errs = append(errs, field.Invalid(p.Child("ttlAfterFinished"), a.TTLAfterFinished.Duration.String(), "must not be negative"))
	}
	if a.Deadline.Duration < 0 {
		errs = append(errs, field.Invalid(p.Child("deadline"), a.Deadline.Duration.String(), "must not be negative"))
	}
	if a.RestoreNamespace != "" {
		errs = append(errs, validateDNS(a.RestoreNamespace, p.Child("restoreNamespace"), validation.IsDNS1123Label)...)
	}
	if r := a.Resources; r != nil {
		errs = append(errs, validateResources(*r, p.Child("resources"))...)
	}
	if q := a.ScratchSizeLimit; q != nil && q.Sign() <= 0 {
		errs = append(errs, field.Invalid(p.Child("scratchSizeLimit"), q.String(), "must be positive"))
	}
	return errs
}

// validateResources checks what the API server would refuse at Job
// creation, so the mistake shows at start instead of at the first backup.
func validateResources(r corev1.ResourceRequirements, p *field.Path) field.ErrorList {
	var errs field.ErrorList
	for _, list := range []struct {
		name string
		l    corev1.ResourceList
	}{{"requests", r.Requests}, {"limits", r.Limits}} {
		for _, name := range sortedResourceNames(list.l) {
			if q := list.l[name]; q.Sign() < 0 {
				errs = append(errs, field.Invalid(p.Child(list.name).Key(string(name)), q.String(), "must not be negative"))
			}
		}
	}
	for _, name := range sortedResourceNames(r.Requests) {
		req := r.Requests[name]
		if lim, ok := r.Limits[name]; ok && req.Cmp(lim) > 0 {
			errs = append(errs, field.Invalid(p.Child("requests").Key(string(name)), req.String(), "must not exceed limits."+string(name)+" ("+lim.String()+")"))
		}
	}
	return errs
}

func sortedResourceNames(l corev1.ResourceList) []corev1.ResourceName {
	names := make([]corev1.ResourceName, 0, len(l))
	for n := range l {
		names = append(names, n)
	}
	slices.Sort(names)
	return names
}

// ValidateLimits checks the limits section: no negative limits (zero
// takes the default).
func ValidateLimits(l Limits, p *field.Path) field.ErrorList {
	var errs field.ErrorList
	for _, f := range []struct {
		key string
		v   int64
	}{
		{"uploadsPerLocation", int64(l.UploadsPerLocation)},
		{"agentUploadsPerLocation", int64(l.AgentUploadsPerLocation)},
		{"uploadIdleTimeout", int64(l.UploadIdleTimeout.Duration)},
		{"maxRawSize", l.MaxRawSize},
		{"minTransferRate", l.MinTransferRate},
		{"minTransferRateWindow", int64(l.MinTransferRateWindow.Duration)},
		{"maxLabels", int64(l.MaxLabels)},
		{"maxLabelBytes", int64(l.MaxLabelBytes)},
		{"maxFieldBytes", int64(l.MaxFieldBytes)},
		{"verifyScratchBytes", l.VerifyScratchBytes},
	} {
		if f.v < 0 {
			v := any(f.v)
			switch f.key {
			case "uploadIdleTimeout":
				v = l.UploadIdleTimeout.Duration.String()
			case "minTransferRateWindow":
				v = l.MinTransferRateWindow.Duration.String()
			}
			errs = append(errs, field.Invalid(p.Child(f.key), v, "must not be negative (0 or unset takes the default)"))
		}
	}
	return errs
}

// validateName checks the name of a target: clients address it by that
// name, as they do a location.
func validateName(name string, p *field.Path) field.ErrorList {
	return storage.ValidateName(name, p)
}

func validateDNS(v string, p *field.Path, check func(string) []string) field.ErrorList {
	var errs field.ErrorList
	for _, msg := range check(v) {
		errs = append(errs, field.Invalid(p, v, msg))
	}
	return errs
}

func validateURL(s string, p *field.Path) field.ErrorList {
	if s == "" {
		return field.ErrorList{field.Required(p, "an http:// or https:// URL")}
	}
	u, err := url.Parse(s)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return field.ErrorList{field.Invalid(p, s, "must be an http:// or https:// URL")}
	}
	return nil
}

func validateID(id *int64, p *field.Path) field.ErrorList {
	if id != nil && *id < 0 {
		return field.ErrorList{field.Invalid(p, *id, "must not be negative")}
	}
	return nil
}
