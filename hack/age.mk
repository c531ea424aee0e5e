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
.PHONY: age-bins
age-bins:
	$(call build-tool,age,$(CURDIR)/tools/age,$(AGE_BIN_DIR),filippo.io/age/cmd/age filippo.io/age/cmd/age-keygen,-s -w)
