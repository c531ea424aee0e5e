// Package config reads the data server's configuration file — its storage
// locations, its etcd targets and how it launches agents — and builds the
// server's parts from it. Secrets are never in the file: it names files (a
// mounted Secret) or Secret objects that hold them.
//
//	locations:
//	  - name: default
//	    filesystem: {path: /var/lib/etcdbackup}
//	  - name: s3
//	    s3:
//	      bucket: etcd-backups
//	      prefix: prod
//	      endpoint: https://s3.example.internal:7070
//	      pathStyle: true
//	      caBundleFile: /etc/etcdbackup/s3-ca/ca.crt
//	      accessKeyIDFile: /etc/etcdbackup/s3-credentials/access-key-id
//	      secretAccessKeyFile: /etc/etcdbackup/s3-credentials/secret-access-key
//	targets:
//	  - name: control-plane
//	    endpoints: [https://10.0.0.10:2379, https://10.0.0.11:2379]
//	    tlsSecret: etcd-client      # keys ca.crt, tls.crt, tls.key
//	    location: s3
//	    compression: zstd
//	  - name: app-etcd              # etcd in the cluster, restorable in place
//	    endpoints: [https://app-etcd-0.app-etcd.app.svc:2379]
//	    tlsSecret: app-etcd-client
//	    namespace: app              # where the members' PVCs are; restore Jobs run there
//	    initialClusterToken: app-etcd
//	    restoreRunAsUser: 1001      # the uid/gid etcd runs as (default 65532)
//	    restoreRunAsGroup: 1001
//	    members:
//	      - name: app-etcd-0
//	        peerURL: https://app-etcd-0.app-etcd.app.svc:2380
//	        clientURL: https://app-etcd-0.app-etcd.app.svc:2379
//	        dataDir: data           # etcd's --data-dir inside the volume
//	        volume: {persistentVolumeClaim: {claimName: data-app-etcd-0}}
//	      # control-plane etcd: volume: {hostPath: {path: /var/lib}}, dataDir: etcd,
//	      # nodeName: cp-1, and restoreRunAsUser: 0 on the target
//	agents:
//	  image: ghcr.io/kubectl-etcdbackup/etcdbackup-agent:v0.1.0
//	  serviceAccount: etcdbackup-agent
package config

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"time"

	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/yaml"

	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/server"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/server/jobs"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/server/storage/filesystem"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/server/storage/s3"
)

// File is the configuration file.
type File struct {
	// Locations in order; the first is the default.
	Locations []Location `json:"locations"`
	Targets   []Target   `json:"targets,omitempty"`
	Agents    Agents     `json:"agents,omitempty"`
}

// Location is one storage location: exactly one of the backends.
type Location struct {
	Name       string      `json:"name"`
	Filesystem *Filesystem `json:"filesystem,omitempty"`
	S3         *S3         `json:"s3,omitempty"`
}

// Filesystem is a directory (a mounted PersistentVolumeClaim).
type Filesystem struct {
	Path string `json:"path"`
}

// S3 is a bucket of an S3-compatible store.
type S3 struct {
	Bucket              string `json:"bucket"`
	Prefix              string `json:"prefix,omitempty"`
	Region              string `json:"region,omitempty"`
	Endpoint            string `json:"endpoint,omitempty"`
	PathStyle           bool   `json:"pathStyle,omitempty"`
	CABundleFile        string `json:"caBundleFile,omitempty"`
	InsecureSkipVerify  bool   `json:"insecureSkipVerify,omitempty"`
	AccessKeyIDFile     string `json:"accessKeyIDFile,omitempty"`
	SecretAccessKeyFile string `json:"secretAccessKeyFile,omitempty"`
	SessionTokenFile    string `json:"sessionTokenFile,omitempty"`
	AccessKeyIDEnv      string `json:"accessKeyIDEnv,omitempty"`
	SecretAccessKeyEnv  string `json:"secretAccessKeyEnv,omitempty"`
	SessionTokenEnv     string `json:"sessionTokenEnv,omitempty"`
	// DefaultCredentialChain uses the SDK's chain (env, ~/.aws, IRSA, roles).
	DefaultCredentialChain bool   `json:"defaultCredentialChain,omitempty"`
	PartSizeMiB            int64  `json:"partSizeMiB,omitempty"`
	Concurrency            int    `json:"concurrency,omitempty"`
	RequestChecksum        string `json:"requestChecksum,omitempty"`
	NoConditionalWrites    bool   `json:"noConditionalWrites,omitempty"`
}

// Target is an etcd cluster to back up.
type Target struct {
	Name      string   `json:"name"`
	Endpoints []string `json:"endpoints"`
	// TLSSecret is a Secret in the server's namespace with ca.crt, tls.crt
	// and tls.key.
	TLSSecret         string `json:"tlsSecret,omitempty"`
	InsecurePlaintext bool   `json:"insecurePlaintext,omitempty"`
	Location          string `json:"location,omitempty"`
	Compression       string `json:"compression,omitempty"`
	// InitialClusterToken, Namespace and Members describe the cluster for
	// an in-cluster restore (`restore --target`).
	InitialClusterToken string   `json:"initialClusterToken,omitempty"`
	Namespace           string   `json:"namespace,omitempty"`
	Members             []Member `json:"members,omitempty"`
	RestoreRunAsUser    *int64   `json:"restoreRunAsUser,omitempty"`
	RestoreRunAsGroup   *int64   `json:"restoreRunAsGroup,omitempty"`
}

// Member is one etcd member of a target and where its data lives.
type Member struct {
	Name      string `json:"name"`
	PeerURL   string `json:"peerURL"`
	ClientURL string `json:"clientURL,omitempty"`
	// DataDir is the member's --data-dir relative to the volume's root.
	DataDir  string       `json:"dataDir,omitempty"`
	Volume   MemberVolume `json:"volume"`
	NodeName string       `json:"nodeName,omitempty"`
}

// MemberVolume is exactly one of a PersistentVolumeClaim (in the target's
// namespace) or a host path on the member's node.
type MemberVolume struct {
	PersistentVolumeClaim *ClaimRef    `json:"persistentVolumeClaim,omitempty"`
	HostPath              *HostPathRef `json:"hostPath,omitempty"`
}

// ClaimRef names a PersistentVolumeClaim.
type ClaimRef struct {
	ClaimName string `json:"claimName"`
}

// HostPathRef is a directory on a node.
type HostPathRef struct {
	Path string `json:"path"`
}

// Agents says how agent Jobs are launched.
type Agents struct {
	Image           string `json:"image,omitempty"`
	ImagePullPolicy string `json:"imagePullPolicy,omitempty"`
	ServiceAccount  string `json:"serviceAccount,omitempty"`
	// ServerAddress is how agents reach the server; default
	// etcdbackup.NAMESPACE.svc:50051.
	ServerAddress    string   `json:"serverAddress,omitempty"`
	TTLAfterFinished Duration `json:"ttlAfterFinished,omitempty"`
	Deadline         Duration `json:"deadline,omitempty"`
}

// Duration is a time.Duration written as "90s" or "2h".
type Duration struct{ time.Duration }

// UnmarshalJSON implements json.Unmarshaler.
func (d *Duration) UnmarshalJSON(b []byte) error {
	var s string
	if err := yaml.Unmarshal(b, &s); err != nil {
		return err
	}
	v, err := time.ParseDuration(s)
	if err != nil {
		return fmt.Errorf("duration %q: %w", s, err)
	}
	d.Duration = v
	return nil
}

// Load reads and checks a configuration file. Unknown fields are errors:
// a misspelled key must not silently change where backups go.
func Load(path string) (*File, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("read config: %w", err)
	}
	var f File
	if err := yaml.UnmarshalStrict(b, &f); err != nil {
		return nil, fmt.Errorf("config %s: %w", path, err)
	}
	if len(f.Locations) == 0 {
		return nil, fmt.Errorf("config %s: no storage locations; add at least one under `locations:`", path)
	}
	for i, l := range f.Locations {
		n := 0
		if l.Filesystem != nil {
			n++
		}
		if l.S3 != nil {
			n++
		}
		if n != 1 {
			return nil, fmt.Errorf("config %s: location %d (%q) must have exactly one of filesystem, s3", path, i, l.Name)
		}
	}
	for _, t := range f.Targets {
		for i, m := range t.Members {
			v := m.Volume
			switch {
			case (v.PersistentVolumeClaim == nil) == (v.HostPath == nil):
				return nil, fmt.Errorf("config %s: target %q member %d (%q): volume must have exactly one of persistentVolumeClaim, hostPath", path, t.Name, i, m.Name)
			case v.PersistentVolumeClaim != nil && v.PersistentVolumeClaim.ClaimName == "":
				return nil, fmt.Errorf("config %s: target %q member %d (%q): persistentVolumeClaim needs a claimName", path, t.Name, i, m.Name)
			case v.HostPath != nil && (v.HostPath.Path == "" || m.NodeName == ""):
				return nil, fmt.Errorf("config %s: target %q member %d (%q): a hostPath volume needs a path and the member's nodeName", path, t.Name, i, m.Name)
			case v.PersistentVolumeClaim != nil && m.NodeName != "":
				return nil, fmt.Errorf("config %s: target %q member %d (%q): nodeName goes with hostPath volumes only", path, t.Name, i, m.Name)
			}
		}
	}
	return &f, nil
}

// Build opens the locations of f.
func (f *File) Build(ctx context.Context, log *slog.Logger) ([]server.NamedLocation, error) {
	var out []server.NamedLocation
	for _, l := range f.Locations {
		switch {
		case l.Filesystem != nil:
			loc, err := filesystem.New(l.Filesystem.Path)
			if err != nil {
				return nil, fmt.Errorf("location %q: %w", l.Name, err)
			}
			out = append(out, server.NamedLocation{Name: l.Name, Location: loc})
		case l.S3 != nil:
			c := l.S3
			loc, err := s3.New(ctx, s3.Config{
				Bucket: c.Bucket, Prefix: c.Prefix, Region: c.Region, Endpoint: c.Endpoint, PathStyle: c.PathStyle,
				CABundleFile: c.CABundleFile, InsecureSkipVerify: c.InsecureSkipVerify,
				AccessKeyIDFile: c.AccessKeyIDFile, SecretAccessKeyFile: c.SecretAccessKeyFile, SessionTokenFile: c.SessionTokenFile,
				AccessKeyIDEnv: c.AccessKeyIDEnv, SecretAccessKeyEnv: c.SecretAccessKeyEnv, SessionTokenEnv: c.SessionTokenEnv,
				DefaultCredentialChain: c.DefaultCredentialChain,
				PartSize:               c.PartSizeMiB << 20, Concurrency: c.Concurrency, RequestChecksum: c.RequestChecksum,
				NoConditionalWrites: c.NoConditionalWrites,
				Logger:              log.With("location", l.Name),
			})
			if err != nil {
				return nil, fmt.Errorf("location %q: %w", l.Name, err)
			}
			out = append(out, server.NamedLocation{Name: l.Name, Location: loc})
		}
	}
	return out, nil
}

// ServerTargets converts the targets for server.Config.
func (f *File) ServerTargets() []server.Target {
	var out []server.Target
	for _, t := range f.Targets {
		var members []jobs.Member
		for _, m := range t.Members {
			jm := jobs.Member{Name: m.Name, PeerURL: m.PeerURL, ClientURL: m.ClientURL, DataDir: m.DataDir, NodeName: m.NodeName}
			if c := m.Volume.PersistentVolumeClaim; c != nil {
				jm.ClaimName = c.ClaimName
			}
			if h := m.Volume.HostPath; h != nil {
				jm.HostPath = h.Path
			}
			members = append(members, jm)
		}
		out = append(out, server.Target{
			Target: jobs.Target{
				Name: t.Name, Endpoints: t.Endpoints, TLSSecret: t.TLSSecret, InsecurePlaintext: t.InsecurePlaintext,
				InitialClusterToken: t.InitialClusterToken, Namespace: t.Namespace, Members: members,
				RestoreRunAsUser: t.RestoreRunAsUser, RestoreRunAsGroup: t.RestoreRunAsGroup,
			},
			Location:    t.Location,
			Compression: t.Compression,
		})
	}
	return out
}

// JobsConfig converts the agents section for jobs.New; namespace is the
// server's own.
func (f *File) JobsConfig(namespace string) jobs.Config {
	a := f.Agents
	addr := a.ServerAddress
	if addr == "" {
		addr = "etcdbackup." + namespace + ".svc:50051"
	}
	return jobs.Config{
		Namespace: namespace, Image: a.Image, ImagePullPolicy: corev1.PullPolicy(a.ImagePullPolicy),
		ServiceAccount: a.ServiceAccount, ServerAddress: addr,
		TTLAfterFinished: a.TTLAfterFinished.Duration, Deadline: a.Deadline.Duration,
	}
}
