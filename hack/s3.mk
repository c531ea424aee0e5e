# s3.mk — Makefile fragment (include it from the root Makefile) that builds the
# real S3-compatible server the storage tests run against (storage/s3).
#
#   make s3-bins                   # versitygw v1.8.0 into $(S3_BIN_DIR)
#
# The binary is pinned by the tools module tools/s3 (a `tool` directive for
# github.com/versity/versitygw/cmd/versitygw). It is rebuilt only when the
# stamp file, which records tools/s3/go.mod, go.sum and the Go version, is out
# of date: a cold build takes about 6 minutes on 2 cores, a warm check is
# instant. The tests find the binary through ETCDBACKUP_S3_BIN_DIR, or in
# <repo>/.cache/s3/bin by default (see storage/s3/s3test).

S3_BIN_DIR ?= $(CURDIR)/.cache/s3/bin
.PHONY: s3-bins
s3-bins:
	$(call build-tool,versitygw,$(CURDIR)/tools/s3,$(S3_BIN_DIR),github.com/versity/versitygw/cmd/versitygw,-s -w)
