package plugin

import (
	"context"
	"errors"
	"fmt"
	"os/exec"
	"path"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"time"

	etcdversion "go.etcd.io/etcd/api/v3/version"
	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/yaml"

	ebv1 "github.com/kubectl-etcdbackup/kubectl-etcdbackup/api/etcdbackup/v1"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/kit"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/member"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/snapshot"
)

// RebuildOptions are restore --rebuild's own: a lost control-plane node
// brought back from a backup and its recovery kit.
type RebuildOptions struct {
	Rebuild bool
	// Root is where the node's "/" is (default "/"): the kit's files and
	// etcd's data directory are written under it.
	Root string
	// ManifestsDir is the kubelet's static-pod directory, as the node
	// names it: its files are written last, once etcd's data is back.
	ManifestsDir string
	// Kubelet is the kubelet binary whose version is checked against the
	// kit's ("" looks for kubelet in $PATH).
	Kubelet string
	// IgnoreVersionSkew rebuilds even when the node's versions differ.
	IgnoreVersionSkew bool
}

func (r *RebuildOptions) addFlags(f interface {
	BoolVar(*bool, string, bool, string)
	StringVar(*string, string, string, string)
}) {
	f.BoolVar(&r.Rebuild, "rebuild", false, "with --local: bring back a lost control-plane node from the backup and its recovery kit: the kit's files (PKI, encryption configuration, kubeconfigs), etcd's member from the backup, then the static-pod manifests; needs --identity")
	f.StringVar(&r.Root, "root", "/", "with --rebuild: the node's root directory, under which every file is written")
	f.StringVar(&r.ManifestsDir, "manifests-dir", "/etc/kubernetes/manifests", "with --rebuild: the kubelet's static-pod directory, written last")
	f.StringVar(&r.Kubelet, "kubelet", "", "with --rebuild: the node's kubelet binary, whose version must be the kit's (default: kubelet in $PATH)")
	f.BoolVar(&r.IgnoreVersionSkew, "ignore-version-skew", false, "with --rebuild: rebuild even when the node's kubelet or this plugin's etcd differs from the kit's versions")
}

// validateRebuild checks the flags of a rebuild.
func (o *RestoreOptions) validateRebuild() error {
	switch {
	case !o.Local:
		return errors.New("--rebuild goes with --local: it rebuilds the node it runs on")
	case o.FromFile != "":
		return errors.New("--rebuild reads the backup and its recovery kit from the store (through the server, or with --storage-config when the API server is down); drop --from-file")
	case o.toPoint():
		return errors.New("--rebuild restores a backup with its own kit: name the backup and drop --to-revision/--to-time")
	case o.Name == "":
		return errors.New("--rebuild needs the backup's NAME: its kit is stored beside it")
	case !o.Rebuild.Rebuild:
		return errors.New("--root goes with --rebuild")
	case !path.IsAbs(o.Rebuild.ManifestsDir):
		return fmt.Errorf("--manifests-dir %q is not an absolute path on the node", o.Rebuild.ManifestsDir)
	}
	return nil
}

// staticMember is what the kit's etcd manifest says of its member.
type staticMember struct {
	snapshot.Member
	// HostDataDir is the data directory on the node: the manifest's
	// --data-dir through the hostPath volume that holds it.
	HostDataDir string
}

// staticPod reads a static pod's manifest as kubeadm writes it: the Pod,
// its container called container (else its first), and that container's
// --NAME=VALUE flags by name.
func staticPod(manifest []byte, container string) (*corev1.Pod, *corev1.Container, map[string]string, error) {
	var pod corev1.Pod
	if err := yaml.Unmarshal(manifest, &pod); err != nil {
		return nil, nil, nil, fmt.Errorf("not a Pod: %w", err)
	}
	var c *corev1.Container
	for i := range pod.Spec.Containers {
		if pod.Spec.Containers[i].Name == container || c == nil {
			c = &pod.Spec.Containers[i]
		}
	}
	if c == nil {
		return nil, nil, nil, errors.New("no container")
	}
	flags := map[string]string{}
	for _, a := range append(append([]string{}, c.Command...), c.Args...) {
		if k, v, ok := strings.Cut(strings.TrimPrefix(a, "--"), "="); ok && strings.HasPrefix(a, "--") {
			flags[k] = v
		}
	}
	return &pod, c, flags, nil
}

// etcdMember reads the member a static etcd pod runs, from its manifest:
// kubeadm's flags, the data directory mapped through its hostPath volume.
func etcdMember(manifest []byte) (staticMember, error) {
	pod, c, flags, err := staticPod(manifest, "etcd")
	if err != nil {
		return staticMember{}, err
	}
	m := staticMember{Member: snapshot.Member{
		Name: flags["name"], InitialCluster: flags["initial-cluster"], InitialClusterToken: flags["initial-cluster-token"],
		DataDir: flags["data-dir"],
	}}
	if u := flags["initial-advertise-peer-urls"]; u != "" {
		m.InitialAdvertisePeerURLs = strings.Split(u, ",")
	}
	// The data directory in the container, through the mount that holds
	// it, to the host path of that mount's volume.
	best := ""
	for _, vm := range c.VolumeMounts {
		if (m.DataDir == vm.MountPath || strings.HasPrefix(m.DataDir, strings.TrimSuffix(vm.MountPath, "/")+"/")) && len(vm.MountPath) > len(best) {
			for _, v := range pod.Spec.Volumes {
				if v.Name == vm.Name && v.HostPath != nil {
					best = vm.MountPath
					m.HostDataDir = path.Join(v.HostPath.Path, strings.TrimPrefix(m.DataDir, vm.MountPath))
				}
			}
		}
	}
	if m.DataDir == "" || m.HostDataDir == "" {
		return m, fmt.Errorf("its --data-dir %q is not on a hostPath volume", m.DataDir)
	}
	return m, nil
}

// minor is a version's "MAJOR.MINOR", "" when it has none.
var minorRE = regexp.MustCompile(`v?(\d+)\.(\d+)`)

func minor(v string) string {
	m := minorRE.FindStringSubmatch(v)
	if m == nil {
		return ""
	}
	return m[1] + "." + m[2]
}

// checkVersions refuses a node whose kubelet, or a plugin whose etcd
// restore code, is not of the versions the kit was taken with: the
// static pods it writes would run images the node's kubelet may not
// support, or etcd would find data written for another version.
func (o *RestoreOptions) checkVersions(ctx context.Context, v kit.Versions) []string {
	var skew []string
	if want, have := minor(v.Etcd), minor(etcdversion.Version); want != "" && want != have {
		skew = append(skew, fmt.Sprintf("the backup was taken from etcd %s and this plugin restores with etcd %s's code: restore with a kubectl-etcdbackup built with etcd %s, or with etcdutl %s (docs/disaster-recovery.md)", v.Etcd, etcdversion.Version, want, want))
	}
	want := minor(v.Kubernetes)
	if want == "" {
		return append(skew, "the kit records no Kubernetes version, so the node's kubelet cannot be checked against it")
	}
	bin := o.Rebuild.Kubelet
	if bin == "" {
		var err error
		if bin, err = exec.LookPath("kubelet"); err != nil {
			return append(skew, fmt.Sprintf("no kubelet on this node ($PATH): install kubelet %s, which starts the rebuilt static pods, or pass --kubelet PATH", v.Kubernetes))
		}
	}
	out, err := exec.CommandContext(ctx, bin, "--version").Output()
	if err != nil {
		return append(skew, fmt.Sprintf("%s --version: %v: install kubelet %s, which starts the rebuilt static pods", bin, err, v.Kubernetes))
	}
	if have := strings.TrimSpace(strings.TrimPrefix(strings.TrimSpace(string(out)), "Kubernetes")); minor(have) != want {
		skew = append(skew, fmt.Sprintf("the kit was taken with Kubernetes %s but this node's kubelet is %s: install kubelet (and kubeadm, kubectl) %s.x first", v.Kubernetes, have, want))
	}
	return skew
}

// rebuild brings back a lost control-plane node: the backup's recovery
// kit opened here, checked, its files put back (what is there moved
// aside), etcd's member rebuilt from the backup with the revision bump,
// and the static-pod manifests written last, so that the kubelet starts
// the control plane on restored data.
func (o *RestoreOptions) rebuild(ctx context.Context) error {
	ids, err := loadIdentities(o.IdentityFiles)
	if err != nil {
		return err
	}
	conn, err := o.Connect(ctx)
	if err != nil {
		return err
	}
	defer conn.Close()
	if o.Location, err = o.resolveLocation(ctx, conn, "restore "+quote(o.Name), o.Name); err != nil {
		return err
	}
	got, err := conn.Backups.GetBackup(ctx, &ebv1.GetBackupRequest{Name: o.Name, Location: o.Location})
	if err != nil {
		return conn.explain("restore "+quote(o.Name), err)
	}
	b := got.GetBackup()
	contents, err := fetchKit(ctx, conn, b, ids)
	if err != nil {
		return err
	}
	fmt.Fprintf(o.ErrOut, "recovery kit of %q opened: %d entries collected on %s (etcd %s, Kubernetes %s), every file as collected\n",
		o.Name, len(contents.Index.Files), orNone(contents.Index.Node), orNone(contents.Index.Versions.Etcd), orNone(contents.Index.Versions.Kubernetes))
	if skew := o.checkVersions(ctx, contents.Index.Versions); len(skew) > 0 {
		msg := "version skew: " + strings.Join(skew, "; ")
		if !o.Rebuild.IgnoreVersionSkew {
			return withCode(ExitRefused, fmt.Errorf("restore %q --rebuild refused, nothing was changed: %s (or pass --ignore-version-skew)", o.Name, msg))
		}
		fmt.Fprintf(o.ErrOut, "warning: %s; going on (--ignore-version-skew)\n", msg)
	}
	m, err := o.rebuildMember(contents)
	if err != nil {
		return err
	}
	steps, err := contents.Plan(o.Rebuild.Root, time.Now())
	if err != nil {
		return withCode(ExitRefused, fmt.Errorf("restore %q --rebuild refused, nothing was changed: %w", o.Name, err))
	}
	var files, manifests []kit.Step
	for _, s := range steps {
		if s.Path == o.Rebuild.ManifestsDir || strings.HasPrefix(s.Path, o.Rebuild.ManifestsDir+"/") {
			manifests = append(manifests, s)
		} else {
			files = append(files, s)
		}
	}
	if o.DryRun {
		o.printSteps("would write", files)
		fmt.Fprintf(o.Out, "would restore backup %q into %s for etcd member %q of cluster %s (peer URLs %s), moving what is there aside; %s\n",
			o.Name, m.DataDir, m.Name, m.InitialCluster, strings.Join(m.InitialAdvertisePeerURLs, ","), bumpSummary(m.RevisionBump()))
		o.printSteps("would write, last", manifests)
		return nil
	}
	if err := snapshot.CheckDataDir(m); err != nil {
		return withCode(ExitRefused, fmt.Errorf("restore %q --rebuild refused, nothing was changed: %w", o.Name, err))
	}
	if err := contents.Install(files); err != nil {
		o.failedAfter()
		return fmt.Errorf("rebuild: the kit's files: %w (files written so far stay; what was there is beside them, hidden, named .NAME.before-rebuild-*)", err)
	}
	o.printSteps("wrote", files)
	o.Member = m
	o.Member.BumpRevision = &o.BumpRevision
	o.rebuilding = true
	o.Location = b.GetLocation()
	// Everything so far (the kit fetched, opened, checked and written)
	// is the kit's part of the recovery time; etcd's member is next.
	o.endStep("kit")
	if err := o.restoreLocal(ctx, conn, member.DefaultWorkDir(m.DataDir, o.Name)); err != nil {
		return fmt.Errorf("rebuild: %w (the kit's files are in place; the static-pod manifests were not written, so nothing starts; run the same command again)", err)
	}
	if err := contents.Install(manifests); err != nil {
		o.failedAfter()
		return fmt.Errorf("rebuild: the static-pod manifests: %w", err)
	}
	o.printSteps("wrote, last", manifests)
	follow := "`crictl ps`"
	for p := range contents.Data {
		if path.Base(p) == "admin.conf" {
			follow += fmt.Sprintf(" and `kubectl --kubeconfig %s get nodes`", filepath.Join(o.Rebuild.Root, p))
			break
		}
	}
	took := o.restoredIn()
	fmt.Fprintf(o.Out, "node rebuilt from %q in %s: the kubelet starts etcd and the control plane from %s; follow it with %s\n",
		o.Name, roundElapsed(o.lastEnd().Sub(o.start)), filepath.Join(o.Rebuild.Root, o.Rebuild.ManifestsDir), follow)
	fmt.Fprintln(o.Out, "the backup and its kit hold every key of this cluster: rotate what docs/disaster-recovery.md names once the cluster is back")
	fmt.Fprintln(o.Out, took)
	return nil
}

// rebuildMember is the member to rebuild: the kit's etcd manifest's, each
// of --member-name, --initial-cluster, --initial-advertise-peer-urls,
// --initial-cluster-token and --data-dir given overriding it.
func (o *RestoreOptions) rebuildMember(c *kit.Contents) (snapshot.Member, error) {
	manifest := path.Join(o.Rebuild.ManifestsDir, "etcd.yaml")
	m := staticMember{}
	if b, ok := c.Data[manifest]; ok {
		var err error
		if m, err = etcdMember(b); err != nil {
			return snapshot.Member{}, withCode(ExitRefused, fmt.Errorf("the kit's %s: %w; give --data-dir, --member-name, --initial-cluster and --initial-advertise-peer-urls", manifest, err))
		}
	}
	m.Member.DataDir = m.HostDataDir
	flags := o.Member
	if flags.Name != "" {
		m.Name = flags.Name
	}
	if flags.InitialCluster != "" {
		m.InitialCluster = flags.InitialCluster
	}
	if len(flags.InitialAdvertisePeerURLs) > 0 {
		m.InitialAdvertisePeerURLs = flags.InitialAdvertisePeerURLs
	}
	if flags.InitialClusterToken != "" {
		m.InitialClusterToken = flags.InitialClusterToken
	}
	if flags.DataDir != "" {
		m.Member.DataDir = flags.DataDir
	}
	if m.Member.DataDir != "" {
		m.Member.DataDir = filepath.Join(o.Rebuild.Root, m.Member.DataDir)
	}
	m.Member.MoveAside = true
	m.Member.BumpRevision = &o.BumpRevision
	if err := m.Member.Validate(); err != nil {
		if _, ok := c.Data[manifest]; !ok {
			var found []string
			for p := range c.Data {
				if path.Base(p) == "etcd.yaml" && path.Base(path.Dir(p)) == "manifests" {
					found = append(found, path.Dir(p))
				}
			}
			hint := ""
			if len(found) > 0 {
				slices.Sort(found)
				hint = fmt.Sprintf(" (it holds etcd.yaml in %s: pass that as --manifests-dir)", strings.Join(found, ", "))
			}
			return snapshot.Member{}, withCode(ExitRefused, fmt.Errorf("restore %q --rebuild refused, nothing was changed: the kit holds no %s%s; or give --data-dir, --member-name, --initial-cluster and --initial-advertise-peer-urls", o.Name, manifest, hint))
		}
		return snapshot.Member{}, withCode(ExitRefused, fmt.Errorf("restore %q --rebuild refused, nothing was changed: %w (from the kit's %s); give the missing ones with --data-dir, --member-name, --initial-cluster, --initial-advertise-peer-urls", o.Name, err, manifest))
	}
	return m.Member, nil
}

// printSteps says what a rebuild writes, one line per entry.
func (o *RestoreOptions) printSteps(verb string, steps []kit.Step) {
	for _, s := range steps {
		line := fmt.Sprintf("%s %s (%s", verb, s.Target, s.Mode)
		if s.Mode.IsRegular() {
			line += fmt.Sprintf(", %d bytes", s.Size)
		}
		if s.Link != "" {
			line += " -> " + s.Link
		}
		line += ")"
		if s.Aside != "" {
			line += ", moving what is there to " + s.Aside
		}
		fmt.Fprintln(o.Out, line)
	}
}
