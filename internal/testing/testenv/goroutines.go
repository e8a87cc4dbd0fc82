package testenv

import (
	"runtime"
	"strings"
)

// OurGoroutines is the stack of every goroutine that has a frame in this module's non-test code or
// is a controller's worker: when a manager does not stop within its grace period, it names the
// runnable that is still busy (a test prints it instead of waiting longer).
func OurGoroutines() string {
	buf := make([]byte, 8<<20)
	buf = buf[:runtime.Stack(buf, true)]
	var kept []string
	for _, g := range strings.Split(string(buf), "\n\n") {
		if strings.Contains(g, "testenv.OurGoroutines") {
			continue
		}
		if strings.Contains(g, "quartermaster-dev/quartermaster/internal/") || strings.Contains(g, "controller-runtime/pkg/internal/controller.(*Controller") {
			kept = append(kept, g)
		}
	}
	return strings.Join(kept, "\n\n")
}
