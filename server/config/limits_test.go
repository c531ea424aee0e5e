package config

import (
	"strings"
	"testing"
	"time"
)

const oneLocation = "locations:\n  - name: default\n    filesystem: {path: /tmp/x}\n"

func TestLimits(t *testing.T) {
	f, err := load(t, oneLocation+"limits:\n  uploadsPerLocation: 2\n  uploadIdleTimeout: 30s\n  maxLabels: 8\n  verifyScratchBytes: 1073741824\n")
	if err != nil {
		t.Fatal(err)
	}
	l := f.Limits.WithDefaults()
	want := Limits{UploadsPerLocation: 2, AgentUploadsPerLocation: 4, MaxLabels: 8, MaxLabelBytes: 16384, MaxFieldBytes: 256, MaxConcurrentStreams: 64,
		MaxRawSize: 16 << 30, MinTransferRate: 64 << 10, VerifyScratchBytes: 1 << 30}
	want.UploadIdleTimeout.Duration = 30 * time.Second
	want.MinTransferRateWindow.Duration = time.Minute
	if l != want {
		t.Errorf("limits %+v; want %+v", l, want)
	}
	d := Limits{}.WithDefaults()
	if d.UploadsPerLocation != 4 || d.UploadIdleTimeout.Duration != 2*time.Minute || d.MaxLabels != 64 || d.VerifyScratchBytes != 18<<30 {
		t.Errorf("defaults %+v", d)
	}
	for _, tc := range []struct{ yaml, want string }{
		{"limits:\n  uploadsPerLocation: -1\n", "limits.uploadsPerLocation: Invalid value: -1: must not be negative"},
		{"limits:\n  uploadIdleTimeout: -5s\n", `limits.uploadIdleTimeout: Invalid value: "-5s": must not be negative`},
		{"limits:\n  agentUploadsPerLocation: -1\n", "limits.agentUploadsPerLocation: Invalid value: -1"},
		{"limits:\n  maxRawSize: -1\n", "limits.maxRawSize: Invalid value: -1"},
		{"limits:\n  minTransferRate: -1\n", "limits.minTransferRate: Invalid value: -1"},
		{"limits:\n  minTransferRateWindow: -1m\n", `limits.minTransferRateWindow: Invalid value: "-1m0s"`},
		{"limits:\n  maxLabelBytes: -1\n", "limits.maxLabelBytes: Invalid value"},
		{"limits:\n  maxConcurrentStreams: -1\n", "limits.maxConcurrentStreams"},
		{"limits:\n  verifyScratchBytes: -1\n", "limits.verifyScratchBytes: Invalid value: -1"},
		{"limits:\n  uploadsInFlight: 3\n", `unknown field "uploadsInFlight"`},
	} {
		if _, err := load(t, oneLocation+tc.yaml); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%q: got %v, want %q", tc.yaml, err, tc.want)
		}
	}
}

func TestAgentResources(t *testing.T) {
	f, err := load(t, oneLocation+"agents:\n  resources:\n    requests: {memory: 1Gi}\n    limits: {memory: 2Gi}\n  scratchSizeLimit: 5Gi\n")
	if err != nil {
		t.Fatal(err)
	}
	a := f.Agents.WithDefaults("ns")
	if m := a.Resources.Requests.Memory(); m.String() != "1Gi" || a.Resources.Requests.Cpu().String() != "0" || a.ScratchSizeLimit.String() != "5Gi" {
		t.Errorf("agents: resources %+v, scratch %v", a.Resources, a.ScratchSizeLimit)
	}
	d := Agents{}.WithDefaults("ns")
	if d.Resources.Requests.Cpu().String() != "100m" || d.Resources.Limits.Memory().String() != "512Mi" || d.ScratchSizeLimit.String() != "20Gi" {
		t.Errorf("defaults: resources %+v, scratch %v", d.Resources, d.ScratchSizeLimit)
	}
	for _, tc := range []struct{ yaml, want string }{
		{"agents:\n  resources:\n    requests: {memory: 1Gi}\n    limits: {memory: 512Mi}\n",
			"agents.resources.requests[memory]: Invalid value: \"1Gi\": must not exceed limits.memory (512Mi)"},
		{"agents:\n  resources:\n    requests: {cpu: -1}\n", "agents.resources.requests[cpu]: Invalid value: \"-1\": must not be negative"},
		{"agents:\n  scratchSizeLimit: 0\n", "agents.scratchSizeLimit: Invalid value: \"0\": must be positive"},
	} {
		if _, err := load(t, oneLocation+tc.yaml); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%q: got %v, want %q", tc.yaml, err, tc.want)
		}
	}
}
