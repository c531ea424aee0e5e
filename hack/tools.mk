# tools.mk — Makefile fragment (include it from the root Makefile before the
# others) with the one recipe every pinned tool binary is built with.
#
# $(call build-tool,NAME,MODULE_DIR,OUT_DIR,PACKAGES,LDFLAGS): build PACKAGES
# of the tools module MODULE_DIR into OUT_DIR unless its stamp is current.
# Go writes into a temp dir first, so an interrupted build never leaves a
# half-written binary that looks usable.
define build-tool
@mkdir -p "$(3)"; \
	inputs=$$(cd "$(2)" && { sha256sum go.mod go.sum; $(GO) env GOVERSION GOOS GOARCH; echo '$(4) $(5)'; } | sha256sum | cut -d' ' -f1); \
	current=1; for b in $(notdir $(4)); do [ -x "$(3)/$$b" ] || current=0; done; \
	if [ $$current = 1 ] && [ "$$(cat "$(3)/.$(1).stamp" 2>/dev/null)" = "$$inputs" ]; then \
		echo "$(1): up to date in $(3)" >&2; \
	else \
		echo "$(1): building into $(3)" >&2; start=$$(date +%s); \
		rm -f "$(3)/.$(1).stamp"; \
		tmp=$$(mktemp -d "$(3)/.build.XXXXXX") && trap 'rm -rf "$$tmp"' EXIT && \
		(cd "$(2)" && CGO_ENABLED=0 GOFLAGS="-mod=readonly -buildvcs=false" \
			$(GO) build -ldflags "$(5)" -o "$$tmp/" $(4)) && \
		mv -f "$$tmp"/* "$(3)/" && \
		echo "$$inputs" >"$(3)/.$(1).stamp" && \
		echo "$(1): done in $$(( $$(date +%s) - start ))s" >&2; \
	fi
endef
