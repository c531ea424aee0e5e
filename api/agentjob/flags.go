package agentjob

import (
	"slices"
	"strconv"
	"strings"
	"time"
)

// The agent's flags that a Job sets: the server writes them (Args), the
// agent's commands bind the same names to the same fields, and
// cmd/etcdbackup-agent's tests parse every kind's Job back.
const (
	FlagServer    = "server"
	FlagTokenFile = "token-file"
	FlagServerCA  = "server-ca"

	FlagName        = "name"
	FlagLocation    = "location"
	FlagTarget      = "target"
	FlagLabels      = "labels"
	FlagSHA256      = "sha256"
	FlagScratchDir  = "scratch-dir"
	FlagIdentityDir = "identity-dir"

	FlagEndpoints         = "endpoints"
	FlagCACert            = "cacert"
	FlagCert              = "cert"
	FlagKey               = "key"
	FlagInsecurePlaintext = "insecure-plaintext"
	FlagCompression       = "compression"
	FlagEncryptTo         = "encrypt-to"

	FlagDataDir                  = "data-dir"
	FlagWorkDir                  = "work-dir"
	FlagMemberName               = "member-name"
	FlagInitialCluster           = "initial-cluster"
	FlagInitialAdvertisePeerURLs = "initial-advertise-peer-urls"
	FlagInitialClusterToken      = "initial-cluster-token"
	FlagMoveAside                = "move-aside"
	FlagBumpRevision             = "bump-revision"
	FlagToRevision               = "to-revision"
	FlagToTime                   = "to-time"
	FlagToMinRevision            = "to-min-revision"
	FlagSegmentsFile             = "segments-file"
	FlagSegmentsSHA256           = "segments-sha256"
	FlagAllowLeaseLoss           = "allow-lease-loss"

	FlagChain    = "chain"
	FlagPeriod   = "period"
	FlagMaxBytes = "max-bytes"

	FlagInputsFile = "inputs-file"

	FlagPath        = "path"
	FlagHostRoot    = "host-root"
	FlagNode        = "node"
	FlagKubeVersion = "kube-version"
)

// Flags are one kind's flags, as a Job passes them to its agent.
type Flags interface {
	Kind() Kind
	// Args are the agent container's arguments: the kind's subcommand,
	// then its flags, each as --NAME=VALUE.
	Args() []string
}

// Conn is how every agent reaches the server's agent port.
type Conn struct {
	// Server is the agent port's address.
	Server string
	// TokenFile holds the pod's projected ServiceAccount token for the
	// server; ServerCA the CA certificate the port's certificate must
	// chain to.
	TokenFile, ServerCA string
}

// Etcd is how an agent that reads a target's etcd reaches it: its
// members and the client certificate files a Secret mounts.
type Etcd struct {
	Endpoints         []string
	CACert, Cert, Key string
	InsecurePlaintext bool
}

// BackupFlags are a backup agent's: snapshot Target's etcd into backup
// Name of Location.
type BackupFlags struct {
	Conn
	Name, Location, Target string
	// Labels are the backup's.
	Labels map[string]string
	// ScratchDir holds a copy of the plain snapshot while it streams.
	ScratchDir string
	Etcd
	// Compression and EncryptTo encode what is stored.
	Compression string
	EncryptTo   []string
}

// RestoreFlags are a restore agent's: rebuild one member's data
// directory from backup Name of Location, pinned to SHA256.
type RestoreFlags struct {
	Conn
	Name, Location string
	DataDir        string
	WorkDir        string
	// The member being rebuilt, and the cluster it is one of.
	MemberName, InitialCluster string
	InitialAdvertisePeerURLs   []string
	SHA256                     string
	BumpRevision               int64
	InitialClusterToken        string
	MoveAside                  bool
	IdentityDir                string
	// A restore to a point: ToRevision, or ToTime (RFC 3339) with
	// ToMinRevision; the delta segments to replay listed in SegmentsFile,
	// whose SHA-256 is SegmentsSHA256.
	ToRevision                   int64
	ToTime                       string
	ToMinRevision                int64
	SegmentsFile, SegmentsSHA256 string
	AllowLeaseLoss               bool
}

// DrillFlags are a drill agent's: restore backup Name of Location,
// pinned to SHA256, in ScratchDir and compare it with its record.
type DrillFlags struct {
	Conn
	Name, Location, SHA256 string
	ScratchDir             string
	IdentityDir            string
}

// DeltaFlags are a delta agent's: store Target's revisions after backup
// Chain as its delta segments.
type DeltaFlags struct {
	Conn
	Target, Chain, Location string
	// Period and MaxBytes say when a segment is cut.
	Period   time.Duration
	MaxBytes int64
	Etcd
	Compression string
	EncryptTo   []string
}

// FoldFlags are a fold agent's: replay the chain of InputsFile into a new
// full backup Name of Target in Location.
type FoldFlags struct {
	Conn
	Target, Name, Location string
	InputsFile, ScratchDir string
	Compression            string
	EncryptTo              []string
	IdentityDir            string
}

func (BackupFlags) Kind() Kind  { return Backup }
func (RestoreFlags) Kind() Kind { return Restore }
func (DrillFlags) Kind() Kind   { return Drill }
func (DeltaFlags) Kind() Kind   { return Delta }
func (FoldFlags) Kind() Kind    { return Fold }
func (KitFlags) Kind() Kind     { return Kit }

// Args implements Flags.
func (f BackupFlags) Args() []string {
	a := args{string(Backup)}
	a.set(FlagServer, f.Server)
	a.set(FlagName, f.Name)
	a.set(FlagLocation, f.Location)
	a.set(FlagTarget, f.Target)
	a.pairs(FlagLabels, f.Labels)
	a.opt(FlagScratchDir, f.ScratchDir)
	a.etcd(f.Etcd, f.Compression, f.EncryptTo)
	return a.conn(f.Conn)
}

// Args implements Flags.
func (f RestoreFlags) Args() []string {
	a := args{string(Restore)}
	a.set(FlagServer, f.Server)
	a.set(FlagName, f.Name)
	a.set(FlagLocation, f.Location)
	a.set(FlagDataDir, f.DataDir)
	a.set(FlagWorkDir, f.WorkDir)
	a.set(FlagMemberName, f.MemberName)
	a.set(FlagInitialCluster, f.InitialCluster)
	a.set(FlagInitialAdvertisePeerURLs, strings.Join(f.InitialAdvertisePeerURLs, ","))
	a.set(FlagSHA256, f.SHA256)
	a.set(FlagBumpRevision, strconv.FormatInt(f.BumpRevision, 10))
	a.opt(FlagInitialClusterToken, f.InitialClusterToken)
	a.flag(FlagMoveAside, f.MoveAside)
	a.opt(FlagIdentityDir, f.IdentityDir)
	a.optInt(FlagToRevision, f.ToRevision)
	a.opt(FlagToTime, f.ToTime)
	a.optInt(FlagToMinRevision, f.ToMinRevision)
	a.opt(FlagSegmentsFile, f.SegmentsFile)
	a.opt(FlagSegmentsSHA256, f.SegmentsSHA256)
	a.flag(FlagAllowLeaseLoss, f.AllowLeaseLoss)
	return a.conn(f.Conn)
}

// Args implements Flags.
func (f DrillFlags) Args() []string {
	a := args{string(Drill)}
	a.set(FlagServer, f.Server)
	a.set(FlagName, f.Name)
	a.set(FlagLocation, f.Location)
	a.set(FlagSHA256, f.SHA256)
	a.set(FlagScratchDir, f.ScratchDir)
	a.opt(FlagIdentityDir, f.IdentityDir)
	return a.conn(f.Conn)
}

// Args implements Flags.
func (f DeltaFlags) Args() []string {
	a := args{string(Delta)}
	a.set(FlagServer, f.Server)
	a.set(FlagTarget, f.Target)
	a.set(FlagChain, f.Chain)
	a.set(FlagLocation, f.Location)
	a.set(FlagPeriod, f.Period.String())
	a.set(FlagMaxBytes, strconv.FormatInt(f.MaxBytes, 10))
	a.etcd(f.Etcd, f.Compression, f.EncryptTo)
	return a.conn(f.Conn)
}

// Args implements Flags.
func (f FoldFlags) Args() []string {
	a := args{string(Fold)}
	a.set(FlagServer, f.Server)
	a.set(FlagTarget, f.Target)
	a.set(FlagName, f.Name)
	a.set(FlagLocation, f.Location)
	a.set(FlagInputsFile, f.InputsFile)
	a.set(FlagScratchDir, f.ScratchDir)
	a.opt(FlagCompression, f.Compression)
	a.each(FlagEncryptTo, f.EncryptTo)
	a.opt(FlagIdentityDir, f.IdentityDir)
	return a.conn(f.Conn)
}

// KitFlags are a kit agent's: read the host directories Paths (seen
// under HostRoot in its pod) on Node into backup Name's recovery kit,
// sealed to EncryptTo, once the backup is stored in Location;
// KubeVersion is the API server's, as the server read it.
type KitFlags struct {
	Conn
	Name, Location, Target string
	Paths                  []string
	HostRoot               string
	EncryptTo              []string
	Node                   string
	KubeVersion            string
}

// Args implements Flags.
func (f KitFlags) Args() []string {
	a := args{string(Kit)}
	a.set(FlagServer, f.Server)
	a.set(FlagName, f.Name)
	a.set(FlagLocation, f.Location)
	a.set(FlagTarget, f.Target)
	a.each(FlagPath, f.Paths)
	a.set(FlagHostRoot, f.HostRoot)
	a.each(FlagEncryptTo, f.EncryptTo)
	a.set(FlagNode, f.Node)
	a.opt(FlagKubeVersion, f.KubeVersion)
	return a.conn(f.Conn)
}

// args builds a container's arguments, each flag as --NAME=VALUE (one
// argument: a value starting with a dash stays a value).
type args []string

// set writes a flag whatever its value.
func (a *args) set(name, value string) { *a = append(*a, "--"+name+"="+value) }

// opt writes a flag unless its value is empty (the agent's default).
func (a *args) opt(name, value string) {
	if value != "" {
		a.set(name, value)
	}
}

// optInt writes an integer flag unless it is 0 (the agent's default).
func (a *args) optInt(name string, value int64) {
	if value != 0 {
		a.set(name, strconv.FormatInt(value, 10))
	}
}

// flag writes a boolean flag, bare, when it is true.
func (a *args) flag(name string, on bool) {
	if on {
		*a = append(*a, "--"+name)
	}
}

// each writes a repeatable flag once per value.
func (a *args) each(name string, values []string) {
	for _, v := range values {
		a.set(name, v)
	}
}

// pairs writes a KEY=VALUE flag once per key, in key order.
func (a *args) pairs(name string, m map[string]string) {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	for _, k := range keys {
		a.set(name, k+"="+m[k])
	}
}

// etcd writes how an agent reaches etcd and encodes what it stores.
func (a *args) etcd(e Etcd, compression string, encryptTo []string) {
	a.set(FlagEndpoints, strings.Join(e.Endpoints, ","))
	a.opt(FlagCompression, compression)
	a.each(FlagEncryptTo, encryptTo)
	a.opt(FlagCACert, e.CACert)
	a.opt(FlagCert, e.Cert)
	a.opt(FlagKey, e.Key)
	a.flag(FlagInsecurePlaintext, e.InsecurePlaintext)
}

// conn ends the arguments with how the agent reaches the server.
func (a *args) conn(c Conn) []string {
	a.opt(FlagTokenFile, c.TokenFile)
	a.opt(FlagServerCA, c.ServerCA)
	return *a
}
