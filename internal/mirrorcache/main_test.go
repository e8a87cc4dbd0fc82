package mirrorcache

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"syscall"
	"testing"
)

// envChildCache makes the test binary run a cache as its own process (the configuration file
// named; the rest from distribution's REGISTRY_* variables), so a test can kill it.
const envChildCache = "QM_TEST_CHILD_CACHE_CONFIG"

// TestMain makes the test binary the cache's credential helper, as the quartermaster binary is in
// a pod: a cache runs os.Executable(), here this binary, with "get".
func TestMain(m *testing.M) {
	if HelperRequested(os.Args[1:]) {
		if err := CredentialHelper(os.Stdin, os.Stdout); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	if config := os.Getenv(envChildCache); config != "" {
		ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM)
		err := Run(ctx, Options{ConfigPath: config, CredentialsDir: os.TempDir()})
		stop()
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	os.Exit(m.Run())
}
