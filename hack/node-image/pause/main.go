// Command pause waits until it is told to stop (SIGTERM or SIGINT) and exits 0. It is the sandbox
// (pause) image of hack/real-cluster.sh's node, and the program of the test images the real-node
// tests pull through a registry mirror: a static binary, so an image of it needs nothing else.
package main

import (
	"os"
	"os/signal"
	"syscall"
)

func main() {
	stop := make(chan os.Signal, 1)
	signal.Notify(stop, syscall.SIGTERM, syscall.SIGINT)
	<-stop
}
