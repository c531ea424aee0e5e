# node.mk — Makefile fragment (include it from the root Makefile after
# kube.mk) that builds what the test sandbox's real node runs besides
# containerd and runc: kubelet and kube-proxy (with the other Kubernetes
# binaries, hack/build-kube.sh), the CNI plugins, CoreDNS,
# kube-network-policies, and the OCI image archives of the pause and CoreDNS
# images, all for this machine's platform.
#
#   make node-bins       # everything below, plus kube-bins
#   make cni-bins        # bridge, host-local, loopback, portmap v1.10.0 into $(CNI_BIN_DIR)
#   make coredns-bin     # coredns v1.15.0 into $(NODE_BIN_DIR)
#   make netpol-bin      # kube-network-policies v0.8.0 (patched) into $(NODE_BIN_DIR)
#   make node-images     # $(NODE_IMAGE_DIR)/pause.tar and coredns.tar
#
# Binaries are pinned by the tools modules tools/cni, tools/coredns and
# tools/netpol and rebuilt only when a stamp file, which records the module's
# go.mod, go.sum, the Go version and the build flags, is out of date: a cold
# CoreDNS build (only the plugins the sandbox's Corefile uses,
# tools/coredns/cmd/coredns) takes about 2 minutes on 2 cores, the CNI plugins seconds, a
# warm check is instant. Flags never vary, so the Go build cache is reused. The image
# archives are plain file targets: rebuilt when their binary or the image tool
# changes, with the same digest for the same binary.
#
# The image tool, $(IMAGES_TOOL), is hack/images; `make images` (root
# Makefile) uses it for the product's images.

# `make images`: where the product's image names point, and for which
# platforms (IMAGE_PLATFORMS=linux/amd64 alone is quickest for a local node).
IMAGE_REPO ?= ghcr.io/kubectl-etcdbackup
IMAGE_PLATFORMS ?= linux/amd64,linux/arm64

NODE_DIR ?= $(CURDIR)/.cache/node
NODE_BIN_DIR := $(NODE_DIR)/bin
CNI_BIN_DIR := $(NODE_DIR)/cni/bin
NODE_IMAGE_DIR := $(NODE_DIR)/images
PAUSE_IMAGE ?= etcdbackup.test/pause:v1
COREDNS_IMAGE ?= etcdbackup.test/coredns:v1.15.0
IMAGES_TOOL := $(CURDIR)/.cache/bin/etcdbackup-images
HOST_PLATFORM = $(shell $(GO) env GOOS)/$(shell $(GO) env GOARCH)

CNI_PLUGINS := github.com/containernetworking/plugins/plugins/main/bridge \
	github.com/containernetworking/plugins/plugins/ipam/host-local \
	github.com/containernetworking/plugins/plugins/main/loopback \
	github.com/containernetworking/plugins/plugins/meta/portmap


.PHONY: images node-bins cni-bins coredns-bin netpol-bin node-images
node-bins: kube-bins cni-bins coredns-bin netpol-bin node-images

cni-bins:
	$(call build-tool,cni-plugins,$(CURDIR)/tools/cni,$(CNI_BIN_DIR),$(CNI_PLUGINS),-s -w -X github.com/containernetworking/plugins/pkg/utils/buildversion.BuildVersion=v1.10.0)

coredns-bin:
	$(call build-tool,coredns,$(CURDIR)/tools/coredns,$(NODE_BIN_DIR),github.com/kubectl-etcdbackup/kubectl-etcdbackup/tools/coredns/cmd/coredns,-s -w)

# The NetworkPolicy enforcer (sandbox.Config.NetworkPolicy); the sandbox
# runs it on the node as a host process, as kube-proxy runs. Built by its own
# script, with the same kind of stamp, because it carries a patch: see
# hack/build-netpol.sh. A cold build takes about 3 minutes.
netpol-bin:
	GO=$(GO) hack/build-netpol.sh $(NODE_BIN_DIR)

node-images: $(NODE_IMAGE_DIR)/pause.tar $(NODE_IMAGE_DIR)/coredns.tar

$(IMAGES_TOOL): go.mod go.sum $(filter-out %_test.go,$(wildcard hack/images/*.go internal/ociimage/*.go))
	$(GO) build -o $@ ./hack/images

$(NODE_BIN_DIR)/pause: go.mod $(wildcard tests/cmd/pause/*.go)
	@mkdir -p $(NODE_BIN_DIR)
	CGO_ENABLED=0 GOFLAGS=-buildvcs=false $(GO) build -trimpath -ldflags "-s -w" -o $@ ./tests/cmd/pause

# User 65532: the kubelet runs the pause container as the pod's user anyway.
$(NODE_IMAGE_DIR)/pause.tar: $(NODE_BIN_DIR)/pause $(IMAGES_TOOL)
	$(IMAGES_TOOL) pack -ref $(PAUSE_IMAGE) -entrypoint /pause -bin $(HOST_PLATFORM)=$< -out $@ \
		-label org.opencontainers.image.title=pause

# The stamp, not the binary, is the prerequisite: coredns-bin is phony and the
# binary's mtime changes only when it is rebuilt.
$(NODE_BIN_DIR)/.coredns.stamp: coredns-bin
	@:

# Runs as 65532: the Corefile must listen on an unprivileged port (or the pod
# set net.ipv4.ip_unprivileged_port_start), since the layer carries no file
# capabilities.
$(NODE_IMAGE_DIR)/coredns.tar: $(NODE_BIN_DIR)/.coredns.stamp $(IMAGES_TOOL)
	$(IMAGES_TOOL) pack -ref $(COREDNS_IMAGE) -entrypoint /coredns -bin $(HOST_PLATFORM)=$(NODE_BIN_DIR)/coredns -out $@ \
		-label org.opencontainers.image.title=coredns -label org.opencontainers.image.version=v1.15.0 \
		-label org.opencontainers.image.source=https://github.com/coredns/coredns -label org.opencontainers.image.licenses=Apache-2.0
