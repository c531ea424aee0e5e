# kube.mk — Makefile fragment (include it from the root Makefile) that builds
# the real Kubernetes binaries the test sandbox runs (tests/sandbox).
#
#   make kube-bins                 # kube-apiserver, kube-controller-manager, kube-scheduler, kubectl, kubelet, kube-proxy v1.37.2 into $(KUBE_BIN_DIR)
#   make kube-replaces             # regenerate tools/kube/go.mod's replace block
#
# hack/build-kube.sh is idempotent and returns at once when up to date, so
# kube-bins is phony and always delegates the up-to-date check to it. The test
# sandbox finds the binaries through ETCDBACKUP_KUBE_BIN_DIR, or in
# <repo>/.cache/kube/bin by default.

KUBE_BIN_DIR ?= $(CURDIR)/.cache/kube/bin

.PHONY: kube-bins kube-replaces
kube-bins:
	hack/build-kube.sh "$(KUBE_BIN_DIR)"

kube-replaces:
	hack/gen-kube-replaces.sh
	cd tools/kube && go mod tidy
