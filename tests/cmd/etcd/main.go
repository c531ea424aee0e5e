// Command etcd is etcd v3.7.3's own server main, built from the module the
// product pins and packed as an image, so the sandbox's node runs etcd
// members as pods for the in-cluster restore tests.
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() {
	etcdmain.Main(os.Args)
}
