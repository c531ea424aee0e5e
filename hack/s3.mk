# s3.mk — Makefile fragment (include it from the root Makefile) that builds the
# real S3-compatible server the storage tests run against (server/storage/s3).
#
#   make s3-bins                   # versitygw v1.8.0 into $(S3_BIN_DIR)
#
# The binary is pinned by the tools module tools/s3 (a `tool` directive for
# github.com/versity/versitygw/cmd/versitygw). It is rebuilt only when the
# stamp file, which records tools/s3/go.mod, go.sum and the Go version, is out
# of date: a cold build takes about 6 minutes on 2 cores, a warm check is
# instant. The tests find the binary through ETCDBACKUP_S3_BIN_DIR, or in
# <repo>/.cache/s3/bin by default (see server/storage/s3/s3test).

S3_BIN_DIR ?= $(CURDIR)/.cache/s3/bin
S3_STAMP_INPUTS = $(shell cd $(CURDIR)/tools/s3 && { sha256sum go.mod go.sum; $(GO) env GOVERSION GOOS GOARCH; } | sha256sum | cut -d' ' -f1)

.PHONY: s3-bins
s3-bins:
	@mkdir -p "$(S3_BIN_DIR)"
	@if [ -x "$(S3_BIN_DIR)/versitygw" ] && [ "$$(cat "$(S3_BIN_DIR)/.versitygw.stamp" 2>/dev/null)" = "$(S3_STAMP_INPUTS)" ]; then \
		echo "s3-bins: versitygw up to date in $(S3_BIN_DIR)" >&2; \
	else \
		echo "s3-bins: building versitygw into $(S3_BIN_DIR) (a cold build takes ~6 min on 2 cores)" >&2; \
		rm -f "$(S3_BIN_DIR)/.versitygw.stamp"; \
		tmp=$$(mktemp -d "$(S3_BIN_DIR)/.build.XXXXXX") && trap 'rm -rf "$$tmp"' EXIT && \
		(cd $(CURDIR)/tools/s3 && CGO_ENABLED=0 GOFLAGS="-mod=readonly -buildvcs=false" \
			$(GO) build -ldflags "-s -w" -o "$$tmp/" github.com/versity/versitygw/cmd/versitygw) && \
		mv -f "$$tmp/versitygw" "$(S3_BIN_DIR)/versitygw" && \
		echo "$(S3_STAMP_INPUTS)" >"$(S3_BIN_DIR)/.versitygw.stamp" && \
		echo "s3-bins: done" >&2; \
	fi
