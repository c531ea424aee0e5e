# age.mk — Makefile fragment (include it from the root Makefile) that builds
# the independent age command-line tool the encryption tests decrypt
# backups with, so a backup is proven readable without this project's code.
#
#   make age-bins                  # age and age-keygen v1.3.2 into $(AGE_BIN_DIR)
#
# The binaries are pinned by the tools module tools/age (`tool` directives
# for filippo.io/age/cmd/age and cmd/age-keygen). They are rebuilt only when
# the stamp, which records tools/age/go.mod, go.sum and the Go version, is
# out of date (a cold build takes seconds). The tests find them through
# ETCDBACKUP_AGE_BIN_DIR, or in <repo>/.cache/age/bin by default (see
# internal/agetest).

AGE_BIN_DIR ?= $(CURDIR)/.cache/age/bin
AGE_STAMP_INPUTS = $(shell cd $(CURDIR)/tools/age && { sha256sum go.mod go.sum; $(GO) env GOVERSION GOOS GOARCH; } | sha256sum | cut -d' ' -f1)

.PHONY: age-bins
age-bins:
	@mkdir -p "$(AGE_BIN_DIR)"
	@if [ -x "$(AGE_BIN_DIR)/age" ] && [ -x "$(AGE_BIN_DIR)/age-keygen" ] && [ "$$(cat "$(AGE_BIN_DIR)/.age.stamp" 2>/dev/null)" = "$(AGE_STAMP_INPUTS)" ]; then \
		echo "age-bins: age up to date in $(AGE_BIN_DIR)" >&2; \
	else \
		echo "age-bins: building age and age-keygen into $(AGE_BIN_DIR)" >&2; \
		rm -f "$(AGE_BIN_DIR)/.age.stamp"; \
		tmp=$$(mktemp -d "$(AGE_BIN_DIR)/.build.XXXXXX") && trap 'rm -rf "$$tmp"' EXIT && \
		(cd $(CURDIR)/tools/age && CGO_ENABLED=0 GOFLAGS="-mod=readonly -buildvcs=false" \
			$(GO) build -ldflags "-s -w" -o "$$tmp/" filippo.io/age/cmd/age filippo.io/age/cmd/age-keygen) && \
		mv -f "$$tmp/age" "$$tmp/age-keygen" "$(AGE_BIN_DIR)/" && \
		echo "$(AGE_STAMP_INPUTS)" >"$(AGE_BIN_DIR)/.age.stamp" && \
		echo "age-bins: done" >&2; \
	fi
