// Command coredns is CoreDNS v1.15.0 (the module's own coremain) with only
// the plugins the test sandbox's Corefile uses linked in, as CoreDNS
// documents for builds with a chosen plugin set. The stock main links all of
// them (the cloud DNS providers' SDKs, tracing exporters, …), which tripled
// a cold build on two cores for code the sandbox never runs.
package main

import (
	"github.com/coredns/coredns/coremain"

	// The plugins of the Corefile in tests/sandbox/dns.go; a directive not
	// linked here fails the Corefile's parse, loudly.
	_ "github.com/coredns/coredns/plugin/cache"
	_ "github.com/coredns/coredns/plugin/errors"
	_ "github.com/coredns/coredns/plugin/health"
	_ "github.com/coredns/coredns/plugin/kubernetes"
	_ "github.com/coredns/coredns/plugin/loadbalance"
	_ "github.com/coredns/coredns/plugin/ready"
)

func main() {
	coremain.Run()
}
