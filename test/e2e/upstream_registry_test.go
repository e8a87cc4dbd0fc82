//go:build e2e

package e2e

import (
	"testing"

	"github.com/quartermaster-dev/quartermaster/internal/testing/upstreamregistry"
)

// startPrivateRegistry is a registry in the test process, on loopback, that needs credentials: the
// upstream of a mirror.
func startPrivateRegistry(t *testing.T, user, pass string) *upstreamregistry.Server {
	t.Helper()
	return upstreamregistry.Serve(t, "127.0.0.1", user, pass)
}
