// Tools module: builds CoreDNS for the test sandbox's node (the cluster DNS
// behind the kube-dns Service), pinned here so the product's own go.mod
// never depends on it. Built by hack/node.mk.
module github.com/kubectl-etcdbackup/kubectl-etcdbackup/tools/coredns

go 1.26.0
